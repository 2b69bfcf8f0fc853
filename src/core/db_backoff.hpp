#pragma once
// Backoff for our own database trouble (a claim, an outcome write or the
// LISTEN connection failing): quick first retry, then patient, never
// hammering a recovering server. Pure.

#include <algorithm>
#include <chrono>

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

}  // namespace outboxd
