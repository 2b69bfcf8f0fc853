// A webhook client connection: one request at a time over one keep-alive
// socket, plain or TLS.
//
// An attempt: [resolve (through the pool) → egress check → connect → TLS
// handshake] → write → read → finish(): the pool takes the connection back
// (idle, or closed) and runs `done`. Every step runs in a completion
// handler, so `done` is never called from inside post().
//
// Deadlines: resolve + connect + TLS handshake share one deadline
// (connect_timeout: everything it takes to get a usable connection); write +
// read share another (request_timeout), both through tcp_stream's timer
// (the lookup gets a steady_timer, as tcp_stream does not cover it). Both
// are cut short by the request's own deadline (the relay's lease), after
// which nothing starts: no connect, no write, no stale-connection retry.
//
// TLS: `connection` is a template on its stream type; https endpoints get
// connection<beast::ssl_stream<beast::tcp_stream>>, which adds the handshake
// after connect, and everything else goes through get_lowest_layer(). Every
// (re)connect makes a fresh stream: an OpenSSL session object cannot be
// handshaken again once its connection has closed. No close_notify is sent
// on close: HTTP/1.1 framing already tells where every message ends, so a
// truncation cannot go unnoticed, and a two-way TLS shutdown would wait on
// the server (delaying close and process exit) for no benefit.
//
// Failures are described by describe_failure (failure_description.hpp) from
// the facts gathered here.

#include "http/connection.hpp"

#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "http/egress_guard.hpp"
#include "http/excerpt_body.hpp"
#include "http/failure_description.hpp"
#include "http/pool.hpp"
#include "http/request_head.hpp"
#include "http/response_limits.hpp"
#include "http/tls_context.hpp"

namespace outboxd::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using tls_stream = beast::ssl_stream<beast::tcp_stream>;

namespace {

// Errors that mean "the server closed this connection" rather than "the
// server is broken": on a reused connection they trigger the one retry.
// TLS adds stream_truncated: the server closed without a close_notify, which
// is how most of them drop an idle connection.
bool is_stale_connection_error(const beast::error_code& ec) noexcept {
    return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
           ec == net::error::broken_pipe || ec == net::error::connection_aborted ||
           ec == net::error::not_connected || ec == ssl::error::stream_truncated;
}

std::chrono::milliseconds whole_ms(clock_type::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

template <class stream_type>
class connection final : public connection_base {
public:
    explicit connection(std::shared_ptr<pool> owner)
        : pool_(std::move(owner)),
          config_(pool_->config()),
          resolve_timer_(pool_->ioc()) {}

    ~connection() override { pool_->forget(this); }

    void start(pending&& p) override {
        done_ = std::move(p.done);
        posted_ = p.posted;
        deadline_ = p.request.deadline;
        may_retry_ = true;
        build_request(std::move(p.request));
        if (clock_type::now() >= deadline_) {
            // Through the loop: start() may run inside post().
            net::post(pool_->ioc(), [self = self()] { self->not_sent(); });
            return;
        }
        if (stream_ && tcp_layer().socket().is_open()) {
            send();
        } else {
            connect();
        }
    }

    bool usable() noexcept override {
        if (!stream_) return false;
        auto& socket = tcp_layer().socket();
        if (!socket.is_open()) return false;
        // A server closes idle keep-alive connections whenever it likes
        // (nginx after 75 s, Node after 5 s). Peeking one byte without
        // blocking tells whether it already has: 0 = orderly close, data =
        // something unsolicited (e.g. a 408 before closing), either way the
        // connection is unusable. EAGAIN = nothing to read, still open.
        // This catches almost every stale connection before a request is
        // wasted on it; the retry in on_write/on_read covers the race left.
        if constexpr (is_tls) {
            return only_harmless_tls_records();
        } else {
            char byte = 0;
            ssize_t const n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        }
    }

    void close() noexcept override { close_socket(); }

    void abort() override {
        resolve_timer_.cancel();  // a connection waiting for a lookup fails in on_resolve_wait
        close_socket();
    }

    void on_lookup(std::uint64_t generation, const resolution& r) override {
        if (generation != resolve_generation_ || phase_ != phase::resolving) return;
        lookup_ = r;
        resolve_timer_.cancel();  // wakes on_resolve_wait
    }

private:
    enum class phase { idle, resolving, connecting, handshaking, writing, reading };
    static constexpr bool is_tls = std::is_same_v<stream_type, tls_stream>;

    std::shared_ptr<connection> self() { return std::static_pointer_cast<connection>(shared_from_this()); }
    beast::tcp_stream& tcp_layer() noexcept { return beast::get_lowest_layer(*stream_); }

    // The TLS form of usable()'s peek. What the server sent may already sit
    // inside the TLS stream, read from the socket together with the last
    // response, and records must be decrypted to be told apart: so the
    // stream itself is read, without blocking. Records that carry no data
    // (TLS 1.3 session tickets, key updates; servers send them whenever they
    // like) are consumed and leave the connection usable; a close_notify
    // (eof), a closed socket, an error or application data (an unsolicited
    // response) do not. "Would block" = nothing left, still open.
    bool only_harmless_tls_records() noexcept {
        auto& socket = tcp_layer().socket();
        beast::error_code ec;
        socket.non_blocking(true, ec);  // for this synchronous read only
        if (ec) return false;
        char byte = 0;
        std::size_t const n = stream_->read_some(net::buffer(&byte, 1), ec);
        beast::error_code ignored;
        socket.non_blocking(false, ignored);
        return n == 0 && ec == net::error::would_block;
    }

    void close_socket() noexcept {
        if (!stream_) return;
        beast::error_code ignored;
        tcp_layer().socket().close(ignored);
        try {
            tcp_layer().close();  // also cancels tcp_stream's timer
        } catch (...) {  // NOLINT(bugprone-empty-catch): nothing left to clean up
        }
    }

    void build_request(outgoing_request&& r) {
        head_ = request_head({config_.endpoint.target, config_.endpoint.host_header, config_.options.user_agent},
                             r.headers, r.body.size());
        body_ = std::move(r.body);  // moved, never copied
    }

    void connect() {
        reused_ = false;
        buffer_.clear();
        // A fresh stream for every connection (see the top of this file).
        if constexpr (is_tls) {
            stream_.emplace(pool_->ioc(), pool_->tls_context());
        } else {
            stream_.emplace(pool_->ioc());
        }
        auto const now = clock_type::now();
        connect_deadline_ = std::min(now + config_.options.connect_timeout, deadline_);
        connect_budget_ = connect_deadline_ - now;
        connect_cut_ = connect_deadline_ == deadline_;
        if (config_.literal) {
            phase_ = phase::connecting;
            tcp::endpoint const target(*config_.literal, config_.port);
            if (config_.options.block_private_addresses) {
                if (std::string refused = egress_refusal(target.address()); !refused.empty()) {
                    // Through the loop: connect() may run inside post().
                    net::post(pool_->ioc(), [self = self(), refused = std::move(refused)] {
                        self->fail({.kind = failure_kind::egress_refused, .detail = refused});
                    });
                    return;
                }
            }
            tcp_layer().expires_at(connect_deadline_);
            tcp_layer().async_connect(target, [self = self()](beast::error_code ec) { self->on_connect(ec); });
            return;
        }
        phase_ = phase::resolving;
        lookup_.reset();
        std::uint64_t const generation = ++resolve_generation_;
        resolve_timer_.expires_at(connect_deadline_);
        resolve_timer_.async_wait(
            [self = self(), generation](beast::error_code /*ec*/) { self->on_resolve_wait(generation); });
        pool_->lookup(shared_from_this(), generation);
    }

    // The lookup answered (on_lookup cancelled the timer), the connect
    // deadline came, or the client was destroyed.
    void on_resolve_wait(std::uint64_t generation) {
        if (generation != resolve_generation_ || phase_ != phase::resolving) return;
        if (pool_->aborted() || !lookup_ || clock_type::now() >= connect_deadline_) {
            pool_->drop_lookup(this);  // a late answer is dropped
            fail(beast::error::timeout);  // or "client closed", when aborted
            return;
        }
        resolution const r = std::move(*lookup_);
        lookup_.reset();
        if (r.addresses.empty()) {
            fail({.kind = failure_kind::lookup_failed, .detail = r.error});
            return;
        }
        on_resolve(r.addresses);
    }

    void on_resolve(const std::vector<net::ip::address>& addresses) {
        phase_ = phase::connecting;
        screened_addresses const screened =
            screen_addresses(addresses, config_.port, config_.options.block_private_addresses);
        if (screened.allowed.empty() && !screened.refused.empty()) {
            fail({.kind = failure_kind::egress_refused, .detail = screened.refused});
            return;
        }
        tcp_layer().expires_at(connect_deadline_);
        tcp_layer().async_connect(screened.allowed,
                                  [self = self()](beast::error_code ec2, const tcp::endpoint& /*ep*/) {
                                      self->on_connect(ec2);
                                  });
    }

    void on_connect(beast::error_code ec) {
        if (ec) {
            fail(ec);
            return;
        }
        // Small requests and responses: Nagle plus the peer's delayed ACK
        // would hold each one back (bench/NOTES.md, "HTTP client").
        beast::error_code ignored;
        tcp_layer().socket().set_option(tcp::no_delay(true), ignored);
        if constexpr (is_tls) {
            handshake();
        } else {
            send();
        }
    }

    void handshake() {
        phase_ = phase::handshaking;
        if constexpr (is_tls) {
            std::string const why = prepare_tls_session(stream_->native_handle(), config_.endpoint.host,
                                                        config_.literal.has_value(), config_.options.tls.verify);
            if (!why.empty()) {
                fail({.kind = failure_kind::tls_setup_failed, .detail = why});
                return;
            }
            tcp_layer().expires_at(connect_deadline_);  // the rest of connect_timeout
            stream_->async_handshake(ssl::stream_base::client,
                                     [self = self()](beast::error_code ec) { self->on_handshake(ec); });
        }
    }

    void on_handshake(beast::error_code ec) {
        if (ec) {
            fail(ec);
            return;
        }
        send();
    }

    void send() {
        auto const now = clock_type::now();
        if (now >= deadline_) {
            not_sent();
            return;
        }
        phase_ = phase::writing;
        response_bytes_ = 0;
        new_parser();
        // One deadline for write and read together (tcp_stream applies it to
        // every operation until it is set again).
        auto const request_deadline = std::min(now + config_.options.request_timeout, deadline_);
        request_budget_ = request_deadline - now;
        request_cut_ = request_deadline == deadline_;
        tcp_layer().expires_at(request_deadline);
        // Head and body in one gathered write.
        const std::array<net::const_buffer, 2> wire{net::buffer(head_), net::buffer(body_)};
        net::async_write(*stream_, wire,
                         [self = self()](beast::error_code ec, std::size_t /*n*/) { self->on_write(ec); });
    }

    void new_parser() {
        parser_.emplace();
        // excerpt_body enforces max_response_body. Not boost::none: Beast 1.74
        // compares `len > body_limit_` against the empty optional, which is
        // always true, and fails every response whose body arrives in a later
        // segment than its header.
        parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
        parser_->header_limit(max_response_header);
        auto& body = parser_->get().body();
        body.keep = config_.options.max_body_excerpt;
        body.limit = max_response_body;
    }

    void on_write(beast::error_code ec) {
        if (ec) {
            if (should_retry(ec)) {
                retry(ec);
            } else {
                fail(ec);
            }
            return;
        }
        phase_ = phase::reading;
        read();
    }

    // Reads piece by piece to count what the parser consumes: with the
    // unparsed rest bounded by buffer_'s max_unparsed, that bounds every byte
    // read for the attempt, framing and interim responses included.
    void read() {
        http::async_read_some(*stream_, buffer_, *parser_, [self = self()](beast::error_code ec, std::size_t n) {
            self->on_read_some(ec, n);
        });
    }

    void on_read_some(beast::error_code ec, std::size_t parsed) {
        response_bytes_ += parsed;
        if (!ec && response_bytes_ > max_response_bytes) {
            fail({.kind = failure_kind::response_too_large});
            return;
        }
        if (!ec && !parser_->is_done()) {
            read();
            return;
        }
        on_read(ec);
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::body_limit && parser_->is_header_done() && !pool_->aborted()) {
            complete(false);  // status known; the unread rest of the body makes the connection unusable
            return;
        }
        if (ec) {
            if (!parser_->got_some() && should_retry(ec)) {
                retry(ec);
            } else {
                fail(ec);
            }
            return;
        }
        if (parser_->get().result_int() / 100 == 1) {
            // Interim response (e.g. 103 Early Hints): the real one follows.
            may_retry_ = false;  // the server has answered on this connection
            new_parser();
            read();
            return;
        }
        complete(true);
    }

    // Why retry: a server may close an idle keep-alive connection at any
    // moment, and a request written just as it does so fails with EOF or a
    // reset before any response byte arrives. The server did not process
    // such a request (it had closed), so sending it once more on a fresh
    // connection is what every HTTP client does. Only once, only on a
    // connection that had completed an exchange before, and never after a
    // response byte or a timeout. In the rare case where the server did
    // receive the request and then died, the retry is a duplicate; delivery
    // is at-least-once and consumers de-duplicate by event id.
    [[nodiscard]] bool should_retry(const beast::error_code& ec) const noexcept {
        return reused_ && may_retry_ && !pool_->aborted() && is_stale_connection_error(ec);
    }

    // A new connection and the request must both fit before the attempt's
    // deadline, or the retry could outlive the lease.
    void retry(const beast::error_code& ec) {
        may_retry_ = false;
        auto const need = config_.options.connect_timeout + config_.options.request_timeout;
        if (deadline_ - clock_type::now() < need) {
            fail({.kind = failure_kind::connection_lost, .ec = ec});
            return;
        }
        close_socket();
        connect();  // head_ and body_ still hold the whole request
    }

    // The attempt's deadline passed before anything was written: an idle
    // keep-alive connection stays usable.
    void not_sent() {
        bool const keep = reused_ && stream_ && tcp_layer().socket().is_open() && phase_ == phase::idle;
        finish(summary_of({.kind = failure_kind::not_sent}), keep);
    }

    void complete(bool body_complete) {
        auto& res = parser_->get();
        response_summary s;
        s.status = res.result_int();
        if (auto const it = res.find(http::field::retry_after); it != res.end()) {
            s.retry_after = std::string(it->value());
        }
        s.body_excerpt = std::move(res.body().text);
        // HTTP/1.0 responses and `Connection: close` end the connection, and
        // so does a body delimited by EOF, or bytes after the response (the
        // server is out of step with us).
        // (TLS: bytes still inside the TLS stream are found by usable().)
        bool const reusable = body_complete && res.version() == 11 && parser_->keep_alive() &&
                              !parser_->need_eof() && buffer_.size() == 0;
        finish(std::move(s), reusable);
    }

    [[nodiscard]] attempt_stage stage() const noexcept {
        switch (phase_) {
            case phase::resolving: return attempt_stage::resolving;
            case phase::handshaking: return attempt_stage::handshaking;
            case phase::writing: return attempt_stage::writing;
            case phase::reading: return attempt_stage::reading;
            case phase::idle:
            case phase::connecting: break;
        }
        return attempt_stage::connecting;
    }

    // A failure with an error code, at the step the connection is in.
    void fail(const beast::error_code& ec) {
        attempt_failure f{.kind = ec == beast::error::timeout ? failure_kind::timed_out : failure_kind::error,
                          .stage = stage(),
                          .ec = ec};
        bool const request_stage = f.stage == attempt_stage::writing || f.stage == attempt_stage::reading;
        f.budget = whole_ms(request_stage ? request_budget_ : connect_budget_);
        f.budget_cut = request_stage ? request_cut_ : connect_cut_;
        f.response_started = parser_ && parser_->got_some();
        if constexpr (is_tls) {
            if (f.stage == attempt_stage::handshaking) {
                f.tls_verify_result = SSL_get_verify_result(stream_->native_handle());
            }
        }
        finish(summary_of(f), false);
    }

    void fail(const attempt_failure& f) { finish(summary_of(f), false); }

    // Once the client is closed under a request, that is all its caller
    // needs to know.
    [[nodiscard]] response_summary summary_of(attempt_failure f) const {
        if (pool_->aborted()) f.kind = failure_kind::closed;
        return transport_failure(describe_failure(f, config_.facts()), f.kind == failure_kind::timed_out);
    }

    void finish(response_summary&& s, bool reusable) {
        phase_ = phase::idle;
        if (reusable) {
            reused_ = true;
        } else {
            close_socket();
        }
        s.elapsed = since(posted_);
        parser_.reset();
        std::string().swap(body_);  // don't pin a large payload on an idle connection
        std::function<void(response_summary)> done = std::move(done_);
        done_ = nullptr;
        pool_->finished(*this, reusable, std::move(done), std::move(s));
    }

    std::shared_ptr<pool> pool_;
    const client_config& config_;  // owned by *pool_
    std::optional<stream_type> stream_;  // made by connect()
    net::steady_timer resolve_timer_;  // the connect deadline while waiting for a lookup
    std::optional<resolution> lookup_;  // the lookup's answer, until on_resolve_wait takes it
    beast::flat_buffer buffer_{max_unparsed};  // reused across requests on this connection
    std::string head_;  // request line and header fields (see http/request_head.hpp)
    std::string body_;
    std::optional<http::response_parser<excerpt_body>> parser_;
    std::function<void(response_summary)> done_;
    clock_type::time_point posted_{};
    clock_type::time_point deadline_ = clock_type::time_point::max();  // the request's own (outgoing_request)
    clock_type::time_point connect_deadline_{};  // for resolve, connect and handshake
    clock_type::duration connect_budget_{};      // connect_deadline_ - its start, for messages
    clock_type::duration request_budget_{};      // the same for write + read
    bool connect_cut_ = false;  // the budgets were cut short by deadline_
    bool request_cut_ = false;
    phase phase_ = phase::idle;
    bool reused_ = false;     // this socket completed an exchange before
    bool may_retry_ = false;  // the one stale-connection retry is still available
    std::uint64_t response_bytes_ = 0;  // parsed for the current attempt (see read())
    std::uint64_t resolve_generation_ = 0;
};

}  // namespace

std::shared_ptr<connection_base> make_connection(std::shared_ptr<pool> owner) {
    if (owner->config().endpoint.is_tls()) return std::make_shared<connection<tls_stream>>(std::move(owner));
    return std::make_shared<connection<beast::tcp_stream>>(std::move(owner));
}

}  // namespace outboxd::http
