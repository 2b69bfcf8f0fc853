#pragma once
// Simulated time for the relay engine's tests: it moves only when a test
// advances it.

#include <chrono>

#include "core/clock.hpp"

namespace outboxd::testing {

class fake_clock final : public clock_source {
public:
    [[nodiscard]] std::chrono::steady_clock::time_point steady() const override { return now; }
    // An arbitrary date in 2026, moving with the steady clock.
    [[nodiscard]] std::chrono::system_clock::time_point wall() const override {
        return std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 56)) +
               (now - std::chrono::steady_clock::time_point{});
    }
    void advance(std::chrono::milliseconds d) { now += d; }
    std::chrono::steady_clock::time_point now{std::chrono::hours(1)};
};

}  // namespace outboxd::testing
