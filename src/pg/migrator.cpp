#include "pg/migrator.hpp"

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/embedded_sql.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/sql_ident.hpp"
#include "pg/named_queries.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {
namespace {

migrate_result migrate_locked(pqxx::connection& conn, const query_book& book, const std::string& schema) {
    {
        pqxx::work tx(conn);
        (void)exec<q::bootstrap>(tx, book);
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
        (void)exec_params(tx, book, q::record_migration::args{.version = m.version, .migration = std::string(m.name)});
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
    const query_book book(schema);
    pqxx::nontransaction tx(conn);
    const auto table = fmt::format("{}.schema_migrations", quote_ident(schema));
    const auto installed =
        exec_params(tx, book, q::schema_installed::args{.migrations_table = table});
    if (!installed.one()[q::schema_installed::col::installed].as<bool>()) return std::nullopt;
    return exec<q::schema_version>(tx, book).one()[q::schema_version::col::version].as<int>();
}

migrate_result migrate(pqxx::connection& conn, const std::string& schema) {
    const query_book book(schema);
    {
        pqxx::nontransaction tx(conn);
        (void)exec_params(tx, book, q::migration_lock::args{.schema = schema});
    }
    try {
        auto result = migrate_locked(conn, book, schema);
        pqxx::nontransaction tx(conn);
        (void)exec_params(tx, book, q::migration_unlock::args{.schema = schema});
        return result;
    } catch (...) {
        // The session lock also goes away with the connection; unlock anyway
        // so a caller that keeps the connection does not block others.
        try {
            pqxx::nontransaction tx(conn);
            (void)exec_params(tx, book, q::migration_unlock::args{.schema = schema});
        } catch (...) {
        }
        throw;
    }
}

}  // namespace outboxd::pg
