// Name lookups: getaddrinfo blocks and cannot be cancelled, and Asio's
// resolver runs every lookup of an io_context one after another on a single
// thread (a slow one delays all others, and its answer arrives after any
// deadline). So each pool runs its own lookup on a detached thread; the
// connections that need an address wait for it until their connect
// deadline, and join the one in progress rather than start another (all
// ask for the same name). An answer that comes after they gave up is
// dropped. The thread reaches the loop only through a lookup_channel that
// abort() closes, so it never touches an io_context that may be gone.

#include "http/pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "core/http_token.hpp"
#include "http/failure_description.hpp"
#include "http/name_lookup.hpp"
#include "http/tls_context.hpp"

namespace outboxd::http {

namespace net = boost::asio;

namespace {

// Defence in depth against header injection: the caller validates headers,
// but a CR/LF in a value would let an event row rewrite our request framing.
// Returns an error (without the value) or an empty string.
std::string check_headers(const header_list& headers) {
    for (std::size_t i = 0; i < headers.size(); ++i) {
        auto const& [name, value] = headers[i];
        if (!is_http_token(name)) {
            return fmt::format("refusing to send extra header #{}: invalid header name", i + 1);
        }
        for (char ch : value) {
            auto const c = static_cast<unsigned char>(ch);
            if ((c < 0x20 && c != '\t') || c == 0x7f) {
                return fmt::format("refusing to send header '{}': value contains a control character", name);
            }
        }
    }
    return {};
}

}  // namespace

pool::pool(net::io_context& ioc, endpoint_url endpoint, client_options options)
    : ioc_(ioc), config_(make_client_config(std::move(endpoint), std::move(options))) {
    if (config_.endpoint.is_tls()) {
        configure_tls(tls_context_.emplace(net::ssl::context::tls_client), config_.options.tls);
    }
    idle_.reserve(config_.options.max_connections);
    busy_.reserve(config_.options.max_connections);
}

pool::~pool() {
    std::lock_guard const lock(channel_->mutex);
    channel_->open = false;
}

void pool::post(outgoing_request&& request, std::function<void(response_summary)>&& done) {
    if (!done) throw std::invalid_argument("webhook_client::post: empty completion handler");
    auto const now = clock_type::now();
    if (closed_) {
        fail_later(std::move(done), now, std::string(client_closed));
        return;
    }
    if (std::string error = check_headers(request.headers); !error.empty()) {
        fail_later(std::move(done), now, std::move(error));
        return;
    }
    queue_.push_back(pending{std::move(request), std::move(done), now});
    dispatch();
}

void pool::dispatch() {
    while (!queue_.empty()) {
        std::shared_ptr<connection_base> c;
        while (!idle_.empty() && !c) {
            c = std::move(idle_.back());
            idle_.pop_back();
            if (!c->usable()) {
                c->close();
                c.reset();
            }
        }
        if (!c) {
            if (busy_.size() >= config_.options.max_connections) return;  // idle_ is empty here
            c = make_connection(shared_from_this());
        }
        busy_.push_back(c.get());
        pending p = std::move(queue_.front());
        queue_.pop_front();
        c->start(std::move(p));  // c now lives in its handlers
    }
}

void pool::finished(connection_base& c, bool reusable, std::function<void(response_summary)>&& done,
                    response_summary&& summary) {
    forget(&c);
    if (reusable) {
        if (closed_) {
            c.close();
        } else {
            idle_.push_back(c.shared_from_this());
        }
    }
    dispatch();  // start the next queued request before running caller code
    done(std::move(summary));
}

void pool::forget(const connection_base* c) noexcept {
    auto const it = std::find(busy_.begin(), busy_.end(), c);
    if (it != busy_.end()) busy_.erase(it);
}

void pool::lookup(std::shared_ptr<connection_base> c, std::uint64_t generation) {
    lookup_waiters_.emplace_back(std::move(c), generation);
    if (lookup_running_) return;
    lookup_running_ = true;
    resolver_function fn = config_.options.resolve ? config_.options.resolve : resolver_function(system_lookup);
    auto deliver = [channel = channel_, executor = ioc_.get_executor(), owner = weak_from_this()](resolution&& r) {
        std::lock_guard const lock(channel->mutex);
        if (!channel->open) return;
        net::post(executor, [owner, r = std::move(r)]() mutable {
            if (auto const p = owner.lock()) p->on_lookup(std::move(r));
        });
    };
    try {
        std::thread([fn = std::move(fn), deliver, host = config_.endpoint.host, port = config_.endpoint.port] {
            resolution r;
            try {
                r = fn(host, port);
            } catch (const std::exception& e) {
                r = resolution{{}, e.what()};
            }
            deliver(std::move(r));
        }).detach();
    } catch (const std::system_error& e) {
        deliver(resolution{{}, fmt::format("cannot start a lookup thread: {}", e.what())});
    }
}

void pool::on_lookup(resolution&& r) {
    lookup_running_ = false;
    auto const waiters = std::exchange(lookup_waiters_, {});
    for (auto const& [c, generation] : waiters) c->on_lookup(generation, r);
}

void pool::drop_lookup(const connection_base* c) noexcept {
    std::erase_if(lookup_waiters_, [c](auto const& w) { return w.first.get() == c; });
}

void pool::fail_later(std::function<void(response_summary)>&& done, clock_type::time_point posted, std::string error) {
    net::post(ioc_, [done = std::move(done), posted, error = std::move(error)]() mutable {
        response_summary s = transport_failure(std::move(error));
        s.elapsed = since(posted);
        done(std::move(s));
    });
}

void pool::close() {
    closed_ = true;
    std::deque<pending> queued = std::exchange(queue_, {});
    for (pending& p : queued) fail_later(std::move(p.done), p.posted, std::string(client_closed));
    std::vector<std::shared_ptr<connection_base>> idle = std::exchange(idle_, {});
    for (auto& c : idle) c->close();
}

void pool::abort() {
    close();
    aborted_ = true;
    {
        std::lock_guard const lock(channel_->mutex);
        channel_->open = false;  // the client may be destroyed next, then the io_context
    }
    std::vector<connection_base*> const busy = busy_;  // abort() never destroys synchronously
    for (connection_base* c : busy) c->abort();
}

}  // namespace outboxd::http
