#pragma once
// When a failed delivery is tried again. Pure: the random source is passed in.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace outboxd {

struct retry_policy {
    // Defaults: 5 s doubling to a 6 h cap; the 19 waits between 20 attempts
    // add up to about 2 days (less up to 20 % jitter) before an event is
    // dead-lettered — the same order as the Standard Webhooks schedule.
    std::chrono::milliseconds base{5'000};
    std::chrono::milliseconds cap{21'600'000};
    int max_attempts = 20;
    // Each delay is drawn uniformly from [d * (1 - jitter), d]: retries of
    // events that failed together spread out instead of arriving together.
    double jitter = 0.2;

    // Delay before the attempt after `attempt` (1-based: the first failure is
    // attempt 1). `unit_random` is in [0, 1).
    [[nodiscard]] std::chrono::milliseconds backoff(int attempt, double unit_random) const noexcept;

    [[nodiscard]] bool exhausted(int attempt) const noexcept { return attempt >= max_attempts; }
};

// Parses Retry-After (RFC 9110: delay-seconds or an HTTP-date) into a delay
// from `now`. nullopt when absent or unparseable; a date in the past gives 0.
[[nodiscard]] std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now);

}  // namespace outboxd
