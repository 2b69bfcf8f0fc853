#pragma once
// `outboxd run`: wires the listener, the dispatcher, the store worker and the
// webhook client together on one event loop.

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "core/retry_policy.hpp"
#include "core/signing.hpp"
#include "core/url.hpp"

namespace outboxd::app {

struct relay_options {
    std::string dsn;
    std::string schema = "outbox";
    endpoint_url url;
    std::size_t concurrency = 32;                            // deliveries in flight at most
    std::chrono::milliseconds lease{30'000};                 // how long a claim is ours
    std::chrono::milliseconds sweep_interval{30'000};        // safety net for missed wake-ups
    std::chrono::milliseconds connect_timeout{5'000};
    std::chrono::milliseconds request_timeout{10'000};
    std::chrono::milliseconds shutdown_timeout{10'000};      // graceful: wait this long for in-flight work
    retry_policy retry;
    std::vector<signing_secret> signing_secrets;             // empty: requests are not signed
    std::string lease_owner;                                 // unique per process
};

// Runs until SIGINT/SIGTERM; returns the process exit code. Throws
// startup_error (see exit_codes.hpp) for failures before the loop starts.
[[nodiscard]] int run_relay(const relay_options& options);

}  // namespace outboxd::app
