#pragma once
// What the webhook_client tests share: driving the io_context until a
// condition holds (never a sleep) and collecting results of post().

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "http/webhook_client.hpp"

namespace outboxd::test {

// Runs the loop until pred() holds; false after `limit` (a generous bound
// that only matters when the code under test is broken).
template <class predicate>
bool run_until(boost::asio::io_context& ioc, predicate pred,
               std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    auto const deadline = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        auto const now = std::chrono::steady_clock::now();
        if (now >= deadline) return false;
        if (ioc.stopped()) ioc.restart();
        ioc.run_one_for(deadline - now);
    }
    return true;
}

// Runs whatever is ready without blocking: an accept the client caused
// would be counted by the server now.
inline void settle(boost::asio::io_context& ioc) {
    ioc.restart();
    ioc.poll();
}

// Collects the result of one post().
struct result_slot {
    std::optional<http::response_summary> value;
    int calls = 0;
    auto callback() {
        return [this](http::response_summary s) {
            ++calls;
            value = std::move(s);
        };
    }
    [[nodiscard]] bool done() const noexcept { return calls > 0; }
};

inline http::outgoing_request json(std::string body) { return http::outgoing_request{std::move(body), {}}; }

inline http::client_options fast_options() {
    http::client_options o;
    o.max_connections = 4;
    o.connect_timeout = std::chrono::seconds(5);
    o.request_timeout = std::chrono::seconds(5);
    return o;
}

// Posts one request and runs the loop until it completes.
inline http::response_summary post_and_wait(boost::asio::io_context& ioc, http::webhook_client& client,
                                            http::outgoing_request req) {
    result_slot slot;
    client.post(std::move(req), slot.callback());
    REQUIRE(run_until(ioc, [&] { return slot.done(); }));
    REQUIRE(slot.calls == 1);
    return *slot.value;
}

}  // namespace outboxd::test
