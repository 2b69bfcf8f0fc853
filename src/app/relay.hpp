#pragma once
// `outboxd run`: wires the listener, the dispatcher, the store workers, the
// route table and one sink per destination together on one event loop.

#include <string>

#include "core/config.hpp"

namespace outboxd::app {

struct relay_options {
    config settings;          // resolved and validated (see core/config.hpp)
    std::string dsn;          // settings.database_url with outboxd's connection defaults
    std::string lease_owner;  // unique per process
};

// Runs until SIGINT/SIGTERM; returns the process exit code. Throws
// fatal_error (see exit_codes.hpp) for failures before the loop starts.
[[nodiscard]] int run_relay(const relay_options& options);

}  // namespace outboxd::app
