#pragma once
// HTTP/1.1 webhook sender: a bounded pool of keep-alive connections to one
// endpoint (http or https), driven by the caller's io_context (all callbacks
// run there).

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>

#include "core/event.hpp"
#include "core/tls_settings.hpp"
#include "core/url.hpp"
#include "http/response_limits.hpp"  // max_response_bytes and the other bounds on a response

namespace outboxd::http {

// What a name lookup found: the addresses, or why there are none.
struct resolution {
    std::vector<boost::asio::ip::address> addresses;
    std::string error;  // for the message when addresses is empty
};
// A blocking name lookup of (host, port). It runs on a thread of its own,
// never the io_context's; its answer is dropped once the attempt's connect
// deadline has passed.
using resolver_function = std::function<resolution(const std::string& host, const std::string& port)>;

struct client_options {
    std::size_t max_connections = 32;                         // concurrent requests at most
    std::chrono::milliseconds connect_timeout{5'000};         // DNS + TCP connect + TLS handshake
    std::chrono::milliseconds request_timeout{10'000};        // write request + read response
    std::size_t max_body_excerpt = 1024;                      // bytes of response body kept
    std::string user_agent = "outboxd";
    tls_settings tls{};                                       // https only: how the server is verified
    // Egress (SSRF) guard: connect only to global addresses, checked on
    // every address DNS returns (see core/address_policy.hpp); a request
    // with none left fails as a transport error.
    bool block_private_addresses = false;
    // Name lookups; empty = getaddrinfo. Tests put a slow one here.
    resolver_function resolve{};
};

struct outgoing_request {
    std::string body;        // sent as-is, Content-Type: application/json
    header_list headers;     // extra headers (already validated by the caller)
    // The attempt ends by this instant at the latest (the relay passes the
    // end of the event's lease, less a margin): no connect, write or retry
    // starts after it, and connect_timeout and request_timeout are cut short
    // by it.
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct response_summary {
    // transport_error: no HTTP status was received (DNS, connect, TLS
    // handshake, reset, timeout, malformed response, an address refused by
    // the egress guard). status is then 0.
    bool transport_error = false;
    bool timed_out = false;
    unsigned status = 0;
    std::string error;          // human readable; never contains secrets
    std::string retry_after;    // raw Retry-After header value, if any
    std::string body_excerpt;   // at most max_body_excerpt bytes of the body
    std::chrono::microseconds elapsed{0};  // from post() to done, queueing included
};

class webhook_client {
public:
    // Throws std::invalid_argument for an endpoint without host or valid
    // port, and for an https endpoint whose tls.ca_file cannot be loaded
    // (the message names the file). max_connections 0 means 1.
    // https: TLS 1.2 or later; unless tls.verify is false, the server's
    // certificate must chain to tls.ca_file (or the system CAs) and match
    // the host (a DNS name or an IP literal).
    webhook_client(boost::asio::io_context& ioc, endpoint_url endpoint, client_options options);
    // Fails queued requests and aborts those on the wire: every pending
    // `done` still runs exactly once (error "client closed") on the
    // io_context, so `done` must not capture the client itself.
    ~webhook_client();
    webhook_client(const webhook_client&) = delete;
    webhook_client& operator=(const webhook_client&) = delete;

    // POSTs one request. `done` is called exactly once, on the io_context's
    // thread, never from inside post() itself. When all connections are busy
    // the request waits in a FIFO queue. Extra headers naming Host,
    // Content-Length, Transfer-Encoding, Connection (or other hop-by-hop
    // headers) are ignored; Content-Type and User-Agent replace the defaults;
    // a header with an invalid name or a control character in its value
    // fails the request without sending it. Must be called on the
    // io_context's thread (the client is single-threaded).
    void post(outgoing_request request, std::function<void(response_summary)> done);

    // Requests currently being sent or waiting for a connection.
    [[nodiscard]] std::size_t in_flight() const noexcept;

    // Closes idle connections and fails queued requests that have not started;
    // requests already on the wire complete (bounded by request_timeout).
    void close();

private:
    struct impl;
    std::shared_ptr<impl> impl_;
};

}  // namespace outboxd::http
