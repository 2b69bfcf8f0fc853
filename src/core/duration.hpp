#pragma once
// Human durations for flags and config: "250ms", "30s", "5m", "1h".

#include <chrono>
#include <string>
#include <string_view>

namespace outboxd {

// Throws std::invalid_argument naming the expected form. A unit is required:
// a bare "30" is ambiguous (seconds? milliseconds?) and refused.
[[nodiscard]] std::chrono::milliseconds parse_duration(std::string_view text);

// The shortest exact form: 1500ms -> "1500ms", 30000ms -> "30s", 300000ms -> "5m".
[[nodiscard]] std::string format_duration(std::chrono::milliseconds d);

}  // namespace outboxd
