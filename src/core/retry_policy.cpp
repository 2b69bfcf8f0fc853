#include "core/retry_policy.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <stdexcept>
#include <string>

namespace outboxd {

std::chrono::milliseconds retry_policy::backoff(int attempt, double unit_random) const noexcept {
    const int exponent = std::clamp(attempt, 1, 41) - 1;  // no overflow for any int
    const double uncapped = static_cast<double>(base.count()) * std::ldexp(1.0, exponent);
    const double full = std::min(uncapped, static_cast<double>(cap.count()));
    const double r = std::clamp(unit_random, 0.0, 1.0);
    const double drawn = full * (1.0 - std::clamp(jitter, 0.0, 1.0) * r);
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(drawn)));
}

bool retry_policy::is_permanent(unsigned status) const noexcept {
    return std::find(permanent_statuses.begin(), permanent_statuses.end(), status) != permanent_statuses.end();
}

bool retry_policy::is_throttle(unsigned status) const noexcept {
    return std::find(throttle_statuses.begin(), throttle_statuses.end(), status) != throttle_statuses.end();
}

std::vector<unsigned> parse_status_list(std::string_view text) {
    std::vector<unsigned> out;
    if (text.empty()) return out;
    for (;;) {
        const auto comma = text.find(',');
        auto item = text.substr(0, comma);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        unsigned status = 0;
        auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), status);
        if (item.empty() || ec != std::errc{} || end != item.data() + item.size() || status < 100 || status > 599) {
            throw std::invalid_argument("expected comma-separated HTTP statuses from 100 to 599, got '" +
                                        std::string(item) + "'");
        }
        if (status >= 200 && status < 300) {
            throw std::invalid_argument("2xx means delivered and cannot be listed: '" + std::string(item) + "'");
        }
        out.push_back(status);
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
    }
    return out;
}

std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view value,
                                                           std::chrono::system_clock::time_point now) {
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
    if (value.empty()) return std::nullopt;

    if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        // A day is the most we take from a peer; larger values (even ones
        // too large for 64 bits) are clamped.
        std::int64_t seconds = 0;
        auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
        if (ec == std::errc::result_out_of_range || seconds > 86'400) seconds = 86'400;
        else if (ec != std::errc{} || end != value.data() + value.size()) return std::nullopt;
        return std::chrono::milliseconds(seconds * 1000);
    }

    // IMF-fixdate, e.g. "Sun, 06 Nov 1994 08:49:37 GMT" (the only form senders
    // must produce; the obsolete forms are not worth the code).
    std::tm tm{};
    const std::string text(value);
    const char* end = strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (end == nullptr || *end != '\0') return std::nullopt;
    const std::time_t when = timegm(&tm);
    if (when == static_cast<std::time_t>(-1)) return std::nullopt;
    const auto target = std::chrono::system_clock::from_time_t(when);
    const auto delta = std::chrono::duration_cast<std::chrono::milliseconds>(target - now);
    return std::clamp(delta, std::chrono::milliseconds(0), std::chrono::milliseconds(86'400'000));
}

}  // namespace outboxd
