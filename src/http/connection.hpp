#pragma once
// One keep-alive connection of a webhook client's pool, as the pool sees it.
// The implementation (plain TCP or TLS, the steps of an attempt, deadlines
// and the stale-connection retry) is in connection.cpp.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "http/webhook_client.hpp"

namespace outboxd::http {

using clock_type = std::chrono::steady_clock;

// A request waiting for, or handed to, a connection.
struct pending {
    outgoing_request request;
    std::function<void(response_summary)> done;
    clock_type::time_point posted;
};

[[nodiscard]] inline std::chrono::microseconds since(clock_type::time_point start) {
    return std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - start);
}

[[nodiscard]] inline response_summary transport_failure(std::string error, bool timed_out = false) {
    response_summary s;
    s.transport_error = true;
    s.timed_out = timed_out;
    s.error = std::move(error);
    return s;
}

class connection_base : public std::enable_shared_from_this<connection_base> {
public:
    connection_base() = default;
    connection_base(const connection_base&) = delete;
    connection_base& operator=(const connection_base&) = delete;
    virtual ~connection_base() = default;

    // Sends p on this connection, (re)connecting first if needed.
    virtual void start(pending&& p) = 0;
    // For an idle connection: true when it can take a request now.
    [[nodiscard]] virtual bool usable() noexcept = 0;
    // Closes an idle connection.
    virtual void close() noexcept = 0;
    // Cancels whatever the connection is doing; its request fails.
    virtual void abort() = 0;
    // The pool's lookup answered (generation: the connection's, when it asked).
    virtual void on_lookup(std::uint64_t generation, const resolution& r) = 0;
};

class pool;

// A new, unconnected connection of `owner`: TLS for an https endpoint.
[[nodiscard]] std::shared_ptr<connection_base> make_connection(std::shared_ptr<pool> owner);

}  // namespace outboxd::http
