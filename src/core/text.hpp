#pragma once
// Text from the outside world (response bodies, error strings) on its way
// into PostgreSQL text columns and logs.

#include <cstddef>
#include <string>
#include <string_view>

namespace outboxd {

[[nodiscard]] bool is_valid_utf8(std::string_view s) noexcept;

// At most `max_bytes` bytes of valid UTF-8 without NUL: invalid sequences and
// NUL become U+FFFD, and a cut never splits a character. PostgreSQL rejects
// both in text, and a rejected error message would keep the outcome of a
// delivery from being recorded at all.
[[nodiscard]] std::string sanitize_text(std::string_view s, std::size_t max_bytes);

// A multi-line message (libpq's "...failed: Connection refused\n\tIs the
// server running...") as one line: every run of whitespace that holds a
// line break becomes one space; leading and trailing whitespace goes.
[[nodiscard]] std::string one_line(std::string_view s);

// The primary message of a PostgreSQL error as libpq words it: the first
// line without its "ERROR:  " severity, not the CONTEXT lines after it
// (they quote whole statements).
[[nodiscard]] std::string primary_message(std::string_view server_error);

}  // namespace outboxd
