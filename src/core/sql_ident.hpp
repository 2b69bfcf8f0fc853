#pragma once
// Schema names are chosen by users and end up in SQL text (DDL cannot take
// parameters), so they are validated and always quoted here, in one place.

#include <string>
#include <string_view>

namespace outboxd {

// The longest schema name we accept, in bytes: the notification channel is
// "outboxd." + schema and PostgreSQL truncates identifiers at 63 bytes.
inline constexpr std::size_t max_schema_name_bytes = 55;

// Throws std::invalid_argument when the name is empty, too long, contains NUL
// or control characters, or is not valid UTF-8. Anything else, quotes and
// spaces included, is a legal (quoted) PostgreSQL identifier.
void validate_schema_name(std::string_view name);

// "name" with embedded double quotes doubled.
[[nodiscard]] std::string quote_ident(std::string_view name);

// 'text' with embedded single quotes doubled (standard_conforming_strings).
[[nodiscard]] std::string quote_literal(std::string_view text);

// Replaces every :"schema" placeholder with the quoted schema name.
[[nodiscard]] std::string render_sql(std::string_view sql_template, std::string_view schema);

// The LISTEN/NOTIFY channel of an outbox schema (must match the trigger).
[[nodiscard]] std::string notify_channel(std::string_view schema);

}  // namespace outboxd
