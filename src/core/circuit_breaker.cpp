#include "core/circuit_breaker.hpp"

#include <algorithm>

namespace outboxd {

answer_health health_of(bool transport_error, unsigned status) noexcept {
    if (transport_error) return answer_health::failing;
    if (status == 408 || status == 429 || status >= 500) return answer_health::failing;
    return answer_health::healthy;
}

circuit_state circuit_breaker::state(time_point now) const noexcept {
    if (!open_) return circuit_state::closed;
    return now >= probe_at_ ? circuit_state::probing : circuit_state::open;
}

std::optional<circuit_breaker::time_point> circuit_breaker::probe_at() const noexcept {
    if (!open_) return std::nullopt;
    return probe_at_;
}

bool circuit_breaker::allows_request(time_point now) noexcept {
    switch (state(now)) {
        case circuit_state::closed:
            return true;
        case circuit_state::open:
            return false;
        case circuit_state::probing:
            return probes_out_ == 0;
    }
    return false;
}

void circuit_breaker::on_request() noexcept {
    if (open_) ++probes_out_;
}

bool circuit_breaker::on_answer(answer_health h, time_point now) noexcept {
    if (open_ && probes_out_ > 0) --probes_out_;
    if (h == answer_health::healthy) {
        failures_ = 0;
        if (!open_) return false;
        open_ = false;
        interval_ = std::chrono::milliseconds(0);
        return true;
    }
    ++failures_;
    if (open_) {
        // A probe failed (or a request sent before the circuit opened
        // answered late): wait longer before the next one.
        if (now >= probe_at_) open(now);
        return false;
    }
    if (settings_.failures_to_open > 0 && failures_ >= settings_.failures_to_open) open(now);
    return false;
}

void circuit_breaker::open(time_point now) noexcept {
    open_ = true;
    interval_ = interval_.count() == 0 ? settings_.first_probe : std::min(interval_ * 2, settings_.longest_probe);
    probe_at_ = now + interval_;
}

}  // namespace outboxd
