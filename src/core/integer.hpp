#pragma once
// Integers from text (flags, environment variables): one parser and one
// message for every command and setting.

#include <cstdint>
#include <string_view>

namespace outboxd {

// The whole of `text` as a decimal integer from lo to hi. Throws
// std::invalid_argument: expected an integer from 1 to 1024, got "x".
[[nodiscard]] std::int64_t parse_integer(std::string_view text, std::int64_t lo, std::int64_t hi);

}  // namespace outboxd
