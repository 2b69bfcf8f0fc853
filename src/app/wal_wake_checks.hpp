#pragma once
// What relay.wake = "wal" needs of the server, checked before the relay
// starts, so that a missing piece is an exit code and a message that says
// what to do (README "Wake-up modes") rather than a relay polling for ever.

#include <string>

#include "app/exit_codes.hpp"
#include "pg/store.hpp"
#include "pg/wal_listener.hpp"

namespace outboxd::app {

// Throws fatal_error for the first thing missing: wal_level (exit 8), the
// role's REPLICATION (7), the publication (4), a free slot or WAL sender (8).
void check_wal_wake(const pg::store::wal_readiness& r, const std::string& schema);

// The first replication connection was refused: why, as an exit code.
[[nodiscard]] fatal_error wal_connect_failure(const pg::wal_connect_error& e, const std::string& dsn);

}  // namespace outboxd::app
