#pragma once
// The runtime statements of src/pg/queries.sql, rendered for one schema.
// The one place SQL text comes from at run time; each statement is named by
// its descriptor in pg/queries.hpp (q::complete, q::status, ...).

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <pqxx/connection_base>

#include "pg/queries.hpp"

namespace outboxd::pg {

class query_book {
public:
    explicit query_book(std::string_view schema);

    // Q's text for this schema. Statements with placeholders (the claims)
    // are rendered by their own Q::text(schema, fills) instead.
    template <typename Q>
        requires(!requires { typename Q::fills; })
    [[nodiscard]] const std::string& sql() const {
        return rendered_[Q::source];
    }

    // Q's text as an operator would type it: without its comment lines,
    // ending in ';' (the statements `outboxd wake-setup` and `consume-setup`
    // run and print).
    template <typename Q>
        requires(!requires { typename Q::fills; })
    [[nodiscard]] std::string bare_sql() const {
        return without_comments(sql<Q>());
    }

    // Declares the statements as prepared statements on `conn` (libpqxx
    // prepares them on first use, under their own names, so server logs and
    // errors name them too).
    template <typename... Q>
    void prepare(pqxx::connection_base& conn) const {
        (conn.prepare(std::string(Q::name), sql<Q>()), ...);
    }

private:
    [[nodiscard]] static std::string without_comments(std::string_view statement);

    std::vector<std::string> rendered_;  // by position in queries.sql
};

// A list of statements, for declaring which ones a session prepares.
template <typename... Q>
struct query_list {
    template <typename T>
    static constexpr bool contains = (std::is_same_v<T, Q> || ...);
    static void prepare(const query_book& book, pqxx::connection_base& conn) { book.prepare<Q...>(conn); }
};

}  // namespace outboxd::pg
