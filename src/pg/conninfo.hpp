#pragma once
// Checks a connection string the way libpq will read it, before connecting,
// so a malformed one is reported as a configuration error, not an outage.

#include <optional>
#include <string>

namespace outboxd::pg {

// nullopt when libpq accepts the string; otherwise libpq's complaint,
// already scrubbed of any password.
[[nodiscard]] std::optional<std::string> conninfo_error(const std::string& dsn);

}  // namespace outboxd::pg
