#pragma once
// Installs and upgrades the outbox schema from the embedded migrations.

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <pqxx/connection>

namespace outboxd::pg {

// The schema carries migrations this binary does not know: an older binary
// must not run against (or "upgrade") a newer schema.
struct schema_too_new : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct migrate_result {
    std::vector<int> applied;  // versions applied by this call, in order
    int version = 0;           // the schema's version afterwards
};

// The highest applied migration; nullopt when the outbox was never installed.
[[nodiscard]] std::optional<int> read_schema_version(pqxx::connection& conn, const std::string& schema);

// Applies pending migrations, one transaction each, under a session advisory
// lock keyed by the schema name: concurrent migrators queue up and the later
// ones find nothing to do. Each migration's bookkeeping row is inserted first
// in its transaction.
[[nodiscard]] migrate_result migrate(pqxx::connection& conn, const std::string& schema);

}  // namespace outboxd::pg
