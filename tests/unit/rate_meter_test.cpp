#include "core/rate_meter.hpp"

#include <doctest/doctest.h>

using outboxd::rate_meter;
using namespace std::chrono_literals;

TEST_CASE("rate_meter: zero before anything happens") {
    const rate_meter m;
    CHECK(m.per_second(rate_meter::clock::time_point{} + 5s) == 0.0);
}

TEST_CASE("rate_meter: a steady rate converges to that rate") {
    rate_meter m(1s);
    auto t = rate_meter::clock::time_point{} + 1h;
    for (int i = 0; i < 10'000; ++i) {  // 1,000 per second for 10 s (ten time constants)
        t += 1ms;
        m.record(t);
    }
    CHECK(m.per_second(t) == doctest::Approx(1000.0).epsilon(0.01));
}

TEST_CASE("rate_meter: fades when events stop, by e per time constant") {
    rate_meter m(1s);
    auto t = rate_meter::clock::time_point{} + 1h;
    for (int i = 0; i < 10'000; ++i) m.record(t += 1ms);
    const double before = m.per_second(t);
    CHECK(m.per_second(t + 1s) == doctest::Approx(before / 2.718281828).epsilon(0.001));
    CHECK(m.per_second(t + 20s) < 0.01);
}

TEST_CASE("rate_meter: a burst at one instant counts at once") {
    rate_meter m(500ms);
    const auto t = rate_meter::clock::time_point{} + 1h;
    for (int i = 0; i < 100; ++i) m.record(t);
    CHECK(m.per_second(t) == doctest::Approx(200.0));  // 100 / 0.5 s
}
