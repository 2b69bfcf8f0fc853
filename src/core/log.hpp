#pragma once
// Structured logs: one logfmt line per record on stderr,
//   ts=2026-11-29T22:18:12.345Z level=info msg="relay started" schema=outbox
// Thread-safe. Callers pass values already free of secrets (see dsn.hpp).

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace outboxd::log {

enum class level { debug = 0, info = 1, warn = 2, error = 3 };

// Throws std::invalid_argument for anything but debug|info|warn|error.
[[nodiscard]] level parse_level(std::string_view name);
void set_level(level l) noexcept;
[[nodiscard]] bool enabled(level l) noexcept;

using fields = std::vector<std::pair<std::string_view, std::string>>;

void write(level l, std::string_view message, const fields& kv = {});

inline void debug(std::string_view m, const fields& kv = {}) { if (enabled(level::debug)) write(level::debug, m, kv); }
inline void info(std::string_view m, const fields& kv = {}) { if (enabled(level::info)) write(level::info, m, kv); }
inline void warn(std::string_view m, const fields& kv = {}) { if (enabled(level::warn)) write(level::warn, m, kv); }
inline void error(std::string_view m, const fields& kv = {}) { if (enabled(level::error)) write(level::error, m, kv); }

}  // namespace outboxd::log
