#include "app/wal_wake_checks.hpp"

#include <string_view>

#include <fmt/format.h>

#include "core/dsn.hpp"
#include "core/pgoutput.hpp"
#include "core/sql_ident.hpp"

namespace outboxd::app {

namespace {
constexpr std::string_view otherwise = "or choose another relay.wake (README: Wake-up modes)";
}  // namespace

void check_wal_wake(const pg::store::wal_readiness& r, const std::string& schema) {
    if (r.wal_level != "logical") {
        throw fatal_error(exit_db_unsuitable,
                          fmt::format("relay.wake = \"wal\" needs wal_level = logical; the server has wal_level = "
                                      "{}. Set wal_level = logical and restart PostgreSQL (RDS and Aurora: "
                                      "rds.logical_replication = 1; Cloud SQL: cloudsql.logical_decoding = on; "
                                      "Azure: wal_level = logical), {}",
                                      r.wal_level, otherwise));
    }
    if (!r.may_replicate) {
        throw fatal_error(exit_permission_denied,
                          fmt::format("relay.wake = \"wal\" opens a replication connection, and role {} may not: "
                                      "ALTER ROLE {} REPLICATION (RDS and Aurora: GRANT rds_replication TO {}), {}",
                                      quote_ident(r.role), quote_ident(r.role), quote_ident(r.role), otherwise));
    }
    if (!r.publication_ready) {
        throw fatal_error(exit_schema_missing,
                          fmt::format("relay.wake = \"wal\" streams publication {}, which does not exist or does "
                                      "not publish inserts into {}.events: run `outboxd wake-setup wal` (or apply "
                                      "the SQL `outboxd wake-setup wal --print` prints)",
                                      quote_ident(pgoutput::publication_name(schema)), quote_ident(schema)));
    }
    if (r.free_slots <= 0) {
        throw fatal_error(exit_db_unsuitable,
                          fmt::format("relay.wake = \"wal\" needs one replication slot per relay, and every slot "
                                      "is taken (max_replication_slots): raise max_replication_slots and restart "
                                      "PostgreSQL, or drop slots nobody uses (pg_replication_slots), {}",
                                      otherwise));
    }
    if (r.free_senders <= 0) {
        throw fatal_error(exit_db_unsuitable,
                          fmt::format("relay.wake = \"wal\" needs one WAL sender per relay, and every one is "
                                      "busy (max_wal_senders): raise max_wal_senders and restart PostgreSQL, {}",
                                      otherwise));
    }
}

fatal_error wal_connect_failure(const pg::wal_connect_error& e, const std::string& dsn) {
    using k = pg::wal_connect_error::kind;
    // e.what() is libpq's message, already scrubbed of any password.
    if (e.why == k::no_replication_privilege) {
        return fatal_error(exit_permission_denied,
                           fmt::format("relay.wake = \"wal\": the server refused a replication connection ({}): give "
                                       "the role REPLICATION (RDS and Aurora: rds_replication)",
                                       e.what()));
    }
    if (e.why == k::no_wal_senders) {
        return fatal_error(exit_db_unsuitable,
                           fmt::format("relay.wake = \"wal\": the server has no WAL sender left ({}): raise "
                                       "max_wal_senders and restart PostgreSQL",
                                       e.what()));
    }
    return fatal_error(exit_db_unavailable,
                       fmt::format("cannot open the replication connection ({}): {}", redact_dsn(dsn), e.what()));
}

}  // namespace outboxd::app
