#include "pg/named_queries.hpp"

#include "core/embedded_sql.hpp"
#include "core/sql_ident.hpp"

namespace outboxd::pg {

query_book::query_book(std::string_view schema) {
    for (const auto& q : embedded::queries()) rendered_.push_back(render_sql(q.sql, schema));
}

}  // namespace outboxd::pg
