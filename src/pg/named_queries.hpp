#pragma once
// The runtime statements of src/pg/queries.sql, rendered for one schema.
// The one place SQL text comes from at run time.

#include <string>
#include <string_view>
#include <vector>

namespace pqxx { class connection_base; }

namespace outboxd::pg {

class query_book {
public:
    explicit query_book(std::string_view schema);

    // Throws std::logic_error for an unknown name (a bug, not an input error).
    [[nodiscard]] const std::string& sql(std::string_view name) const;

    // Declares the named single statements as prepared statements on `conn`
    // (libpqxx prepares them on first use, under their own names, so server
    // logs and errors name them too).
    void prepare(pqxx::connection_base& conn, std::initializer_list<std::string_view> names) const;

private:
    std::vector<std::pair<std::string, std::string>> rendered_;
};

}  // namespace outboxd::pg
