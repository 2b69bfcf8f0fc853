#include "core/integer.hpp"

#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

#include "core/toml_text.hpp"

namespace outboxd {

std::int64_t parse_integer(std::string_view text, std::int64_t lo, std::int64_t hi) {
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || v < lo || v > hi) {
        throw std::invalid_argument(
            fmt::format("expected an integer from {} to {}, got {}", lo, hi, toml_quoted(text)));
    }
    return v;
}

}  // namespace outboxd
