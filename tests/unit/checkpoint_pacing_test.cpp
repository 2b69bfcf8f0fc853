// core/checkpoint_pacing: window cursor checkpoints come further apart while
// a transaction runs long.
#include <doctest/doctest.h>

#include <string>

#include "core/checkpoint_pacing.hpp"

using namespace outboxd;
using namespace std::chrono_literals;

namespace {

using time_point = checkpoint_pacing::time;

// Asks once a second from `from` to `until` (as the engine's timer does),
// writing whenever due; returns how many were written.
int written_between(checkpoint_pacing& p, time_point from, time_point until, const auto& snapshot_at) {
    int n = 0;
    for (auto t = from; t < until; t += 1s) {
        if (p.due(snapshot_at(t), t)) {
            p.written(t);
            ++n;
        }
    }
    return n;
}

}  // namespace

TEST_CASE("checkpoint pacing: once a second while nothing runs long") {
    checkpoint_pacing p;
    const time_point t0{};
    // xmin moves on at every checkpoint, or nothing runs (xmin = xmax).
    int xid = 100;
    CHECK(written_between(p, t0, t0 + 60s, [&](time_point) {
              xid += 7;
              return std::to_string(xid) + ":" + std::to_string(xid + 5) + ":" + std::to_string(xid);
          }) == 60);
    CHECK(written_between(p, t0 + 60s, t0 + 120s, [](time_point) { return std::string("500:500:"); }) == 60);
    CHECK(p.current_interval(t0 + 120s) == 1s);
}

TEST_CASE("checkpoint pacing: a transaction running long spreads them out with its age, and they come back at once") {
    checkpoint_pacing p;
    const time_point t0{};
    const auto held = [](time_point) { return std::string("100:400:100,250"); };
    // The first 30 s: still once a second (held / 30 < 1 s).
    CHECK(written_between(p, t0, t0 + 30s, held) == 30);
    CHECK(p.current_interval(t0 + 90s) == 3s);
    CHECK(p.current_interval(t0 + 600s) == 20s);
    CHECK(p.current_interval(t0 + 3600s) == 60s);  // at most a minute apart
    // Five minutes in all: about 30 + 30 ln(10) = 99, not 300.
    const int five_minutes = 30 + written_between(p, t0 + 30s, t0 + 300s, held);
    CHECK(five_minutes >= 90);
    CHECK(five_minutes <= 110);
    // An hour: under 200, not 3,600.
    const int hour = five_minutes + written_between(p, t0 + 300s, t0 + 3600s, held);
    CHECK(hour < 200);
    // It ends (xmin moves on): the next ask writes, and once a second again.
    CHECK(p.due("400:420:405", t0 + 3601s));
    p.written(t0 + 3601s);
    CHECK(p.due("410:430:", t0 + 3602s));
    CHECK(p.current_interval(t0 + 3602s) == 1s);
}

TEST_CASE("checkpoint pacing: the first checkpoint is never held back, and a new long one starts from its own age") {
    checkpoint_pacing p;
    const time_point t0 = time_point{} + 10000s;
    CHECK(p.due("100:400:100", t0));  // nothing written yet
    p.written(t0);
    // Another transaction holds xmin from t0 + 5 s: its age counts from then.
    CHECK(p.due("200:500:200", t0 + 5s));
    p.written(t0 + 5s);
    CHECK(p.current_interval(t0 + 65s) == 2s);
}
