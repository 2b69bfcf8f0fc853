#pragma once
// When a failed delivery is tried again. Pure: the random source is passed in.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

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
    // Statuses that can never succeed: dead-lettered at once.
    std::vector<unsigned> permanent_statuses{410};
    // Statuses that mean "not now": their Retry-After replaces the backoff.
    std::vector<unsigned> throttle_statuses{429, 502, 503, 504};

    // Delay before the attempt after `attempt` (1-based: the first failure is
    // attempt 1). `unit_random` is in [0, 1).
    [[nodiscard]] std::chrono::milliseconds backoff(int attempt, double unit_random) const noexcept;

    [[nodiscard]] bool exhausted(int attempt) const noexcept { return attempt >= max_attempts; }
    [[nodiscard]] bool is_permanent(unsigned status) const noexcept;
    [[nodiscard]] bool is_throttle(unsigned status) const noexcept;
};

// Parses a comma-separated list of HTTP statuses ("410,422"); an empty
// string is an empty list. Throws std::invalid_argument naming the bad item.
[[nodiscard]] std::vector<unsigned> parse_status_list(std::string_view text);

// Parses Retry-After (RFC 9110: delay-seconds or an HTTP-date) into a delay
// from `now`. nullopt when absent or unparseable; a date in the past gives 0.
[[nodiscard]] std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now);

}  // namespace outboxd
