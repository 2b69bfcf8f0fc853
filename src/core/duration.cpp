#include "core/duration.hpp"

#include <charconv>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace outboxd {

std::chrono::milliseconds parse_duration(std::string_view text) {
    auto bad = [&] {
        return std::invalid_argument(fmt::format(
            "invalid duration '{}': expected a whole number with a unit, like 250ms, 30s, 5m or 1h", text));
    };
    std::int64_t value = 0;
    const auto* begin = text.data();
    const auto* end = text.data() + text.size();
    auto [rest, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc{} || rest == begin || value < 0) throw bad();
    const std::string_view unit(rest, static_cast<std::size_t>(end - rest));
    std::int64_t scale = 0;
    if (unit == "ms") scale = 1;
    else if (unit == "s") scale = 1'000;
    else if (unit == "m") scale = 60'000;
    else if (unit == "h") scale = 3'600'000;
    else throw bad();
    if (value > std::numeric_limits<std::int64_t>::max() / scale) throw bad();
    return std::chrono::milliseconds(value * scale);
}

std::string format_duration(std::chrono::milliseconds d) {
    const auto ms = d.count();
    if (ms != 0 && ms % 3'600'000 == 0) return fmt::format("{}h", ms / 3'600'000);
    if (ms != 0 && ms % 60'000 == 0) return fmt::format("{}m", ms / 60'000);
    if (ms != 0 && ms % 1'000 == 0) return fmt::format("{}s", ms / 1'000);
    return fmt::format("{}ms", ms);
}

}  // namespace outboxd
