#include "pg/named_queries.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <pqxx/connection_base>

#include "core/embedded_sql.hpp"
#include "core/sql_ident.hpp"

namespace outboxd::pg {

query_book::query_book(std::string_view schema) {
    for (const auto& q : embedded::queries()) {
        rendered_.emplace_back(std::string(q.name), render_sql(q.sql, schema));
    }
}

const std::string& query_book::sql(std::string_view name) const {
    for (const auto& [n, text] : rendered_) {
        if (n == name) return text;
    }
    throw std::logic_error(fmt::format("no query named '{}' in queries.sql", name));
}

void query_book::prepare(pqxx::connection_base& conn, std::initializer_list<std::string_view> names) const {
    for (const auto name : names) conn.prepare(std::string(name), sql(name));
}

}  // namespace outboxd::pg
