#pragma once
// What `outboxd migrate` must do, decided without a database: given the
// version the schema is at and the migrations this binary carries.

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/embedded_sql.hpp"

namespace outboxd {

struct migration_plan {
    std::vector<embedded::migration_source> pending;  // in order
    bool database_is_newer = false;  // the schema has migrations this binary does not know
    int database_version = 0;
    int binary_version = 0;
};

// `applied` is the highest applied version, or nullopt when the outbox was
// never installed in the schema.
[[nodiscard]] migration_plan plan_migrations(std::optional<int> applied,
                                             std::span<const embedded::migration_source> known);

// The migrations as one plain SQL script for users' own migration tools:
// bootstrap (schema + bookkeeping table), then each migration followed by the
// row that records it, each in its own transaction.
[[nodiscard]] std::string migration_script(std::string_view schema, std::string_view bootstrap_sql,
                                           std::span<const embedded::migration_source> known);

}  // namespace outboxd
