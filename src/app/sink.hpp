#pragma once
// Where a destination's deliveries go: a webhook endpoint (HTTP/HTTPS),
// stdout (one JSON line per event) or a NATS JetStream stream. Both report through the same
// response_summary, so retries, dead letters and fencing work the same way.
// Driven by the relay's io_context; callbacks run there.

#include <utility>  // before Asio

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "core/config.hpp"
#include "core/event.hpp"
#include "http/webhook_client.hpp"

namespace outboxd::app {

class sink {
public:
    virtual ~sink() = default;
    // Sends `e` (its payload is the body) with `headers`; `done` runs once, on
    // the io_context, never from inside send(). Nothing is started after
    // `deadline` and the attempt ends by it (a transport error if need be).
    virtual void send(const event& e, header_list headers, std::chrono::steady_clock::time_point deadline,
                      std::function<void(http::response_summary)> done) = 0;
    // No new sends; what is under way completes or fails promptly.
    virtual void close() = 0;
};

// Throws std::invalid_argument for an endpoint or TLS setting the client
// refuses (the message names it and never holds a secret).
[[nodiscard]] std::unique_ptr<sink> make_webhook_sink(boost::asio::io_context& ioc, const destination_config& d,
                                                      bool block_private_addresses);
[[nodiscard]] std::unique_ptr<sink> make_stdout_sink(boost::asio::io_context& ioc);
// A NATS JetStream destination (app/sink_nats.cpp); connects in the background.
[[nodiscard]] std::unique_ptr<sink> make_nats_sink(boost::asio::io_context& ioc, const destination_config& d);

}  // namespace outboxd::app
