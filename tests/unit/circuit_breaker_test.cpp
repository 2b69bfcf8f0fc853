#include "core/circuit_breaker.hpp"

#include <doctest/doctest.h>

using namespace outboxd;
using namespace std::chrono_literals;

namespace {
const circuit_breaker::time_point t0{std::chrono::hours(1)};
}

TEST_CASE("circuit breaker: what an answer says of the destination") {
    CHECK(health_of(true, 0) == answer_health::failing);
    CHECK(health_of(false, 200) == answer_health::healthy);
    CHECK(health_of(false, 400) == answer_health::healthy);  // the event's problem
    CHECK(health_of(false, 410) == answer_health::healthy);
    CHECK(health_of(false, 408) == answer_health::failing);
    CHECK(health_of(false, 429) == answer_health::failing);
    CHECK(health_of(false, 500) == answer_health::failing);
    CHECK(health_of(false, 503) == answer_health::failing);
}

TEST_CASE("circuit breaker: consecutive failures open it; a per-event answer resets the count") {
    circuit_breaker c({3, 500ms, 5s});
    CHECK(c.state(t0) == circuit_state::closed);
    c.on_answer(answer_health::failing, t0);
    c.on_answer(answer_health::failing, t0);
    c.on_answer(answer_health::healthy, t0);  // a 400: the destination is up
    c.on_answer(answer_health::failing, t0);
    c.on_answer(answer_health::failing, t0);
    CHECK(c.state(t0) == circuit_state::closed);
    CHECK(c.allows_request(t0));
    c.on_answer(answer_health::failing, t0);
    CHECK(c.state(t0) == circuit_state::open);
    CHECK_FALSE(c.allows_request(t0));
    CHECK(c.probe_at() == t0 + 500ms);
}

TEST_CASE("circuit breaker: one probe at a time; failed probes wait longer, up to the cap; success closes") {
    circuit_breaker c({1, 500ms, 2s});
    c.on_answer(answer_health::failing, t0);
    auto now = t0 + 500ms;
    CHECK(c.state(now) == circuit_state::probing);
    CHECK(c.allows_request(now));
    c.on_request();
    CHECK_FALSE(c.allows_request(now));  // the one probe is out
    CHECK_FALSE(c.on_answer(answer_health::failing, now));
    CHECK(c.probe_at() == now + 1s);
    now += 1s;
    c.on_request();
    c.on_answer(answer_health::failing, now);
    CHECK(c.probe_at() == now + 2s);
    now += 2s;
    c.on_request();
    c.on_answer(answer_health::failing, now);
    CHECK(c.probe_at() == now + 2s);  // capped
    now += 2s;
    c.on_request();
    CHECK(c.on_answer(answer_health::healthy, now));
    CHECK(c.state(now) == circuit_state::closed);
    // Opened again later, it starts over from the first probe interval.
    c.on_answer(answer_health::failing, now);
    CHECK(c.probe_at() == now + 500ms);
}

TEST_CASE("circuit breaker: failures_to_open = 0 never opens") {
    circuit_breaker c({0, 500ms, 5s});
    for (int i = 0; i < 100; ++i) c.on_answer(answer_health::failing, t0);
    CHECK(c.state(t0) == circuit_state::closed);
}
