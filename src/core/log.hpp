#pragma once
// Structured logs: one record per line on stderr, in one of two formats:
//   logfmt  ts=2026-11-29T22:18:12.345Z level=info msg="relay started" schema=outbox
//   json    {"ts":"2026-11-29T22:18:12.345Z","level":"info","msg":"relay started","schema":"outbox"}
// Both carry the same keys in the same order, every value a string.
// Thread-safe. Callers pass values already free of secrets (see dsn.hpp);
// never_show() is the net under that rule.

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace outboxd::log {

enum class level { debug = 0, info = 1, warn = 2, error = 3 };
enum class format { logfmt = 0, json = 1 };

// Throws std::invalid_argument for anything but debug|info|warn|error.
[[nodiscard]] level parse_level(std::string_view name);
void set_level(level l) noexcept;
[[nodiscard]] bool enabled(level l) noexcept;

// Throws std::invalid_argument for anything but logfmt|json.
[[nodiscard]] format parse_format(std::string_view name);
void set_format(format f) noexcept;
[[nodiscard]] format current_format() noexcept;

using fields = std::vector<std::pair<std::string_view, std::string>>;

// Text no record may hold (the database password, signing secrets,
// configured header values): from now on write() replaces it with
// "<redacted>" in the message and every value, whatever a caller passed.
// Replaces the previous list; texts under 4 bytes are ignored.
void never_show(std::vector<std::string> secrets);

// One record as written, newline included; `write` adds nothing else.
[[nodiscard]] std::string render(format f, std::chrono::system_clock::time_point when, level l,
                                 std::string_view message, const fields& kv);

void write(level l, std::string_view message, const fields& kv = {});

inline void debug(std::string_view m, const fields& kv = {}) { if (enabled(level::debug)) write(level::debug, m, kv); }
inline void info(std::string_view m, const fields& kv = {}) { if (enabled(level::info)) write(level::info, m, kv); }
inline void warn(std::string_view m, const fields& kv = {}) { if (enabled(level::warn)) write(level::warn, m, kv); }
inline void error(std::string_view m, const fields& kv = {}) { if (enabled(level::error)) write(level::error, m, kv); }

}  // namespace outboxd::log
