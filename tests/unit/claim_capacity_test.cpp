#include "core/claim_capacity.hpp"

#include <doctest/doctest.h>

using outboxd::capacity_for;
using namespace std::chrono_literals;

TEST_CASE("claim_capacity: nothing ahead before anything was delivered, or without slack") {
    const auto c = capacity_for(32, 0.0, 15s, 1024);
    CHECK(c.slots == 32);
    CHECK(c.batch == 1);  // any free slot claims, as without claiming ahead
    CHECK(capacity_for(32, 50'000.0, 0ms, 1024).slots == 32);
    CHECK(capacity_for(32, -5.0, 15s, 1024).slots == 32);
}

TEST_CASE("claim_capacity: as many ahead as start within a quarter of the slack") {
    // 40 per second, 500 ms of slack: 40 * 0.5 / 4 = 5 ahead.
    const auto c = capacity_for(2, 40.0, 500ms, 1024);
    CHECK(c.slots == 7);
    CHECK(c.batch == 3);  // half the slots, never more than what is held ahead
    const auto d = capacity_for(8, 16.0, 1s, 1024);  // 4 ahead
    CHECK(d.slots == 12);
    CHECK(d.batch == 4);
}

TEST_CASE("claim_capacity: a fast destination gets at most 7 ahead per slot, within the largest claim") {
    const auto c = capacity_for(32, 20'000.0, 15s, 1024);
    CHECK(c.slots == 256);
    CHECK(c.batch == 128);
    CHECK(capacity_for(200, 1e12, 15s, 1024).slots == 1024);
    CHECK(capacity_for(1024, 1e12, 15s, 1024).slots == 1024);  // no room ahead at all
    CHECK(capacity_for(1024, 1e12, 15s, 1024).batch == 1);
}

TEST_CASE("claim_capacity: the batch never exceeds what is held ahead, so slots never run dry") {
    for (std::size_t concurrency : {1U, 2U, 5U, 32U, 100U}) {
        for (double rate : {0.0, 1.0, 10.0, 100.0, 1'000.0, 1e6}) {
            CAPTURE(concurrency);
            CAPTURE(rate);
            const auto c = capacity_for(concurrency, rate, 2s, 1024);
            CHECK(c.slots >= concurrency);
            CHECK(c.batch >= 1);
            CHECK((c.batch == 1 || c.slots - c.batch >= concurrency));
        }
    }
    CHECK(capacity_for(0, 0.0, 1s, 1024).slots == 1);  // concurrency 0 is treated as 1
}
