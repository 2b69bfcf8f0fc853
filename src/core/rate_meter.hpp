#pragma once
// Events per second, smoothed: an exponentially decaying count with time
// constant `tau` (a burst counts fully at once and fades over a few tau).
// Pure: the caller passes the time.

#include <chrono>

namespace outboxd {

class rate_meter {
public:
    using clock = std::chrono::steady_clock;

    explicit rate_meter(std::chrono::milliseconds tau = std::chrono::seconds(1)) noexcept;

    void record(clock::time_point now) noexcept;
    [[nodiscard]] double per_second(clock::time_point now) const noexcept;

private:
    double tau_s_;
    double rate_ = 0.0;  // per second, as of last_
    clock::time_point last_{};
};

}  // namespace outboxd
