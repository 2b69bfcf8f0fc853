#pragma once
// `outboxd run`: wires the listener, the dispatcher, the store workers, the
// route table and one sink per destination together on one event loop.

#include <functional>
#include <string>

#include "core/config.hpp"
#include "core/relay_engine.hpp"

namespace outboxd::app {

struct relay_options {
    config settings;          // resolved and validated (see core/config.hpp)
    std::string dsn;          // settings.database_url with outboxd's connection defaults
    std::string lease_owner;  // unique per process
    run_mode mode = run_mode::serve;  // once: `run --once`, exits when drained
    // Reads the configuration again (SIGHUP); throws fatal_error when it is
    // not valid. Unset: SIGHUP is refused with a warning.
    std::function<config()> reload;
};

// Runs until SIGINT/SIGTERM (or, --once, until drained); returns the
// process exit code. Throws
// fatal_error (see exit_codes.hpp) for failures before the loop starts.
[[nodiscard]] int run_relay(const relay_options& options);

}  // namespace outboxd::app
