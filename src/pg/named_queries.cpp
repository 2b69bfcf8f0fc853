#include "pg/named_queries.hpp"

#include <sstream>

#include "core/embedded_sql.hpp"
#include "core/sql_ident.hpp"

namespace outboxd::pg {

query_book::query_book(std::string_view schema) {
    for (const auto& q : embedded::queries()) rendered_.push_back(render_sql(q.sql, schema));
}

std::string query_book::without_comments(std::string_view statement) {
    std::string out;
    std::istringstream lines{std::string(statement)};
    for (std::string line; std::getline(lines, line);) {
        if (!line.starts_with("--")) out += (out.empty() ? "" : "\n") + line;
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (!out.ends_with(';')) out += ';';
    return out;
}

}  // namespace outboxd::pg
