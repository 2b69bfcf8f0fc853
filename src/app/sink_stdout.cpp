// The stdout transport: one JSON object per line per delivery, for piping
// into other tools and for debugging routes. Same semantics as a webhook: a
// line counts as delivered once write() has taken all of it; a failed write
// (EPIPE when the reader went away, ENOSPC, ...) is a failed attempt, retried
// and eventually dead-lettered like any other. Logs go to stderr, so stdout
// carries nothing but these lines.

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/sink.hpp"

namespace outboxd::app {
namespace {

namespace net = boost::asio;

std::string json_line(const event& e, const header_list& headers) {
    nlohmann::json meta{{"id", e.id}, {"topic", e.topic}, {"attempt", e.attempt}};
    meta["ordering_key"] = e.ordering_key ? nlohmann::json(*e.ordering_key) : nlohmann::json();
    auto h = nlohmann::json::object();
    for (const auto& [name, value] : headers) h[name] = value;
    meta["headers"] = std::move(h);
    // The payload is already JSON (a jsonb column's text): spliced in as-is,
    // not parsed and printed again.
    auto line = meta.dump();
    line.pop_back();  // the closing brace
    line += ",\"payload\":";
    line += e.payload;
    line += "}\n";
    return line;
}

class stdout_sink final : public sink {
public:
    explicit stdout_sink(net::io_context& ioc) : ioc_(ioc), out_(ioc) {
        // Pipes and terminals are written asynchronously; a regular file
        // cannot be (epoll refuses it) and is written in place — a file
        // write does not wait on a reader.
        const int fd = ::dup(STDOUT_FILENO);
        boost::system::error_code ec;
        if (fd >= 0) out_.assign(fd, ec);
        if (fd < 0 || ec) {
            if (fd >= 0) ::close(fd);
            blocking_ = true;
        } else {
            out_.non_blocking(true, ec);
        }
    }

    void send(const event& e, header_list headers, std::chrono::steady_clock::time_point /*deadline: local writes*/,
              std::function<void(http::response_summary)> done) override {
        if (closed_) {
            net::post(ioc_, [done = std::move(done)] { done(failure("stdout transport closed")); });
            return;
        }
        queue_.push_back({json_line(e, headers), std::move(done), std::chrono::steady_clock::now()});
        if (!writing_) write_next();
    }

    void close() override {
        closed_ = true;
        boost::system::error_code ec;
        if (queue_.empty() && out_.is_open()) out_.close(ec);
    }

private:
    struct pending_line {
        std::string text;
        std::function<void(http::response_summary)> done;
        std::chrono::steady_clock::time_point queued;
    };

    static http::response_summary failure(std::string why) {
        http::response_summary r;
        r.transport_error = true;
        r.error = std::move(why);
        return r;
    }

    void write_next() {
        if (queue_.empty()) {
            writing_ = false;
            if (closed_ && out_.is_open()) {
                boost::system::error_code ec;
                out_.close(ec);
            }
            return;
        }
        writing_ = true;
        if (blocking_) {
            net::post(ioc_, [this] { finish(write_in_place(queue_.front().text)); });
            return;
        }
        net::async_write(out_, net::buffer(queue_.front().text),
                         [this](const boost::system::error_code& ec, std::size_t) { finish(ec); });
    }

    static boost::system::error_code write_in_place(const std::string& text) {
        std::size_t written = 0;
        while (written < text.size()) {
            const auto n = ::write(STDOUT_FILENO, text.data() + written, text.size() - written);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return {errno, boost::system::system_category()};
            written += static_cast<std::size_t>(n);
        }
        return {};
    }

    void finish(const boost::system::error_code& ec) {
        auto line = std::move(queue_.front());
        queue_.pop_front();
        http::response_summary r;
        if (ec) {
            r = failure(fmt::format("writing to stdout failed: {}", ec.message()));
        } else {
            r.status = 200;  // taken in full: delivered
        }
        r.elapsed = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - line.queued);
        line.done(std::move(r));
        write_next();
    }

    net::io_context& ioc_;
    net::posix::stream_descriptor out_;
    std::deque<pending_line> queue_;
    bool blocking_ = false;
    bool writing_ = false;
    bool closed_ = false;
};

}  // namespace

std::unique_ptr<sink> make_stdout_sink(net::io_context& ioc) { return std::make_unique<stdout_sink>(ioc); }

}  // namespace outboxd::app
