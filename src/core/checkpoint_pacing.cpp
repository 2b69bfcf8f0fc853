#include "core/checkpoint_pacing.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace outboxd {

namespace {

std::uint64_t number(const std::string& s, std::size_t begin, std::size_t end) {
    std::uint64_t n = 0;
    const auto [ptr, ec] = std::from_chars(s.data() + begin, s.data() + end, n);
    if (begin == end || ec != std::errc() || ptr != s.data() + end) {
        throw std::invalid_argument("not a pg_snapshot: " + s);
    }
    return n;
}

}  // namespace

snapshot_bounds bounds_of(const std::string& snapshot) {
    const auto first = snapshot.find(':');
    const auto second = first == std::string::npos ? std::string::npos : snapshot.find(':', first + 1);
    if (second == std::string::npos) throw std::invalid_argument("not a pg_snapshot: " + snapshot);
    return {.xmin = number(snapshot, 0, first), .xmax = number(snapshot, first + 1, second)};
}

checkpoint_pacing::ms checkpoint_pacing::current_interval(time now) const noexcept {
    if (!held_xmin_) return interval;
    const auto held = std::chrono::duration_cast<ms>(now - held_since_);
    return std::clamp(held / age_divisor, interval, max_interval);
}

bool checkpoint_pacing::due(const std::string& snapshot, time now) {
    const auto b = bounds_of(snapshot);
    if (b.xmin >= b.xmax) {
        held_xmin_.reset();  // nothing was running
    } else if (held_xmin_ != b.xmin) {
        held_xmin_ = b.xmin;
        held_since_ = now;
    }
    if (!last_written_) return true;
    // A little slack: the timer that asks runs once an interval, and a
    // checkpoint written a moment late must not wait a whole interval more.
    return now - *last_written_ + interval / 10 >= current_interval(now);
}

}  // namespace outboxd
