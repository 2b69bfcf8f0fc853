#pragma once
// Where the relay engine reads the time: the steady clock for timers,
// leases and rates, the wall clock for webhook timestamps and Retry-After
// dates. Injected, so the engine's tests run on simulated time.

#include <chrono>

namespace outboxd {

// A time the database server's clock gave (a transaction's start, sent as
// microseconds since the epoch): compared only with the server's times.
using database_time = std::chrono::sys_time<std::chrono::microseconds>;

class clock_source {
public:
    virtual ~clock_source() = default;
    [[nodiscard]] virtual std::chrono::steady_clock::time_point steady() const = 0;
    [[nodiscard]] virtual std::chrono::system_clock::time_point wall() const = 0;
};

class system_clock_source final : public clock_source {
public:
    [[nodiscard]] std::chrono::steady_clock::time_point steady() const override {
        return std::chrono::steady_clock::now();
    }
    [[nodiscard]] std::chrono::system_clock::time_point wall() const override {
        return std::chrono::system_clock::now();
    }
};

}  // namespace outboxd
