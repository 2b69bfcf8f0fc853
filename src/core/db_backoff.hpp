#pragma once
// Backoff for our own database trouble (a claim, an outcome write or the
// LISTEN connection failing): quick first retry, then patient, never
// hammering a recovering server. Pure.

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace outboxd {

class db_backoff {
public:
    static constexpr std::chrono::milliseconds first{100};
    static constexpr std::chrono::milliseconds most{5'000};

    // The delay before the next try: 100 ms, doubling to 5 s.
    [[nodiscard]] std::chrono::milliseconds next() noexcept {
        delay_ = delay_.count() == 0 ? first : std::min(delay_ * 2, most);
        return delay_;
    }
    void reset() noexcept { delay_ = std::chrono::milliseconds(0); }

private:
    std::chrono::milliseconds delay_{0};
};

// Between half the delay and all of it: many relays reconnecting after one
// database restart spread out. `random`: any 32-bit random number.
[[nodiscard]] constexpr std::chrono::milliseconds jittered(std::chrono::milliseconds delay,
                                                           std::uint32_t random) noexcept {
    return delay / 2 + std::chrono::milliseconds(random % (delay.count() / 2 + 1));
}

}  // namespace outboxd
