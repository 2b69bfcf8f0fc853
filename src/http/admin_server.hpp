#pragma once
// The admin HTTP listener: GET (or HEAD) of a few fixed paths, answered by
// the handler on the event loop's thread (/metrics, /healthz, /readyz; see
// app/relay_telemetry). HTTP/1.1 with keep-alive, as Prometheus scrapes.
// Bounded: at most max_connections at once (more are closed at accept), a
// request head of at most 8 KiB and no body, and a deadline on every read
// and write, so a slow or hostile client ties up nothing for long.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "core/listen_address.hpp"

namespace outboxd::http {

struct admin_response {
    unsigned status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
};

class admin_server {
public:
    // path: the request target without its query string.
    using handler = std::function<admin_response(std::string_view path)>;
    static constexpr std::size_t max_connections = 16;

    // Binds and listens now (throws boost::system::system_error: address in
    // use, not a local address); serves once the io_context runs.
    admin_server(boost::asio::io_context& ioc, const listen_address& at, handler h);
    ~admin_server();
    admin_server(const admin_server&) = delete;
    admin_server& operator=(const admin_server&) = delete;

    // The port bound (the one asked for, or the one chosen for port 0).
    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
    // Stops accepting and closes the connections open now.
    void stop();

    struct state;

private:
    std::shared_ptr<state> state_;
    std::uint16_t port_ = 0;
};

}  // namespace outboxd::http
