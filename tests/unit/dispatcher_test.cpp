#include "core/dispatcher.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>

using outboxd::dispatcher;

TEST_CASE("dispatcher: starts idle and claims nothing unprompted") {
    dispatcher d(4);
    CHECK(d.slots() == 4);
    CHECK(d.in_flight() == 0);
    CHECK_FALSE(d.claiming());
    CHECK_FALSE(d.stopping());
    CHECK_FALSE(d.drained());
    CHECK(d.on_outcomes_recorded(false) == 0);
    CHECK(d.on_delivery_finished() == 0);  // nothing in flight: stays at 0
    CHECK(d.in_flight() == 0);
    CHECK_FALSE(d.claiming());
}

TEST_CASE("dispatcher: slots == 0 is treated as 1") {
    dispatcher d(0);
    CHECK(d.slots() == 1);
    CHECK(d.on_wake() == 1);
    CHECK(d.on_claimed(1, 1) == 0);
    CHECK(d.in_flight() == 1);
}

TEST_CASE("dispatcher: a wake claims all free slots") {
    dispatcher d(4);
    CHECK(d.on_wake() == 4);
    CHECK(d.claiming());
    CHECK(d.in_flight() == 0);  // nothing is in flight until the claim returns
}

TEST_CASE("dispatcher: never a second claim while one runs") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    CHECK(d.on_wake() == 0);
    CHECK(d.on_outcomes_recorded(true) == 0);
    CHECK(d.on_wake() == 0);
    CHECK(d.claiming());
}

TEST_CASE("dispatcher: a wake during a claim causes a follow-up claim after on_claimed") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    CHECK(d.on_wake() == 0);
    CHECK(d.on_claimed(1, 4) == 3);  // partial, but the wake came after the claim started
    CHECK(d.in_flight() == 1);
    CHECK(d.claiming());
    // the follow-up claim is partial and nothing new came in: no more
    CHECK(d.on_claimed(0, 3) == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.in_flight() == 1);
}

TEST_CASE("dispatcher: an unblocked key during a claim causes a follow-up claim too") {
    dispatcher d(3);
    REQUIRE(d.on_wake() == 3);
    CHECK(d.on_outcomes_recorded(true) == 0);
    CHECK(d.on_claimed(0, 3) == 3);
}

TEST_CASE("dispatcher: a partial claim means nothing more is due until a wake") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    CHECK(d.on_claimed(2, 4) == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.in_flight() == 2);
    CHECK(d.on_delivery_finished() == 0);  // a free slot alone is no reason
    CHECK(d.on_outcomes_recorded(false) == 0);
    CHECK(d.in_flight() == 1);
    CHECK(d.on_wake() == 3);
}

TEST_CASE("dispatcher: an empty claim means nothing is due") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    CHECK(d.on_claimed(0, 4) == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.in_flight() == 0);
    CHECK(d.on_wake() == 4);
}

TEST_CASE("dispatcher: a full claim claims again as soon as a slot frees") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    CHECK(d.on_claimed(4, 4) == 0);  // more may be due, but no slot is free
    CHECK_FALSE(d.claiming());
    CHECK(d.in_flight() == 4);
    CHECK(d.on_delivery_finished() == 1);
    CHECK(d.in_flight() == 3);
    CHECK(d.claiming());
    // slots freeing during that claim do not start another
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.in_flight() == 1);
    // the 1-slot claim came back full: ask for all that is free now
    CHECK(d.on_claimed(1, 1) == 2);
    CHECK(d.in_flight() == 2);
}

TEST_CASE("dispatcher: never asks for more than the free slots") {
    dispatcher d(8);
    REQUIRE(d.on_wake() == 8);
    CHECK(d.on_wake() == 0);
    CHECK(d.on_claimed(5, 8) == 3);
    CHECK(d.on_wake() == 0);
    CHECK(d.on_claimed(3, 3) == 0);  // full: in flight 8 = slots
    CHECK(d.in_flight() == 8);
    CHECK(d.on_wake() == 0);
    CHECK(d.on_outcomes_recorded(true) == 0);
    CHECK(d.on_delivery_finished() == 1);
}

TEST_CASE("dispatcher: no claim while all slots are busy; a finished delivery claims if wanted") {
    dispatcher d(2);
    REQUIRE(d.on_wake() == 2);
    REQUIRE(d.on_claimed(1, 2) == 0);  // partial: not wanted
    REQUIRE(d.on_wake() == 1);
    REQUIRE(d.on_claimed(1, 1) == 0);  // full, but all slots busy
    CHECK(d.in_flight() == 2);
    CHECK_FALSE(d.claiming());
    CHECK(d.on_wake() == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.on_delivery_finished() == 1);
    CHECK(d.in_flight() == 1);
}

TEST_CASE("dispatcher: a failed claim backs off until on_wake") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    REQUIRE(d.on_claim_failed() == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.in_flight() == 0);
    CHECK(d.on_outcomes_recorded(true) == 0);
    CHECK(d.on_outcomes_recorded(false) == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.on_wake() == 4);  // the retry timer
    CHECK(d.claiming());
}

TEST_CASE("dispatcher: a failed claim with deliveries in flight") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    REQUIRE(d.on_claimed(4, 4) == 0);
    REQUIRE(d.on_delivery_finished() == 1);  // claim of 1 starts, in flight 3
    CHECK(d.on_claim_failed() == 0);
    CHECK(d.in_flight() == 3);
    CHECK(d.on_delivery_finished() == 0);  // backing off: no claim for the free slots
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.in_flight() == 1);
    CHECK(d.on_wake() == 3);
}

TEST_CASE("dispatcher: a failed claim followed by more failures keeps backing off") {
    dispatcher d(2);
    REQUIRE(d.on_wake() == 2);
    REQUIRE(d.on_claim_failed() == 0);
    REQUIRE(d.on_wake() == 2);
    CHECK(d.on_claim_failed() == 0);
    CHECK(d.on_outcomes_recorded(true) == 0);
    CHECK(d.on_wake() == 2);
    CHECK(d.on_claimed(0, 2) == 0);  // recovered; nothing due
}

TEST_CASE("dispatcher: outcomes_recorded(true) wants a claim, (false) does not") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    REQUIRE(d.on_claimed(2, 4) == 0);  // partial: not wanted
    CHECK(d.on_outcomes_recorded(false) == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.on_outcomes_recorded(true) == 2);
    CHECK(d.claiming());
}

TEST_CASE("dispatcher: stop means no claim ever again") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    d.on_stop();
    CHECK(d.stopping());
    CHECK_FALSE(d.drained());                // a claim is still running
    CHECK(d.on_claimed(4, 4) == 0);          // full, yet no follow-up
    CHECK_FALSE(d.drained());                // 4 in flight
    CHECK(d.on_wake() == 0);
    CHECK(d.on_outcomes_recorded(true) == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK_FALSE(d.drained());
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.in_flight() == 0);
    CHECK(d.drained());
    CHECK(d.on_wake() == 0);
    CHECK_FALSE(d.claiming());
    CHECK(d.drained());
}

TEST_CASE("dispatcher: drained waits for a pending claim even with nothing in flight") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    d.on_stop();
    CHECK(d.in_flight() == 0);
    CHECK_FALSE(d.drained());
    CHECK(d.on_claimed(0, 4) == 0);
    CHECK(d.drained());
}

TEST_CASE("dispatcher: drained after a claim that failed during shutdown") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    d.on_stop();
    CHECK(d.on_claim_failed() == 0);
    CHECK(d.drained());
    CHECK(d.on_wake() == 0);
}

TEST_CASE("dispatcher: stopping while idle is drained at once; stop twice is harmless") {
    dispatcher d(4);
    CHECK_FALSE(d.drained());  // not stopping
    d.on_stop();
    CHECK(d.drained());
    d.on_stop();
    CHECK(d.drained());
    CHECK(d.on_wake() == 0);
    CHECK(d.on_outcomes_recorded(true) == 0);
}

TEST_CASE("dispatcher: random event sequences keep the invariants") {
    // A deterministic generator; raw mt19937 output is the same everywhere.
    std::mt19937 rng(20240611);
    auto below = [&](std::uint32_t n) { return static_cast<std::size_t>(rng() % n); };
    std::size_t claims = 0;
    std::size_t full_claims = 0;

    for (int run = 0; run < 300; ++run) {
        const std::size_t slots = 1 + below(8);
        const std::size_t batch = 1 + below(static_cast<std::uint32_t>(slots));
        dispatcher d(slots, batch);
        std::size_t asked = 0;  // size of the claim in progress (0: none)
        bool stopped = false;

        // What a returned claim size must satisfy; records it as in progress.
        auto started = [&](std::size_t n, std::size_t in_flight_before, bool claiming_before) {
            if (n == 0) return;
            ++claims;
            CHECK_FALSE(claiming_before);
            CHECK_FALSE(stopped);
            CHECK(n == slots - in_flight_before);
            if (d.draining()) CHECK(n >= batch);
            CHECK(d.claiming());
            asked = n;
        };

        for (int step = 0; step < 200; ++step) {
            CAPTURE(run);
            CAPTURE(step);
            const std::size_t in_flight = d.in_flight();
            const bool claiming = d.claiming();
            REQUIRE(claiming == (asked != 0));
            switch (below(7)) {
                case 0:
                case 1: {
                    const std::size_t n = d.on_wake();
                    started(n, in_flight, claiming);
                    break;
                }
                case 2: {
                    if (asked == 0) break;
                    const std::size_t got = below(static_cast<std::uint32_t>(asked + 1));
                    const std::size_t was_asked = asked;
                    asked = 0;
                    if (got == was_asked) ++full_claims;
                    const std::size_t n = d.on_claimed(got, was_asked);
                    CHECK(d.in_flight() == in_flight + got);
                    started(n, in_flight + got, false);
                    break;
                }
                case 3: {
                    if (asked == 0) break;
                    asked = 0;
                    CHECK(d.on_claim_failed() == 0);
                    CHECK_FALSE(d.claiming());
                    CHECK(d.in_flight() == in_flight);
                    break;
                }
                case 4: {
                    if (in_flight == 0) break;
                    const std::size_t n = d.on_delivery_finished();
                    CHECK(d.in_flight() == in_flight - 1);
                    started(n, in_flight - 1, claiming);
                    break;
                }
                case 5: {
                    const std::size_t n = d.on_outcomes_recorded(below(2) == 0);
                    started(n, in_flight, claiming);
                    break;
                }
                default: {
                    if (below(20) == 0) {
                        d.on_stop();
                        stopped = true;
                    }
                    break;
                }
            }
            CHECK(d.in_flight() <= d.slots());
            CHECK(d.stopping() == stopped);
            CHECK(d.drained() == (stopped && d.in_flight() == 0 && !d.claiming()));
        }

        // Shutdown always completes: finish the claim and every delivery.
        d.on_stop();
        stopped = true;
        if (asked != 0) {
            CHECK(d.on_claimed(asked, asked) == 0);
            asked = 0;
        }
        while (d.in_flight() > 0) CHECK(d.on_delivery_finished() == 0);
        CHECK(d.drained());
    }
    // the sequences did exercise claims, full ones included
    CHECK(claims > 1'000);
    CHECK(full_claims > 100);
}

TEST_CASE("dispatcher: with steady work every slot stays busy") {
    // Every claim comes back full (the table is deep): the dispatcher must
    // keep all slots in flight, claiming exactly what each finished delivery frees.
    dispatcher d(3);
    std::size_t asked = d.on_wake();
    REQUIRE(asked == 3);
    for (int i = 0; i < 100; ++i) {
        CAPTURE(i);
        const std::size_t n = d.on_claimed(asked, asked);
        CHECK(n == 0);
        CHECK(d.in_flight() == 3);
        asked = d.on_delivery_finished();
        CHECK(asked == 1);
    }
}

TEST_CASE("dispatcher: while a backlog drains, a claim waits until a batch of slots is free") {
    dispatcher d(8, 4);
    REQUIRE(d.on_wake() == 8);
    CHECK(d.on_claimed(8, 8) == 0);  // full: a backlog
    CHECK(d.draining());
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_wake() == 0);  // a NOTIFY does not cut the batch short either
    CHECK(d.on_delivery_finished() == 4);
    // Still full: still draining, the next claim waits for 4 free slots again.
    CHECK(d.on_claimed(4, 4) == 0);
    CHECK(d.in_flight() == 8);
    for (int i = 0; i < 3; ++i) CHECK(d.on_delivery_finished() == 0);
    CHECK(d.on_delivery_finished() == 4);
}

TEST_CASE("dispatcher: a claim that comes back short ends the drain: the next wake claims any free slot") {
    dispatcher d(8, 4);
    REQUIRE(d.on_wake() == 8);
    REQUIRE(d.on_claimed(8, 8) == 0);
    for (int i = 0; i < 3; ++i) REQUIRE(d.on_delivery_finished() == 0);
    REQUIRE(d.on_delivery_finished() == 4);
    CHECK(d.on_claimed(2, 4) == 0);  // the backlog is gone
    CHECK_FALSE(d.draining());
    CHECK(d.in_flight() == 6);
    CHECK(d.on_wake() == 2);  // fewer than the batch: claimed at once
}

TEST_CASE("dispatcher: the batch is at least 1 and at most the slots") {
    CHECK(dispatcher(4, 0).batch() == 1);
    CHECK(dispatcher(4, 9).batch() == 4);
    CHECK(dispatcher(4).batch() == 1);
}

TEST_CASE("dispatcher: resize applies from the next transition, and never drops what is in flight") {
    dispatcher d(4);
    REQUIRE(d.on_wake() == 4);
    CHECK(d.on_claimed(4, 4) == 0);
    d.resize(12, 4);  // the relay may now claim ahead
    CHECK(d.slots() == 12);
    CHECK(d.on_delivery_finished() == 9);  // draining, 9 free >= batch 4
    CHECK(d.on_claimed(9, 9) == 0);
    CHECK(d.in_flight() == 12);
    d.resize(4, 1);  // delivering slowed down: hold no more than 4
    for (int i = 0; i < 8; ++i) CHECK(d.on_delivery_finished() == 0);  // 12 -> 4 held: still none free
    CHECK(d.on_delivery_finished() == 1);
}
