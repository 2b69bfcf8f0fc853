#include "core/sql_ident.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "core/text.hpp"

namespace outboxd {

void validate_schema_name(std::string_view name) {
    if (name.empty()) throw std::invalid_argument("schema name is empty");
    if (name.size() > max_schema_name_bytes) {
        throw std::invalid_argument(fmt::format(
            "schema name is {} bytes long; at most {} are allowed", name.size(), max_schema_name_bytes));
    }
    for (const char ch : name) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == 0x7F) {
            throw std::invalid_argument("schema name contains a control character");
        }
    }
    if (!is_valid_utf8(name)) throw std::invalid_argument("schema name is not valid UTF-8");
    if (name.starts_with("pg_")) {
        throw std::invalid_argument("schema names starting with pg_ are reserved by PostgreSQL");
    }
}

std::string quote_ident(std::string_view name) {
    std::string out;
    out.reserve(name.size() + 2);
    out.push_back('"');
    for (const char c : name) {
        if (c == '"') out.push_back('"');
        out.push_back(c);
    }
    out.push_back('"');
    return out;
}

std::string quote_literal(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 2);
    out.push_back('\'');
    for (const char c : text) {
        if (c == '\'') out.push_back('\'');
        out.push_back(c);
    }
    out.push_back('\'');
    return out;
}

std::string render_sql(std::string_view sql_template, std::string_view schema) {
    static constexpr std::string_view placeholder = ":\"schema\"";
    const std::string quoted = quote_ident(schema);
    std::string out;
    out.reserve(sql_template.size() + 256);
    std::size_t pos = 0;
    for (;;) {
        const auto hit = sql_template.find(placeholder, pos);
        if (hit == std::string_view::npos) break;
        out.append(sql_template.substr(pos, hit - pos));
        out.append(quoted);
        pos = hit + placeholder.size();
    }
    out.append(sql_template.substr(pos));
    return out;
}

std::string notify_channel(std::string_view schema) { return fmt::format("outboxd.{}", schema); }

}  // namespace outboxd
