#pragma once
// PostgreSQL connection strings, in both forms libpq takes:
// URIs (postgresql://user:secret@host/db?x=y) and key=value lists.

#include <chrono>
#include <optional>
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

// The settings outboxd adds to every connection string, each unless the
// string already has it: application_name, connect_timeout, and TCP
// keepalives plus tcp_user_timeout so a database that went silent (network
// partition, failover to another address) is given up after about
// `keepalive_timeout` instead of when TCP gives up (~15 minutes, or never on
// an idle connection). Whole seconds, at least 1, where libpq wants seconds.
[[nodiscard]] std::string with_connection_defaults(std::string_view dsn, std::chrono::milliseconds connect_timeout,
                                                   std::chrono::milliseconds keepalive_timeout);

[[nodiscard]] bool is_uri_dsn(std::string_view dsn) noexcept;

// The password itself, as written in the connection string, if it has one.
[[nodiscard]] std::optional<std::string> password_of(std::string_view dsn);

}  // namespace outboxd
