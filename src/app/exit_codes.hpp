#pragma once
// Exit codes of the outboxd binary (documented in the README).

#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/dsn.hpp"

namespace outboxd::app {

enum exit_code : int {
    exit_ok = 0,                 // done; or a graceful shutdown after SIGINT/SIGTERM
    exit_internal = 1,           // a bug or an unexpected failure
    exit_usage = 2,              // bad command line or configuration value
    exit_db_unavailable = 3,     // cannot connect / authenticate / query at startup
    exit_schema_missing = 4,     // outbox not installed, or older than this binary: run `outboxd migrate`
    exit_schema_too_new = 5,     // the schema was migrated by a newer outboxd
    exit_invalid_input = 6,      // `enqueue` given data the outbox refuses (malformed JSON, ...)
    exit_permission_denied = 7,  // the database role lacks a privilege (see config/grants.sql)
    exit_db_unsuitable = 8,      // the server's settings do not allow the configured mode (wal_level, slots, senders)
    exit_window_unsafe = 9,      // windows must not be read here: a cursor from another cluster or ahead of the
                                 // server's xid counter (a restore, a PITR), or a standby (core/window_safety.hpp)
    exit_forced = 130,           // a second SIGINT/SIGTERM cut the graceful shutdown short
};

// A failure that ends the process with a specific code and a clear message.
struct fatal_error : std::runtime_error {
    fatal_error(int code, const std::string& message) : std::runtime_error(message), code(code) {}
    int code;
};

// The database refused a statement for want of a privilege (SQLSTATE 42501):
// its message names the object ("permission denied for schema outbox").
[[nodiscard]] inline fatal_error permission_denied(std::string_view server_message) {
    return fatal_error(exit_permission_denied,
                       fmt::format("{}: the database role lacks a privilege; config/grants.sql lists the grants each "
                                   "role needs (README: Database privileges)",
                                   server_message));
}

// The first connection failed: the password is cut out of both the
// connection string and libpq's message.
[[nodiscard]] inline fatal_error database_unavailable(const std::exception& e, const std::string& dsn) {
    return fatal_error(exit_db_unavailable, fmt::format("cannot connect to the database ({}): {}", redact_dsn(dsn),
                                                        scrub_secrets(e.what(), dsn)));
}

}  // namespace outboxd::app
