#include "core/checkpoint_pacing.hpp"

#include <algorithm>

namespace outboxd {

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
