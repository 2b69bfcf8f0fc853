#include "pg/migrator.hpp"

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/embedded_sql.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/sql_ident.hpp"
#include "pg/named_queries.hpp"

namespace outboxd::pg {
namespace {

migrate_result migrate_locked(pqxx::connection& conn, const query_book& q, const std::string& schema) {
    {
        pqxx::work tx(conn);
        tx.exec(q.sql("bootstrap"));
        tx.commit();
    }
    const auto plan = plan_migrations(read_schema_version(conn, schema), embedded::migrations());
    if (plan.database_is_newer) {
        throw schema_too_new(fmt::format(
            "schema {} is at migration {}, newer than this outboxd (knows up to {}); upgrade outboxd",
            quote_ident(schema), plan.database_version, plan.binary_version));
    }
    migrate_result result{{}, plan.database_version};
    for (const auto& m : plan.pending) {
        pqxx::work tx(conn);
        tx.exec_params(q.sql("record_migration"), m.version, std::string(m.name));
        tx.exec(render_sql(m.sql, schema));
        tx.commit();
        log::info("applied migration", {{"version", fmt::format("{:04d}", m.version)},
                                        {"name", std::string(m.name)}, {"schema", schema}});
        result.applied.push_back(m.version);
        result.version = m.version;
    }
    return result;
}

}  // namespace

std::optional<int> read_schema_version(pqxx::connection& conn, const std::string& schema) {
    const query_book q(schema);
    pqxx::nontransaction tx(conn);
    const auto table = fmt::format("{}.schema_migrations", quote_ident(schema));
    if (!tx.exec_params1(q.sql("schema_installed"), table)[0].as<bool>()) return std::nullopt;
    return tx.exec1(q.sql("schema_version"))[0].as<int>();
}

migrate_result migrate(pqxx::connection& conn, const std::string& schema) {
    const query_book q(schema);
    {
        pqxx::nontransaction tx(conn);
        tx.exec_params(q.sql("migration_lock"), schema);
    }
    try {
        auto result = migrate_locked(conn, q, schema);
        pqxx::nontransaction tx(conn);
        tx.exec_params(q.sql("migration_unlock"), schema);
        return result;
    } catch (...) {
        // The session lock also goes away with the connection; unlock anyway
        // so a caller that keeps the connection does not block others.
        try {
            pqxx::nontransaction tx(conn);
            tx.exec_params(q.sql("migration_unlock"), schema);
        } catch (...) {
        }
        throw;
    }
}

}  // namespace outboxd::pg
