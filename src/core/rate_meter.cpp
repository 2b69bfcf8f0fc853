#include "core/rate_meter.hpp"

#include <cmath>

namespace outboxd {

rate_meter::rate_meter(std::chrono::milliseconds tau) noexcept
    : tau_s_(tau.count() > 0 ? static_cast<double>(tau.count()) / 1000.0 : 1.0) {}

double rate_meter::per_second(clock::time_point now) const noexcept {
    if (rate_ == 0.0 || now <= last_) return rate_;
    const double dt = std::chrono::duration<double>(now - last_).count();
    return rate_ * std::exp(-dt / tau_s_);
}

void rate_meter::record(clock::time_point now) noexcept {
    rate_ = per_second(now) + 1.0 / tau_s_;
    if (now > last_) last_ = now;
}

}  // namespace outboxd
