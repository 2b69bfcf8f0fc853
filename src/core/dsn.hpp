#pragma once
// PostgreSQL connection strings, in both forms libpq takes:
// URIs (postgresql://user:secret@host/db?x=y) and key=value lists.

#include <string>
#include <string_view>

namespace outboxd {

// The connection string with any password replaced by "***", for logs and
// error messages. Unparseable input is not echoed at all.
[[nodiscard]] std::string redact_dsn(std::string_view dsn);

// Removes "password=..." style fragments from a message that libpq or the
// server produced while it may have quoted the connection string, and puts
// it on one line (libpq's messages span several).
[[nodiscard]] std::string scrub_secrets(std::string_view message, std::string_view dsn);

// Adds a setting unless the connection string already has it:
// with_default(dsn, "application_name", "outboxd").
[[nodiscard]] std::string with_default(std::string_view dsn, std::string_view key, std::string_view value);

[[nodiscard]] bool is_uri_dsn(std::string_view dsn) noexcept;

}  // namespace outboxd
