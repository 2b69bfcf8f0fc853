#include "core/claim_capacity.hpp"

#include <algorithm>

namespace outboxd {

claim_capacity capacity_for(std::size_t concurrency, double delivered_per_s, std::chrono::milliseconds slack,
                            std::size_t largest_claim) noexcept {
    concurrency = std::max<std::size_t>(1, concurrency);
    const double seconds = std::max(0.0, std::chrono::duration<double>(slack).count());
    const double can_start = std::max(0.0, delivered_per_s) * seconds / 4;
    // Compared as doubles first: a huge rate must not overflow the cast.
    const double cap = static_cast<double>(std::min(concurrency * most_ahead_per_slot,
                                                    largest_claim - std::min(largest_claim, concurrency)));
    const auto ahead = static_cast<std::size_t>(std::min(can_start, cap));
    const std::size_t slots = concurrency + ahead;
    return {slots, std::max<std::size_t>(1, std::min(slots / 2, ahead))};
}

}  // namespace outboxd
