#include "core/migration_set.hpp"

#include <fmt/format.h>

#include "core/sql_ident.hpp"

namespace outboxd {

migration_plan plan_migrations(std::optional<int> applied,
                               std::span<const embedded::migration_source> known) {
    migration_plan plan;
    plan.binary_version = known.empty() ? 0 : known.back().version;
    plan.database_version = applied.value_or(0);
    if (plan.database_version > plan.binary_version) {
        plan.database_is_newer = true;
        return plan;
    }
    for (const auto& m : known) {
        if (m.version > plan.database_version) plan.pending.push_back(m);
    }
    return plan;
}

std::string migration_script(std::string_view schema, std::string_view bootstrap_sql,
                             std::span<const embedded::migration_source> known) {
    std::string out = fmt::format(
        "-- outboxd migrations for schema {}\n"
        "-- Apply in order; each migration runs in its own transaction and records itself\n"
        "-- in schema_migrations, so `outboxd run` and `outboxd migrate` see the version.\n\n"
        "BEGIN;\n{}COMMIT;\n",
        quote_ident(schema), render_sql(bootstrap_sql, schema));
    for (const auto& m : known) {
        // Recorded first, as `outboxd migrate` does: a second run of the
        // script fails on the primary key instead of applying twice (the
        // migration's own record at its end then does nothing).
        out += fmt::format("\n-- migration {:04d}_{}\nBEGIN;\nINSERT INTO {}.schema_migrations (version, name) VALUES ({}, {});\n{}\nCOMMIT;\n",
                           m.version, m.name, quote_ident(schema), m.version, quote_literal(m.name),
                           render_sql(m.sql, schema));
    }
    return out;
}

}  // namespace outboxd
