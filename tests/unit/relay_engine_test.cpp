#include "core/relay_engine.hpp"

#include <doctest/doctest.h>

#include "fake_clock.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "core/claim_capacity.hpp"
#include "core/log.hpp"

// The relay engine on simulated time: every input is given by the test, every
// command it answers is inspected; no sockets, no database, no sleeps.

using namespace outboxd;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

namespace {

using testing::fake_clock;

destination_config destination(std::string name, std::size_t max_concurrency = 32) {
    destination_config d;
    d.name = std::move(name);
    d.connect_timeout = 1s;
    d.request_timeout = 2s;
    d.max_concurrency = max_concurrency;
    return d;
}

// One destination "a" that every topic routes to, unless a test adds more.
config one_destination(std::size_t concurrency = 4) {
    config c;
    c.consume = "claims";  // as a relay settles relay.consume = "auto"
    c.concurrency = concurrency;
    c.lease = 30s;
    c.sweep_interval = 30s;
    c.shutdown_timeout = 10s;
    c.destinations.push_back(destination("a"));
    c.routes.push_back({{">"}, {"a"}});
    return c;
}

event make_event(std::int64_t id, std::optional<std::string> key = std::nullopt, std::string topic = "orders.created") {
    event e;
    e.id = id;
    e.topic = std::move(topic);
    e.ordering_key = std::move(key);
    e.payload = R"({"n":1})";
    e.attempt = 1;
    return e;
}

send_result ok() {
    send_result r;
    r.status = 200;
    return r;
}

send_result server_error() {
    send_result r;
    r.status = 500;
    return r;
}

// Drives one engine and keeps what it said.
struct harness {
    explicit harness(config c) : cfg(std::move(c)), engine(cfg, clock, 42) {
        log::set_level(log::level::error);  // the engine's warnings are expected here
    }
    ~harness() { log::set_level(log::level::info); }
    harness(const harness&) = delete;
    harness& operator=(const harness&) = delete;

    // Takes the engine's commands since the last call.
    std::vector<relay_command>& step() {
        last = engine.take_commands();
        return last;
    }
    template <typename T>
    [[nodiscard]] std::vector<T> all() const {
        std::vector<T> out;
        for (const auto& c : last) {
            if (const auto* t = std::get_if<T>(&c)) out.push_back(*t);
        }
        return out;
    }
    template <typename T>
    [[nodiscard]] T one() const {
        const auto v = all<T>();
        REQUIRE(v.size() == 1);
        return v.front();
    }
    template <typename T>
    [[nodiscard]] bool has() const {
        return !all<T>().empty();
    }
    [[nodiscard]] std::optional<arm_timer_command> armed(relay_timer t) const {
        std::optional<arm_timer_command> found;
        for (const auto& a : all<arm_timer_command>()) {
            if (a.timer == t) found = a;
        }
        return found;
    }

    // start() and the first claim it asks for.
    claim_command start() {
        engine.start("msg_0000000000000001_");
        step();
        return one<claim_command>();
    }
    // The claim comes back with these events (`full`: as many as asked).
    void claim_returns(std::vector<event> events, bool full = false) {
        claim_outcome o;
        o.events = std::move(events);
        o.full = full;
        claim_comes_back(std::move(o));
    }
    // The claim comes back with this answer, now.
    void claim_comes_back(claim_outcome o) {
        o.started = clock.now;
        o.done = clock.now;
        engine.claimed(std::move(o));
        step();
    }
    void answer(const send_command& s, send_result r) {
        engine.sent(s.send_id, std::move(r));
        step();
    }
    // Outcomes gathered while other deliveries were in flight: their window
    // ends (the timer fires). What the engine says is added to `last`.
    void gather_window_ends() {
        const auto gather = armed(relay_timer::outcome_gather);
        REQUIRE(gather);
        clock.advance(outcome_gather_window);
        engine.timer_fired(relay_timer::outcome_gather, gather->generation);
        auto more = engine.take_commands();
        last.insert(last.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }

    config cfg;
    fake_clock clock;
    relay_engine engine;
    std::vector<relay_command> last;
};

std::vector<std::int64_t> ids(const std::vector<send_command>& sends) {
    std::vector<std::int64_t> out;
    for (const auto& s : sends) out.push_back(s.e->id);
    return out;
}

}  // namespace

TEST_CASE("relay engine: a wake claims the free slots, claimed events are sent, outcomes written in one batch") {
    harness h(one_destination(4));
    const auto claim = h.start();
    CHECK(claim.request.wanted == 4);
    REQUIRE(claim.request.open_destinations.size() == 1);
    CHECK(claim.request.open_destinations[0].name == "a");
    CHECK(claim.request.open_destinations[0].free == 32);
    CHECK(h.armed(relay_timer::sweep));

    h.claim_returns({make_event(1), make_event(2)});
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    CHECK(ids(sends) == std::vector<std::int64_t>{1, 2});
    CHECK(sends[0].headers.front().first == "webhook-id");
    CHECK(sends[0].headers.front().second == "msg_0000000000000001_1");
    // The attempt ends before the lease does (a tenth of it, at most 1 s).
    CHECK(sends[0].deadline == h.clock.now + 30s - 1s);
    CHECK(h.engine.sending() == 2);

    // Event 2 is still in flight: event 1's outcome waits for it (gathered).
    h.answer(sends[0], ok());
    CHECK_FALSE(h.has<write_outcomes_command>());
    CHECK(h.armed(relay_timer::outcome_gather)->at == h.clock.now + outcome_gather_window);
    h.answer(sends[1], ok());
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->delivered.size() == 2);
    CHECK(write.batch->delivered[0].id == 1);
    CHECK(write.batch->delivered[1].id == 2);
    CHECK(h.all<cancel_timer_command>().size() == 1);  // the gather timer
}

TEST_CASE("relay engine: outcomes gather while others are in flight, up to a window, a size, a keyed one or a stop") {
    SUBCASE("the window ends: what gathered is written, and the next gathers anew") {
        harness h(one_destination(4));
        h.start();
        h.claim_returns({make_event(1), make_event(2), make_event(3)});
        const auto sends = h.all<send_command>();
        h.answer(sends[0], ok());
        const auto gather = h.armed(relay_timer::outcome_gather);
        REQUIRE(gather);
        h.clock.advance(5ms);
        h.answer(sends[1], ok());
        CHECK_FALSE(h.has<write_outcomes_command>());
        CHECK_FALSE(h.armed(relay_timer::outcome_gather));  // the first window still runs
        h.clock.advance(5ms);
        h.engine.timer_fired(relay_timer::outcome_gather, gather->generation);
        h.step();
        CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 2);
        h.engine.outcomes_written(0);
        h.step();
        // Event 3 is the last in flight: its outcome goes at once.
        h.answer(sends[2], ok());
        CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
    }
    SUBCASE("a keyed event's successor waits on its outcome: written at once") {
        harness h(one_destination(4));
        h.start();
        h.claim_returns({make_event(1, "k"), make_event(2)});
        const auto sends = h.all<send_command>();
        h.answer(sends[0], ok());
        CHECK(h.one<write_outcomes_command>().batch->unblocks_key);
    }
    SUBCASE("a stop writes at once what gathered") {
        harness h(one_destination(4));
        h.start();
        h.claim_returns({make_event(1), make_event(2)});
        const auto sends = h.all<send_command>();
        h.answer(sends[0], ok());
        CHECK_FALSE(h.has<write_outcomes_command>());
        h.engine.signalled(15);
        h.step();
        CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
    }
    SUBCASE("outcome_gather_size outcomes are written without waiting for the window") {
        auto cfg = one_destination(outcome_gather_size + 1);
        cfg.destinations = {destination("a", outcome_gather_size + 1)};
        harness h(cfg);
        h.start();
        std::vector<event> events;
        for (std::size_t i = 1; i <= outcome_gather_size + 1; ++i) events.push_back(make_event(static_cast<std::int64_t>(i)));
        h.claim_returns(std::move(events));
        const auto sends = h.all<send_command>();
        REQUIRE(sends.size() == outcome_gather_size + 1);
        for (std::size_t i = 0; i + 1 < outcome_gather_size; ++i) {
            h.answer(sends[i], ok());
            CHECK_FALSE(h.has<write_outcomes_command>());
        }
        h.answer(sends[outcome_gather_size - 1], ok());
        CHECK(h.one<write_outcomes_command>().batch->delivered.size() == outcome_gather_size);
    }
}

TEST_CASE("relay engine: claims ahead of the free slots only once deliveries are fast, never beyond the bound") {
    auto cfg = one_destination(2);
    harness h(cfg);
    auto claim = h.start();
    // At startup the delivery rate is unknown: no event is claimed ahead.
    CHECK(claim.request.wanted == 2);
    std::int64_t next_id = 1;
    std::size_t largest_wanted = 0;
    std::size_t most_sending = 0;
    // A backlog: every claim comes back full; each request is answered 1 ms
    // after it was sent.
    for (int round = 0; round < 200; ++round) {
        const auto claims = h.all<claim_command>();
        if (!claims.empty()) {
            const auto wanted = claims.back().request.wanted;
            largest_wanted = std::max(largest_wanted, wanted);
            std::vector<event> events;
            for (std::size_t i = 0; i < wanted; ++i) events.push_back(make_event(next_id++));
            h.claim_returns(std::move(events), /*full=*/true);
        }
        most_sending = std::max(most_sending, h.engine.sending());
        const auto sends = h.all<send_command>();
        if (sends.empty()) break;
        h.clock.advance(1ms);
        h.answer(sends.front(), ok());
        if (h.has<write_outcomes_command>()) {
            h.engine.outcomes_written(0);
            auto more = h.last;  // keep the answer's commands too
            h.step();
            more.insert(more.end(), h.last.begin(), h.last.end());
            h.last = more;
        }
        // Everything still in flight is answered before the next round.
        for (const auto& s : sends) {
            if (s.send_id == sends.front().send_id) continue;
            h.engine.sent(s.send_id, ok());
        }
        auto more = h.last;
        h.step();
        more.insert(more.end(), h.last.begin(), h.last.end());
        h.last = more;
        if (h.has<write_outcomes_command>()) {
            h.engine.outcomes_written(0);
            more = h.last;
            h.step();
            more.insert(more.end(), h.last.begin(), h.last.end());
            h.last = more;
        }
    }
    // Delivery slots bound what is being sent; claiming ahead took more per
    // claim than the free slots, and at most most_ahead_per_slot per slot.
    CHECK(most_sending <= cfg.concurrency);
    CHECK(largest_wanted > cfg.concurrency);
    CHECK(largest_wanted <= cfg.concurrency * (1 + most_ahead_per_slot));
    CHECK(h.engine.held() <= cfg.concurrency * (1 + most_ahead_per_slot));
}

TEST_CASE("relay engine: a destination with no free connection is deferred; the others get the event at once") {
    auto cfg = one_destination(4);
    cfg.destinations = {destination("slow", 1), destination("fast")};
    cfg.routes = {{{">"}, {"slow", "fast"}}};
    harness h(cfg);
    h.start();
    h.claim_returns({make_event(1)});
    const auto first = h.all<send_command>();
    REQUIRE(first.size() == 2);  // to both
    // While "slow" holds its one connection, the next event goes to "fast" only.
    h.engine.wake();
    h.step();
    const auto claim = h.one<claim_command>();
    REQUIRE(claim.request.open_destinations.size() == 1);
    CHECK(claim.request.open_destinations[0].name == "fast");
    h.claim_returns({make_event(2, "k")});
    const auto second = h.all<send_command>();
    REQUIRE(second.size() == 1);
    CHECK(second[0].destination == 1);
    CHECK(h.engine.busy_connections(0) == 1);
    h.answer(second[0], ok());
    // Settled: delivered to "fast", owed to "slow" (due now, not an attempt there).
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->fan_outs.size() == 1);
    const auto& f = write.batch->fan_outs[0];
    CHECK(f.ref.id == 2);
    REQUIRE(f.owed.size() == 1);
    CHECK(f.owed[0].destination == "slow");
    CHECK(f.owed[0].due_in == 0ms);
    CHECK(f.owed[0].attempts == 0);
    CHECK(write.batch->unblocks_key);
}

namespace {

// Destinations "slow" (one connection) and "fast", every event to both.
config slow_and_fast() {
    auto cfg = one_destination(4);
    cfg.destinations = {destination("slow", 1), destination("fast")};
    cfg.routes = {{{">"}, {"slow", "fast"}}};
    return cfg;
}

send_command send_to(const std::vector<send_command>& sends, std::size_t destination) {
    const auto it = std::find_if(sends.begin(), sends.end(), [&](const send_command& s) { return s.destination == destination; });
    REQUIRE(it != sends.end());
    return *it;
}

// Event 1 is out to "slow" (its one connection) and delivered to "fast"; a
// claim that left "slow" out is running. Returns the request to "slow".
send_command claim_without_slow(harness& h) {
    h.start();
    h.claim_returns({make_event(1)});
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    h.answer(send_to(sends, 1), ok());
    h.engine.wake();
    h.step();
    REQUIRE(h.one<claim_command>().request.open_destinations.size() == 1);  // "fast" only
    return send_to(sends, 0);
}

// The running claim comes back with these events, having seen deliveries due or not.
void claim_returns_seeing(harness& h, std::vector<event> events, bool deliveries_due) {
    claim_outcome o;
    o.events = std::move(events);
    o.deliveries_due = deliveries_due;
    h.claim_comes_back(std::move(o));
}

}  // namespace

TEST_CASE("relay engine: a claim that left a full destination out, and saw deliveries due, is followed by one "
          "when a connection frees") {
    harness h(slow_and_fast());
    const auto to_slow = claim_without_slow(h);
    claim_returns_seeing(h, {}, true);
    CHECK_FALSE(h.has<claim_command>());
    h.answer(to_slow, ok());
    const auto claim = h.one<claim_command>();
    REQUIRE(claim.request.open_destinations.size() == 2);
    CHECK(claim.request.open_destinations[0].name == "slow");
}

TEST_CASE("relay engine: a connection that frees claims nothing when the claim that left its destination out saw "
          "no deliveries due") {
    // A relay whose claims are larger than its destination's connections
    // fills the lane at every claim: a claim at each first free connection
    // would set the pace instead of the wake policy.
    harness h(slow_and_fast());
    const auto to_slow = claim_without_slow(h);
    claim_returns_seeing(h, {}, false);
    h.answer(to_slow, ok());
    CHECK_FALSE(h.has<claim_command>());
    // Nor when no claim left it out, deliveries due or not: the lane filled
    // after the last claim began, and frees again.
    h.engine.wake();
    h.step();
    REQUIRE(h.one<claim_command>().request.open_destinations.size() == 2);
    claim_returns_seeing(h, {make_event(2)}, true);
    const auto again = h.all<send_command>();
    REQUIRE(again.size() == 2);
    h.answer(send_to(again, 1), ok());
    h.answer(send_to(again, 0), ok());
    CHECK_FALSE(h.has<claim_command>());
}

TEST_CASE("relay engine: a connection that frees while the claim that left it out runs is claimed for when that "
          "claim comes back with deliveries due") {
    harness h(slow_and_fast());
    const auto to_slow = claim_without_slow(h);
    h.answer(to_slow, ok());  // the claim still runs
    CHECK_FALSE(h.has<claim_command>());
    claim_returns_seeing(h, {}, true);
    const auto claim = h.one<claim_command>();
    CHECK(claim.request.open_destinations.size() == 2);
}

TEST_CASE("relay engine: deliveries written due now are claimed at once") {
    // Event 2 finds "slow" without a free connection: delivered to "fast",
    // owed to "slow". Once that is recorded, a claim looks for it.
    harness h(slow_and_fast());
    (void)claim_without_slow(h);
    claim_returns_seeing(h, {make_event(2)}, false);
    const auto second = h.one<send_command>();
    CHECK(second.destination == 1);
    h.answer(second, ok());
    h.gather_window_ends();  // event 1 is still out to "slow"
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->fan_outs.size() == 1);
    CHECK_FALSE(write.batch->unblocks_key);
    h.engine.outcomes_written(0);
    h.step();
    const auto claim = h.one<claim_command>();
    CHECK(claim.request.deliveries_due);
}

TEST_CASE("relay engine: a claimed event whose lease would end before its attempt is not sent") {
    harness h(one_destination(1));  // longest attempt: 1 s connect + 2 s request
    h.start();
    h.claim_returns({make_event(1), make_event(2)});  // the second waits for the slot
    const auto first = h.one<send_command>();
    CHECK(h.engine.ready() == 1);
    // The first request hangs until 28 s into the 30 s lease: event 2 can no
    // longer finish an attempt within its lease.
    h.clock.advance(28s);
    h.answer(first, ok());
    CHECK_FALSE(h.has<send_command>());
    CHECK(h.engine.ready() == 0);
    CHECK(h.engine.sending() == 0);
    CHECK(h.engine.held() == 0);  // its slot is free again
    // Nothing else in flight: written at once, event 1 delivered and event 2
    // back to the outbox, due now, its claim's attempt taken back.
    const auto write = h.one<write_outcomes_command>();
    CHECK(write.batch->delivered.size() == 1);
    REQUIRE(write.batch->handed_back.size() == 1);
    CHECK(write.batch->handed_back[0].ref.id == 2);
    CHECK(write.batch->handed_back[0].ref.attempt == 1);
    CHECK(write.batch->handed_back[0].delay == 0ms);
}

TEST_CASE("relay engine: a lane-waiting delivery that no longer fits in its lease fails without being sent") {
    auto cfg = one_destination(4);
    cfg.destinations = {destination("a", 1)};
    harness h(cfg);
    h.start();
    auto owed1 = make_event(1);
    owed1.destination = "a";
    auto owed2 = make_event(2);
    owed2.destination = "a";
    h.claim_returns({owed1, owed2});
    const auto first = h.one<send_command>();
    CHECK(h.engine.lane_waiting(0) == 1);
    h.clock.advance(28s);
    h.answer(first, ok());
    CHECK_FALSE(h.has<send_command>());
    CHECK(h.engine.lane_waiting(0) == 0);
    // The freed connection goes to the waiting delivery first, which is
    // handed back unsent; the answer is recorded with it (nothing else is
    // in flight: written at once).
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->deliveries_handed_back.size() == 1);
    CHECK(write.batch->deliveries_handed_back[0].ref.id == 2);
    CHECK(write.batch->deliveries.retries.empty());
    REQUIRE(write.batch->deliveries.delivered.size() == 1);
    CHECK(write.batch->deliveries.delivered[0].id == 1);
    CHECK(h.engine.sending() == 0);
}

TEST_CASE("relay engine: shutdown hands back claimed-ahead events unsent, lets the one in flight finish, writes, "
          "then finishes") {
    harness h(one_destination(1));
    h.start();
    h.claim_returns({make_event(1), make_event(2), make_event(3)});
    const auto in_flight = h.one<send_command>();
    CHECK(h.engine.ready() == 2);
    h.engine.signalled(15);
    h.step();
    CHECK(h.has<stop_listening_command>());
    const auto handed_back = h.one<write_outcomes_command>();
    REQUIRE(handed_back.batch->handed_back.size() == 2);
    CHECK(handed_back.batch->handed_back[0].ref.id == 2);
    CHECK(handed_back.batch->handed_back[1].ref.id == 3);
    const auto timeout = h.armed(relay_timer::shutdown);
    REQUIRE(timeout);
    CHECK(timeout->at == h.clock.now + 10s);
    CHECK(h.engine.ready() == 0);
    CHECK(h.engine.held() == 1);
    CHECK_FALSE(h.has<finish_command>());
    // A wake-up after the signal claims nothing.
    h.engine.wake();
    h.step();
    CHECK_FALSE(h.has<claim_command>());
    h.answer(in_flight, ok());
    CHECK_FALSE(h.has<finish_command>());  // its outcome is written first
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
    h.engine.outcomes_written(0);
    h.step();
    const auto finish = h.one<finish_command>();
    CHECK(finish.last.empty());
}

TEST_CASE("relay engine: the shutdown timeout finishes with a request still in flight; its answer is ignored") {
    harness h(one_destination(2));
    h.start();
    h.claim_returns({make_event(1), make_event(2)});
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    h.answer(sends[0], ok());  // being written when the signal comes
    h.gather_window_ends();
    REQUIRE(h.has<write_outcomes_command>());
    h.engine.signalled(2);
    h.step();
    const auto timeout = *h.armed(relay_timer::shutdown);
    h.clock.advance(10s);
    h.engine.timer_fired(relay_timer::shutdown, timeout.generation);
    h.step();
    // The write that had not come back is written again with the rest (fenced, idempotent).
    const auto finish = h.one<finish_command>();
    CHECK(finish.last.delivered.size() == 1);
    h.answer(sends[1], ok());
    CHECK(h.last.empty());
}

TEST_CASE("relay engine: a second signal exits at once") {
    harness h(one_destination(1));
    h.start();
    h.claim_returns({make_event(1)});
    h.engine.signalled(15);
    h.step();
    CHECK_FALSE(h.has<exit_now_command>());
    h.engine.signalled(15);
    h.step();
    CHECK(h.has<exit_now_command>());
}

TEST_CASE("relay engine: an outcome write that fails is written again after a backoff, with what finished since") {
    harness h(one_destination(2));
    h.start();
    h.claim_returns({make_event(1), make_event(2)});
    const auto sends = h.all<send_command>();
    h.answer(sends[0], ok());
    h.gather_window_ends();
    REQUIRE(h.has<write_outcomes_command>());
    h.engine.outcomes_failed("connection lost");
    h.step();
    const auto retry = h.armed(relay_timer::flush_retry);
    REQUIRE(retry);
    CHECK(retry->at == h.clock.now + 100ms);
    h.answer(sends[1], ok());
    CHECK_FALSE(h.has<write_outcomes_command>());  // not before the backoff
    h.clock.advance(100ms);
    h.engine.timer_fired(relay_timer::flush_retry, retry->generation);
    h.step();
    const auto again = h.one<write_outcomes_command>();
    REQUIRE(again.batch->delivered.size() == 2);
    CHECK(again.batch->delivered[0].id == 1);
    CHECK(again.batch->delivered[1].id == 2);
    // A second failure backs off longer.
    h.engine.outcomes_failed("still down");
    h.step();
    CHECK(h.armed(relay_timer::flush_retry)->at == h.clock.now + 200ms);
}

TEST_CASE("relay engine: a keyed event recorded sends the next claim back to the start of the index") {
    harness h(one_destination(2));
    h.start();
    // A full claim during a backlog: the next claim continues behind it.
    claim_outcome o;
    o.events = {make_event(1, "k"), make_event(2)};
    o.full = true;
    o.drain_watermark = claim_watermark{"2026-11-30 00:00:00+00", 2};
    o.low_mark = "2026-11-30 00:00:00+00";
    o.started = h.clock.now;
    h.engine.claimed(std::move(o));
    h.step();
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    h.answer(sends[1], ok());  // unkeyed: its slot is free
    h.gather_window_ends();
    REQUIRE(h.has<write_outcomes_command>());
    auto claims = h.all<claim_command>();
    REQUIRE(claims.size() == 1);
    CHECK(claims[0].request.drain_watermark);  // still draining
    h.engine.outcomes_written(0);
    h.step();
    h.claim_returns({});
    h.answer(sends[0], ok());  // the keyed one
    const auto write = h.one<write_outcomes_command>();
    CHECK(write.batch->unblocks_key);
    h.engine.outcomes_written(0);
    h.step();
    claims = h.all<claim_command>();
    REQUIRE(claims.size() == 1);
    CHECK_FALSE(claims[0].request.drain_watermark);
    CHECK_FALSE(claims[0].request.low_mark);
}

TEST_CASE("relay engine: a reset asked for while a claim runs applies after its outcome") {
    harness h(one_destination(2));
    h.start();
    h.claim_returns({make_event(1, "k")});
    const auto send = h.one<send_command>();
    h.engine.wake();
    h.step();
    REQUIRE(h.has<claim_command>());  // runs while the keyed event's outcome is recorded
    h.answer(send, ok());
    h.engine.outcomes_written(0);
    h.step();
    // The running claim comes back with marks that predate the unblocked key.
    claim_outcome o;
    o.low_mark = "2026-11-30 00:00:00+00";
    o.started = h.clock.now;
    h.engine.claimed(std::move(o));
    h.step();
    const auto claim = h.one<claim_command>();  // asked for when the key unblocked
    CHECK_FALSE(claim.request.low_mark);
}

TEST_CASE("relay engine: a failed claim is retried after a growing backoff; the sweep claims from the start") {
    harness h(one_destination(2));
    h.start();
    h.engine.claim_failed("server closed the connection");
    h.step();
    auto retry = h.armed(relay_timer::claim_retry);
    REQUIRE(retry);
    CHECK(retry->at == h.clock.now + 100ms);
    h.clock.advance(100ms);
    h.engine.timer_fired(relay_timer::claim_retry, retry->generation);
    h.step();
    REQUIRE(h.has<claim_command>());
    h.engine.claim_failed("again");
    h.step();
    CHECK(h.armed(relay_timer::claim_retry)->at == h.clock.now + 200ms);

    harness s(one_destination(2));
    const auto sweep = *[&] { s.engine.start({}); s.step(); return s.armed(relay_timer::sweep); }();
    claim_outcome o;
    o.low_mark = "2026-11-30 00:00:00+00";
    s.engine.claimed(std::move(o));
    s.step();
    s.clock.advance(30s);
    s.engine.timer_fired(relay_timer::sweep, sweep.generation);
    s.step();
    CHECK_FALSE(s.one<claim_command>().request.low_mark);
    CHECK(s.all<housekeeping_command>().size() == 4);
    CHECK(s.armed(relay_timer::sweep));
}

TEST_CASE("relay engine: a claim from the start keeps the writers check its low mark carried") {
    harness s(one_destination(2));
    const auto sweep = *[&] { s.engine.start({}); s.step(); return s.armed(relay_timer::sweep); }();
    claim_outcome o;
    o.low_mark = "2026-11-30 00:00:00+00|2026-11-30 00:00:04+00|2026-11-30 00:00:03.95+00";
    s.engine.claimed(std::move(o));
    s.step();
    s.clock.advance(30s);
    s.engine.timer_fired(relay_timer::sweep, sweep.generation);
    s.step();
    // From the start of the index (no time), with the check.
    CHECK(s.one<claim_command>().request.low_mark ==
          std::optional<std::string>("|2026-11-30 00:00:04+00|2026-11-30 00:00:03.95+00"));
}

TEST_CASE("relay engine: after a watched transaction ended, the next claim reaches back to its start, also when "
          "that is asked for while a claim runs") {
    harness h(one_destination(2));
    h.start();
    const database_time early{std::chrono::microseconds(1'000)};
    const database_time late{std::chrono::microseconds(2'000)};
    h.engine.wake_since(late);  // while the first claim runs
    h.engine.wake_since(early);
    h.step();
    CHECK_FALSE(h.has<claim_command>());
    claim_outcome o;
    o.low_mark = "L|C|F";
    o.started = h.clock.now;
    h.engine.claimed(std::move(o));
    h.step();
    CHECK(h.one<claim_command>().request.low_mark == std::optional<std::string>("L|C|F|1000"));
    // That claim's own low mark does not reach back: the next one does not.
    claim_outcome p;
    p.low_mark = "M|C|F";
    p.started = h.clock.now;
    h.engine.claimed(std::move(p));
    h.step();
    h.engine.wake();
    h.step();
    CHECK(h.one<claim_command>().request.low_mark == std::optional<std::string>("M|C|F"));
    claim_outcome q;
    q.low_mark = "N|C|F";
    q.started = h.clock.now;
    h.engine.claimed(std::move(q));
    h.step();
    // No claim running: at once.
    h.engine.wake_since(late);
    h.step();
    CHECK(h.one<claim_command>().request.low_mark == std::optional<std::string>("N|C|F|2000"));
}

TEST_CASE("relay engine: after a failed claim the next one hands back every lease but those the relay holds") {
    harness h(one_destination(4));
    const auto first = h.start();
    CHECK_FALSE(first.request.release_all_but);  // nothing failed yet
    auto fanned = make_event(3);
    fanned.destination = "a";
    h.claim_returns({make_event(1), make_event(2), fanned}, true);
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 3);
    // A full claim: the engine claims ahead. That claim fails; it may have
    // committed and lost only its answer.
    REQUIRE(h.has<claim_command>());
    h.engine.claim_failed("lost the connection");
    h.step();
    const auto retry = h.armed(relay_timer::claim_retry);
    REQUIRE(retry);
    // Event 1 is recorded; 2 finished and is being written; 3 is in flight.
    h.answer(sends[0], ok());
    h.gather_window_ends();
    REQUIRE(h.has<write_outcomes_command>());
    h.engine.outcomes_written(0);
    h.step();
    h.answer(sends[1], ok());
    h.gather_window_ends();
    REQUIRE(h.has<write_outcomes_command>());

    h.clock.advance(std::chrono::duration_cast<milliseconds>(retry->at - h.clock.now));
    h.engine.timer_fired(relay_timer::claim_retry, retry->generation);
    h.step();
    const auto again = h.one<claim_command>();
    REQUIRE(again.request.release_all_but);
    const auto& keep = *again.request.release_all_but;
    CHECK(keep.events == std::vector<std::int64_t>{2});
    CHECK(keep.delivery_ids == std::vector<std::int64_t>{3});
    CHECK(keep.delivery_destinations == std::vector<std::string>{"a"});

    // Once a claim came back, the next one hands nothing back.
    h.claim_returns({}, true);
    for (const auto& c : h.all<claim_command>()) CHECK_FALSE(c.request.release_all_but);
}

TEST_CASE("relay engine: a timer that fires after it was re-armed or cancelled is ignored") {
    harness h(one_destination(2));
    h.start();
    const auto first_sweep = *h.armed(relay_timer::sweep);
    h.engine.signalled(15);  // cancels the sweep
    h.step();
    h.engine.timer_fired(relay_timer::sweep, first_sweep.generation);
    h.step();
    CHECK(h.last.empty());
}

TEST_CASE("relay engine: the next-due timer follows the claim, never beyond the sweep, earlier only after a write") {
    harness h(one_destination(2));
    h.start();
    claim_outcome o;
    o.next_due = 5s;
    o.started = h.clock.now;
    h.engine.claimed(std::move(o));
    h.step();
    CHECK(h.armed(relay_timer::next_due)->at == h.clock.now + 5s);
    // Due in centuries: clamped to the sweep interval (no overflow, no busy loop).
    h.engine.wake();
    h.step();
    claim_outcome far;
    far.next_due = milliseconds(std::numeric_limits<std::int64_t>::max() / 2);
    far.started = h.clock.now;
    h.engine.claimed(std::move(far));
    h.step();
    CHECK(h.armed(relay_timer::next_due)->at == h.clock.now + 30s);
}

TEST_CASE("relay engine: the next-due timer counts from when the claim began, not from its answer") {
    // "Due in 300 ms" was measured at the claim's statement; a claim that
    // took a second to answer must not delay that retry by its own second.
    harness h(one_destination(2));
    h.start();
    const auto began = h.clock.now;
    h.clock.advance(1s);
    claim_outcome slow;
    slow.next_due = 300ms;
    slow.started = began;
    slow.done = h.clock.now;
    h.engine.claimed(std::move(slow));
    h.step();
    REQUIRE(h.armed(relay_timer::next_due));
    CHECK(h.armed(relay_timer::next_due)->at == began + 300ms);
}

TEST_CASE("relay engine: a retry is timed from the write that records it") {
    harness h(one_destination(1));
    h.start();
    h.claim_returns({make_event(1)});
    h.answer(h.one<send_command>(), server_error());
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->fan_outs.size() == 1);
    const auto due_in = write.batch->fan_outs[0].owed.at(0).due_in;
    CHECK(due_in >= 4s);  // 5 s less at most 20 % jitter
    CHECK(due_in <= 5s);
    CHECK_FALSE(h.armed(relay_timer::next_due));  // not before it is recorded
    // The write takes 50 ms: the retry's time counts from when it was issued
    // (its statement's now() is no earlier), not from its answer.
    const auto issued = h.clock.now;
    h.clock.advance(50ms);
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.armed(relay_timer::next_due)->at == issued + due_in);
}

TEST_CASE("relay engine: a claim whose snapshot predates a retry's write does not push its timer back, "
          "though another claim follows at once") {
    // The retry is recorded while a claim runs; that claim saw the event
    // still leased (due at the lease's end) and comes back full, so the
    // engine claims again before it handles the answer's next-due time.
    // That time may only bring the timer forward: the write was recorded
    // while the claim ran, whichever claim runs now.
    harness h(one_destination(1));
    h.start();
    h.claim_returns({make_event(1)});
    h.answer(h.one<send_command>(), server_error());
    const auto write = h.one<write_outcomes_command>();
    const auto due_in = write.batch->fan_outs.at(0).owed.at(0).due_in;
    h.engine.wake();  // a claim, under way while the write is recorded
    h.step();
    REQUIRE(h.has<claim_command>());
    h.engine.outcomes_written(0);
    h.step();
    REQUIRE(h.armed(relay_timer::next_due));
    const auto retry_at = h.armed(relay_timer::next_due)->at;
    CHECK(retry_at == h.clock.now + due_in);
    claim_outcome stale;
    stale.full = true;
    stale.events = {make_event(2)};
    stale.next_due = 30s;  // the event as that claim saw it: leased until the lease's end
    stale.started = h.clock.now;
    stale.done = h.clock.now;
    h.engine.claimed(std::move(stale));
    h.step();
    CHECK(h.has<claim_command>());  // full: the next claim is under way
    const auto timer = h.armed(relay_timer::next_due);
    CHECK((!timer || timer->at == retry_at));  // not moved to the lease's end
}

TEST_CASE("relay engine: events no destination can take are settled without a request") {
    auto cfg = one_destination(4);
    cfg.routes = {{{"orders.>"}, {"a"}}};
    harness h(cfg);
    h.start();
    auto bad_header = make_event(1);
    bad_header.headers = {{"bad name", "x"}};
    auto replayed_to_nowhere = make_event(2);
    replayed_to_nowhere.only_to = {"a", "not a valid name"};
    h.claim_returns({bad_header, make_event(3, std::nullopt, "billing.paid"), make_event(4, "k", "billing.paid"),
                     replayed_to_nowhere});
    CHECK_FALSE(h.has<send_command>());
    const auto write = h.one<write_outcomes_command>();
    // The first settled goes alone; the rest wait for the next write.
    h.engine.outcomes_written(0);
    h.step();
    outcome_batch all = *write.batch;
    all.append(outcome_batch(*h.one<write_outcomes_command>().batch));
    REQUIRE(all.dead.size() == 3);  // bad header, keyed unroutable, invalid replay name
    CHECK(all.dead[0].ref.id == 1);
    REQUIRE(all.retries.size() == 1);  // unroutable, no key: stays, on the default schedule
    CHECK(all.retries[0].ref.id == 3);
    CHECK(h.engine.sending() == 0);
}

TEST_CASE("relay engine: a failing destination's circuit opens; its events are deferred without an attempt, the "
          "other destination goes on, one probe, and success releases its waiting deliveries") {
    auto cfg = one_destination(4);
    cfg.destinations = {destination("down"), destination("up")};
    cfg.destinations[0].circuit = {2, 500ms, 5s};
    cfg.routes = {{{">"}, {"down", "up"}}};
    harness h(cfg);
    h.start();
    h.claim_returns({make_event(1), make_event(2)});
    auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 4);
    for (const auto& s : sends) h.answer(s, s.destination == 0 ? server_error() : ok());
    CHECK(h.engine.circuit(0) == circuit_state::open);
    CHECK(h.engine.circuit(1) == circuit_state::closed);
    // While open: a claim leaves its deliveries alone, and new events go to "up" only.
    h.engine.wake();
    h.step();
    const auto claim = h.one<claim_command>();
    REQUIRE(claim.request.open_destinations.size() == 1);
    CHECK(claim.request.open_destinations[0].name == "up");
    h.claim_returns({make_event(3)});
    sends = h.all<send_command>();
    REQUIRE(sends.size() == 1);
    CHECK(sends[0].destination == 1);
    h.answer(sends[0], ok());
    while (h.has<write_outcomes_command>()) {
        const auto w = h.one<write_outcomes_command>();
        for (const auto& f : w.batch->fan_outs) {
            if (f.ref.id != 3) continue;
            REQUIRE(f.owed.size() == 1);
            CHECK(f.owed[0].destination == "down");
            CHECK(f.owed[0].attempts == 0);  // not attempted: no attempt counted
            CHECK(f.owed[0].due_in == 0ms);
        }
        h.engine.outcomes_written(0);
        h.step();
    }
    // The probe time: a claim may take one delivery for "down".
    h.clock.advance(500ms);
    CHECK(h.engine.circuit(0) == circuit_state::probing);
    h.engine.wake();
    h.step();
    const auto probe_claim = h.one<claim_command>();
    bool down_open = false;
    for (const auto& d : probe_claim.request.open_destinations) {
        if (d.name == "down") {
            down_open = true;
            CHECK(d.free == 1);
        }
    }
    CHECK(down_open);
    auto owed = make_event(3);
    owed.destination = "down";
    h.claim_returns({owed});
    const auto probe = h.one<send_command>();
    CHECK(probe.destination == 0);
    h.answer(probe, ok());
    CHECK(h.engine.circuit(0) == circuit_state::closed);
    const auto release = h.one<release_deliveries_command>();
    CHECK(release.destination == "down");
    CHECK_FALSE(release.just_one);
}

TEST_CASE("relay engine: the probe timer wakes the relay at the probe time") {
    auto cfg = one_destination(1);
    cfg.destinations[0].circuit = {1, 500ms, 5s};
    harness h(cfg);
    h.start();
    h.claim_returns({make_event(1)});
    h.answer(h.one<send_command>(), server_error());
    const auto probe = h.armed(relay_timer::circuit_probe);
    REQUIRE(probe);
    CHECK(probe->at == h.clock.now + 500ms);
    h.engine.outcomes_written(0);
    h.step();
    h.clock.advance(500ms);
    h.engine.timer_fired(relay_timer::circuit_probe, probe->generation);
    h.step();
    CHECK(h.has<claim_command>());
    // All it owes may wait out a backoff: the delivery due soonest becomes the probe.
    const auto nudge = h.one<release_deliveries_command>();
    CHECK(nudge.destination == "a");
    CHECK(nudge.just_one);
}

TEST_CASE("relay engine: live leases: a takeover at start and every second; leases handed back are claimed at once") {
    harness h(one_destination(4));
    (void)h.start();
    const auto takeovers = [&] {
        std::size_t n = 0;
        for (const auto& c : h.all<housekeeping_command>()) n += c.job == housekeeping_job::dead_relays ? 1 : 0;
        return n;
    };
    CHECK(takeovers() == 1);  // at once: a restarted relay picks up its predecessor's work
    const auto timer = h.armed(relay_timer::takeover);
    REQUIRE(timer);
    CHECK(timer->at == h.clock.now + relay_engine::takeover_interval);
    h.claim_returns({});

    h.clock.advance(relay_engine::takeover_interval);
    h.engine.timer_fired(relay_timer::takeover, timer->generation);
    h.step();
    CHECK(takeovers() == 1);
    REQUIRE(h.armed(relay_timer::takeover));
    CHECK_FALSE(h.has<claim_command>());

    // Nothing handed back: no claim. Some: a claim at once, from the
    // beginning, deliveries included.
    h.engine.relays_taken_over(0);
    h.step();
    CHECK_FALSE(h.has<claim_command>());
    h.engine.relays_taken_over(3);
    h.step();
    const auto claim = h.one<claim_command>();
    CHECK(claim.request.deliveries_due);
    CHECK_FALSE(claim.request.low_mark);
    CHECK_FALSE(claim.request.drain_watermark);
    h.claim_returns({});

    // After a signal: no more takeovers.
    const auto last = *h.armed(relay_timer::takeover);
    h.engine.signalled(15);
    h.step();
    h.engine.timer_fired(relay_timer::takeover, last.generation);
    h.step();
    CHECK(takeovers() == 0);
}

TEST_CASE("relay engine: live leases off: no takeover") {
    auto cfg = one_destination(4);
    cfg.live_leases = false;
    harness h(cfg);
    (void)h.start();
    CHECK(h.all<housekeeping_command>().empty());
    CHECK_FALSE(h.armed(relay_timer::takeover));
}

TEST_CASE("relay engine: the slow-request watch wakes every slow_check_interval at most, not once per send") {
    // Sends a few microseconds apart (a drain) each re-armed the timer for
    // the next one's deadline: a timer syscall and a wake-up per send.
    harness h(one_destination(4));
    h.start();
    h.claim_returns({make_event(1)});
    const auto first = h.armed(relay_timer::slow_requests);
    REQUIRE(first);
    h.clock.advance(1ms);
    h.engine.wake();
    h.step();
    h.claim_returns({make_event(2)});
    REQUIRE(h.engine.sending() == 2);
    h.clock.advance(slow_request_after - 1ms);
    h.engine.timer_fired(relay_timer::slow_requests, first->generation);
    h.step();
    CHECK(h.engine.sending() == 1);  // 1 gave up its slot; 2 is 1 ms from its deadline
    const auto next = h.armed(relay_timer::slow_requests);
    REQUIRE(next);
    CHECK(next->at >= h.clock.now + slow_check_interval);
}

TEST_CASE("relay engine: a slow request gives up its delivery slot; other destinations' events take it; shutdown "
          "still waits for the slow one") {
    auto cfg = one_destination(2);
    cfg.destinations = {destination("slow"), destination("fast")};
    cfg.routes = {{{"slow.>"}, {"slow"}}, {{"fast.>"}, {"fast"}}};
    harness h(cfg);
    h.start();
    h.claim_returns({make_event(1, std::nullopt, "slow.x"), make_event(2, std::nullopt, "slow.x")});
    const auto stuck = h.all<send_command>();
    REQUIRE(stuck.size() == 2);
    const auto watch = h.armed(relay_timer::slow_requests);
    REQUIRE(watch);
    CHECK(watch->at == h.clock.now + slow_request_after);
    CHECK(h.engine.sending() == 2);
    h.engine.wake();
    h.step();
    CHECK_FALSE(h.has<claim_command>());  // both slots taken
    h.clock.advance(slow_request_after);
    h.engine.timer_fired(relay_timer::slow_requests, watch->generation);
    h.step();
    CHECK(h.engine.sending() == 0);
    // The first slot given up starts a claim at once (one claim at a time).
    CHECK(h.one<claim_command>().request.wanted == 1);
    h.claim_returns({make_event(3, std::nullopt, "fast.x")});
    const auto quick = h.all<send_command>();
    REQUIRE(quick.size() == 1);
    CHECK(quick[0].destination == 1);
    h.answer(quick[0], ok());
    CHECK(h.engine.sending() == 0);
    // Shutdown waits for the slow ones: they may still be delivered.
    h.engine.outcomes_written(0);
    h.step();
    h.engine.signalled(15);
    h.step();
    if (h.has<write_outcomes_command>()) {
        h.engine.outcomes_written(0);
        h.step();
    }
    CHECK_FALSE(h.has<finish_command>());
    h.answer(stuck[0], ok());
    const auto first = h.one<write_outcomes_command>();
    CHECK(first.batch->delivered.size() == 1);
    CHECK_FALSE(h.has<finish_command>());
    h.answer(stuck[1], ok());
    CHECK_FALSE(h.has<finish_command>());
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.has<finish_command>());
}

// ---- run --once ----------------------------------------------------------------

namespace {

// A claim that leaves marks behind (a drain watermark, a low mark).
claim_outcome marked_claim(const harness& h, std::vector<event> events, bool deliveries_due = false) {
    claim_outcome o;
    o.started = h.clock.now;
    o.done = h.clock.now;
    o.events = std::move(events);
    o.deliveries_due = deliveries_due;
    o.drain_watermark = claim_watermark{};
    o.low_mark = "7";
    return o;
}

// The write under way is recorded, and every one the engine asks for after it.
void write_all(harness& h) {
    do {
        h.engine.outcomes_written(0);
        h.step();
    } while (h.has<write_outcomes_command>());
}

}  // namespace

TEST_CASE("relay engine: once: an empty outbox stops at the first claim's empty answer") {
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    (void)h.one<claim_command>();
    h.claim_returns({});
    CHECK(h.has<stop_listening_command>());
    CHECK(h.one<finish_command>().last.empty());
}

TEST_CASE("relay engine: once: drained only when a claim begun after the last write, from the start of the index "
          "with deliveries, finds nothing") {
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    h.engine.claimed(marked_claim(h, {make_event(1), make_event(2)}));
    h.step();
    auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    h.answer(sends[0], ok());
    h.answer(sends[1], ok());
    CHECK_FALSE(h.has<finish_command>());
    write_all(h);
    // Idle: a confirming claim, deliveries included, no marks.
    auto confirm = h.one<claim_command>();
    CHECK(confirm.request.deliveries_due);
    CHECK_FALSE(confirm.request.drain_watermark);
    CHECK_FALSE(confirm.request.low_mark);
    // It finds more (committed meanwhile): they are delivered, and a new confirmation follows.
    h.engine.claimed(marked_claim(h, {make_event(3)}));
    h.step();
    CHECK_FALSE(h.has<finish_command>());
    h.answer(h.one<send_command>(), ok());
    write_all(h);
    confirm = h.one<claim_command>();
    CHECK(confirm.request.deliveries_due);
    CHECK_FALSE(confirm.request.low_mark);
    h.claim_returns({});
    CHECK(h.has<finish_command>());
}

TEST_CASE("relay engine: once: a confirming claim that came back full but empty goes on; drained when the claims "
          "after it, to one less than full, found nothing") {
    // A claim that examined its bound of rows, all of keys blocked (their
    // first events are retrying), takes nothing and comes back full: what
    // lies behind those rows is not known yet. Stopping there would leave
    // events due; claiming from the start again would meet the same rows,
    // for ever.
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    auto confirm = h.one<claim_command>();
    h.claim_returns({}, true);
    CHECK_FALSE(h.has<finish_command>());
    // Behind them, one more full and empty, then the end: drained.
    auto next = h.one<claim_command>();
    h.claim_returns({}, true);
    CHECK_FALSE(h.has<finish_command>());
    next = h.one<claim_command>();
    h.claim_returns({});
    CHECK(h.has<finish_command>());
}

TEST_CASE("relay engine: once: what the claims after a full and empty confirming claim find is delivered first") {
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    (void)h.one<claim_command>();
    h.claim_returns({}, true);
    (void)h.one<claim_command>();
    h.claim_returns({make_event(7)});
    CHECK_FALSE(h.has<finish_command>());
    h.answer(h.one<send_command>(), ok());
    write_all(h);
    // A new confirmation from the start, which finds nothing.
    const auto confirm = h.one<claim_command>();
    CHECK_FALSE(confirm.request.drain_watermark);
    h.claim_returns({});
    CHECK(h.has<finish_command>());
}

TEST_CASE("relay engine: once: a retry that falls due while the run is busy is sent; one due later is left") {
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    h.claim_returns({make_event(1), make_event(2)});
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    h.answer(sends[0], server_error());  // event 1 retries
    h.gather_window_ends();
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->fan_outs.size() == 1);
    REQUIRE(write.batch->fan_outs[0].owed.size() == 1);
    CHECK(write.batch->fan_outs[0].owed[0].due_in > 0ms);
    h.engine.outcomes_written(0);
    h.step();
    const auto due = h.armed(relay_timer::next_due);
    REQUIRE(due);
    // Event 2 is still being sent when the retry falls due: it is claimed and sent.
    h.clock.advance(std::chrono::duration_cast<milliseconds>(due->at - h.clock.now));
    h.engine.timer_fired(relay_timer::next_due, due->generation);
    h.step();
    (void)h.one<claim_command>();
    auto retried = make_event(1);
    retried.attempt = 2;
    h.claim_returns({retried});
    const auto again = h.one<send_command>();
    CHECK(again.e->id == 1);
    h.answer(again, server_error());  // fails again: due later
    h.answer(sends[1], ok());
    write_all(h);
    // Not waited for: the confirming claim finds nothing due, and the run ends.
    (void)h.one<claim_command>();
    h.claim_returns({});
    CHECK(h.has<finish_command>());
}

TEST_CASE("relay engine: once: leases taken over during the confirming claim need another one") {
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    h.engine.relays_taken_over(2);
    h.step();
    h.claim_returns({});
    CHECK_FALSE(h.has<finish_command>());
    int claims = 0;
    for (; claims < 3 && !h.has<finish_command>(); ++claims) {
        (void)h.one<claim_command>();
        h.claim_returns({});
    }
    CHECK(h.has<finish_command>());
    CHECK(claims >= 1);
}

TEST_CASE("relay engine: once: a failed claim does not end the run and is retried after its backoff only") {
    harness h(one_destination(4));
    h.engine.start("msg_", run_mode::once);
    h.step();
    h.engine.claim_failed("connection lost");
    h.step();
    CHECK_FALSE(h.has<claim_command>());
    CHECK_FALSE(h.has<finish_command>());
    const auto retry = h.armed(relay_timer::claim_retry);
    REQUIRE(retry);
    h.clock.advance(std::chrono::duration_cast<milliseconds>(retry->at - h.clock.now));
    h.engine.timer_fired(relay_timer::claim_retry, retry->generation);
    h.step();
    (void)h.one<claim_command>();
    h.claim_returns({});  // not a confirming claim (it began after a failure): one more
    (void)h.one<claim_command>();
    h.claim_returns({});
    CHECK(h.has<finish_command>());
}

TEST_CASE("relay engine: serve mode never stops by itself") {
    harness h(one_destination(4));
    h.start();
    h.claim_returns({});
    CHECK_FALSE(h.has<finish_command>());
    CHECK_FALSE(h.has<claim_command>());
}

// ---- reload ----------------------------------------------------------------------

TEST_CASE("relay engine: a reload stops claiming but keeps listening, hands back what is not sent, lets the "
          "request in flight finish, writes, then finishes") {
    harness h(one_destination(1));
    h.start();
    h.claim_returns({make_event(1), make_event(2)});
    const auto in_flight = h.one<send_command>();
    h.engine.reload_requested();
    h.step();
    CHECK_FALSE(h.has<stop_listening_command>());
    REQUIRE(h.one<write_outcomes_command>().batch->handed_back.size() == 1);
    h.engine.wake();
    h.step();
    CHECK_FALSE(h.has<claim_command>());
    h.engine.outcomes_written(0);
    h.step();
    CHECK_FALSE(h.has<finish_command>());
    h.answer(in_flight, ok());
    CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.has<finish_command>());
    CHECK(h.engine.finished_running());
    // A second reload (or a signal's first) while stopping changes nothing.
    h.engine.reload_requested();
    h.step();
    CHECK(h.last.empty());
}

TEST_CASE("relay engine: what a claim under way at a reload or a shutdown brings back is handed back unsent") {
    // The claim was asked for before the signal and answers after it. Sent,
    // its events would go out under the configuration a reload replaces
    // (seen in the e2e test of a SIGHUP that moves work to a new
    // destination: an event written after "reloading" went to the old one).
    for (const bool reload : {true, false}) {
        CAPTURE(reload);
        harness h(one_destination(4));
        h.start();
        h.claim_returns({make_event(1)}, true);
        const auto in_flight = h.one<send_command>();
        REQUIRE(h.has<claim_command>());  // came back full: the next claim, under way
        if (reload) {
            h.engine.reload_requested();
        } else {
            h.engine.signalled(15);
        }
        h.step();
        h.claim_returns({make_event(2), make_event(3, "k")});
        CHECK_FALSE(h.has<send_command>());
        CHECK_FALSE(h.has<claim_command>());
        const auto write = h.one<write_outcomes_command>();
        REQUIRE(write.batch->handed_back.size() == 2);
        CHECK(write.batch->handed_back[0].ref.id == 2);
        CHECK(write.batch->handed_back[1].ref.id == 3);
        CHECK(write.batch->handed_back[0].delay == 0ms);
        CHECK(write.batch->unblocks_key);
        h.engine.outcomes_written(0);
        h.step();
        CHECK_FALSE(h.has<finish_command>());  // event 1 is still being sent
        h.answer(in_flight, ok());
        CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
        h.engine.outcomes_written(0);
        h.step();
        CHECK(h.has<finish_command>());
    }
}

TEST_CASE("relay engine: a circuit that opens or closes is published") {
    auto cfg = one_destination(1);
    cfg.destinations[0].circuit = {2, 500ms, 5s};
    harness h(cfg);
    h.start();
    h.claim_returns({make_event(1)});
    h.answer(h.one<send_command>(), server_error());
    CHECK_FALSE(h.has<circuit_changed_command>());
    write_all(h);
    h.engine.wake();
    h.step();
    h.claim_returns({make_event(2)});
    h.answer(h.one<send_command>(), server_error());
    const auto opened = h.one<circuit_changed_command>();
    CHECK(opened.destination == "a");
    CHECK(opened.state == circuit_state::open);
    CHECK(opened.failures == 2);
    write_all(h);
    h.clock.advance(500ms);
    h.engine.wake();
    h.step();
    h.claim_returns({make_event(3)});
    h.answer(h.one<send_command>(), ok());
    CHECK(h.one<circuit_changed_command>().state == circuit_state::closed);
}

TEST_CASE("relay engine: while every destination's circuit is open nothing is claimed; one event per probe") {
    auto cfg = one_destination(4);
    cfg.destinations[0].circuit = {1, 500ms, 1s};
    harness h(cfg);
    h.start();
    h.claim_returns({make_event(1)});
    h.answer(h.one<send_command>(), server_error());
    CHECK(h.engine.circuit(0) == circuit_state::open);
    h.engine.outcomes_written(0);
    h.step();
    // Notifications while it is open: the events stay in the outbox, untouched.
    h.engine.wake();
    h.step();
    CHECK_FALSE(h.has<claim_command>());
    h.clock.advance(500ms);
    h.engine.wake();
    h.step();
    CHECK(h.one<claim_command>().request.wanted == 1);  // the probe
    h.claim_returns({make_event(2)});
    h.answer(h.one<send_command>(), ok());
    CHECK(h.engine.circuit(0) == circuit_state::closed);
}

TEST_CASE("relay engine: one built on relay.consume = \"auto\", not settled into a mode, refuses to start") {
    auto cfg = one_destination(4);
    cfg.consume = "auto";
    fake_clock clock;
    relay_engine engine(cfg, clock, 1);
    CHECK_THROWS_AS(engine.start("m_"), std::logic_error);
}

// ---- relay.consume = "windows" ------------------------------------------------

namespace {

config windows_config(std::size_t concurrency = 4) {
    auto c = one_destination(concurrency);
    c.consume = "windows";
    return c;
}

std::vector<taken_cursor> cursors_at(const std::string& a) {
    std::vector<taken_cursor> out;
    for (int s = 0; s < window_slots; ++s) out.push_back({s, a, std::nullopt, 0, 3});
    return out;
}

window_event_read window_event(std::int64_t id, std::optional<std::string> key = std::nullopt) {
    window_event_read r;
    r.e = make_event(id, std::move(key));
    r.e.attempt = 0;
    r.slot = static_cast<int>(id % window_slots);
    return r;
}

// Starts a windows engine, gives it every cursor at "1:1:", and returns the
// claim that reads the first window.
claim_command start_reading(harness& h) {
    const auto first = h.start();
    CHECK(first.request.windows);
    CHECK_FALSE(first.request.window);  // no cursor yet
    CHECK(h.engine.windows() != nullptr);
    h.engine.cursors_taken(cursors_at("1:1:"), 64);
    h.claim_returns({});
    return h.one<claim_command>();
}

// Starts a windows engine that takes every cursor at "1:1:" (its first
// claim found nothing); returns the checkpoint timer it armed.
auto start_holding_cursors(harness& h) {
    h.engine.start("msg_0000000000000001_");
    h.step();
    const auto timer = *h.armed(relay_timer::checkpoint);
    h.claim_returns({});
    h.engine.cursors_taken(cursors_at("1:1:"), 64);
    h.step();
    return timer;
}

void page_returns(harness& h, std::vector<window_event_read> events, bool full = false) {
    claim_outcome o;
    o.window = window_page{"9:9:", std::move(events), full};
    h.claim_comes_back(std::move(o));
}

}  // namespace

TEST_CASE("relay engine, windows: a key's events go out one at a time with no write between them; the "
          "checkpoint moves past them") {
    harness h(windows_config(4));
    h.engine.start("msg_0000000000000001_");
    h.step();
    CHECK(h.has<take_cursors_command>());
    CHECK(h.armed(relay_timer::checkpoint));
    h.claim_returns({});
    h.engine.cursors_taken(cursors_at("1:1:"), 64);
    h.step();
    const auto read = h.one<claim_command>();
    REQUIRE(read.request.window);
    CHECK(read.request.window->snap_a == "1:1:");
    CHECK_FALSE(read.request.window->slots);

    page_returns(h, {window_event(1, "k"), window_event(2, "k"), window_event(3, "k"), window_event(4)});
    auto sends = h.all<send_command>();
    CHECK(ids(sends) == std::vector<std::int64_t>{1, 4});
    CHECK(sends[0].e->attempt == 1);
    for (std::int64_t next = 2; next <= 3; ++next) {
        h.answer(sends[0], ok());
        CHECK_FALSE(h.has<write_outcomes_command>());  // nothing to write for a delivered window event
        sends = h.all<send_command>();
        REQUIRE(sends.size() == 1);
        CHECK(sends[0].e->id == next);
    }
    h.answer(sends[0], ok());
    CHECK(h.engine.windows()->in_flight() == 1);  // 4
    CHECK_FALSE(h.has<write_outcomes_command>());
}

TEST_CASE("relay engine, windows: the checkpoint is written once a second when it moved; cleanup follows it") {
    harness h(windows_config(4));
    auto timer = start_holding_cursors(h);
    page_returns(h, {window_event(1), window_event(2)});
    const auto sends = h.all<send_command>();
    REQUIRE(sends.size() == 2);
    h.answer(sends[0], ok());
    h.answer(sends[1], ok());
    h.clock.advance(relay_engine::checkpoint_interval);
    h.engine.timer_fired(relay_timer::checkpoint, timer.generation);
    h.step();
    const auto checkpoint = h.one<checkpoint_command>();
    CHECK(checkpoint.position.snap_a == "9:9:");  // the window ended and settled: its B
    CHECK_FALSE(checkpoint.position.snap_b);
    CHECK(checkpoint.position.epochs.front() == 3);
    timer = *h.armed(relay_timer::checkpoint);
    h.engine.checkpointed(checkpoint.position, checkpoint.position.slots.size());
    h.step();
    CHECK(h.one<housekeeping_command>().job == housekeeping_job::window_cleanup);
    h.clock.advance(relay_engine::checkpoint_interval);
    h.engine.timer_fired(relay_timer::checkpoint, timer.generation);
    h.step();
    CHECK_FALSE(h.has<checkpoint_command>());  // nothing moved
}

TEST_CASE("relay engine, windows: checkpoints come further apart while a transaction runs long") {
    harness h(windows_config(4));
    auto timer = start_holding_cursors(h);
    // Every second a window with one event, its B showing xid 100 still
    // running (`held`), or nothing running at all.
    std::int64_t id = 0;
    const auto second = [&](bool held) {
        h.engine.wake();  // a notification: the next window is read
        h.step();
        (void)h.all<claim_command>();
        ++id;
        claim_outcome o;
        const auto xmax = std::to_string(400 + id);
        o.window = window_page{held ? "100:" + xmax + ":100" : xmax + ":" + xmax + ":", {window_event(id)}, false};
        o.started = h.clock.now;
        o.done = h.clock.now;
        h.engine.claimed(std::move(o));
        h.step();
        for (const auto& s : h.all<send_command>()) h.answer(s, ok());
        h.clock.advance(relay_engine::checkpoint_interval);
        h.engine.timer_fired(relay_timer::checkpoint, timer.generation);
        h.step();
        timer = *h.armed(relay_timer::checkpoint);
        const auto checkpoints = h.all<checkpoint_command>();
        for (const auto& c : checkpoints) h.engine.checkpointed(c.position, c.position.slots.size());
        h.step();
        (void)h.all<housekeeping_command>();
        return checkpoints.size();
    };
    std::size_t written = 0;
    for (int s = 0; s < 30; ++s) written += second(true);
    CHECK(written == 30);  // the first 30 s: once a second
    written = 0;
    for (int s = 30; s < 120; ++s) written += second(true);
    // held / 30: every 1-4 s over the next 90 s (about 30 + 30 ln 4 = 72 in all)
    CHECK(written >= 35);
    CHECK(written <= 50);
    // It ended: once a second again at once.
    written = 0;
    for (int s = 0; s < 10; ++s) written += second(false);
    CHECK(written == 10);
}

TEST_CASE("relay engine, windows: a failed event is parked, and its key's later events behind it, in order") {
    harness h(windows_config(4));
    (void)start_reading(h);
    page_returns(h, {window_event(1, "k"), window_event(2, "k"), window_event(3)});
    auto sends = h.all<send_command>();
    REQUIRE(ids(sends) == std::vector<std::int64_t>{1, 3});
    h.answer(sends[0], server_error());
    auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->parks.size() == 1);
    CHECK(write.batch->parks[0].id == 1);
    CHECK(write.batch->parks[0].epoch == 3);
    REQUIRE(write.batch->parks[0].owed.size() == 1);
    CHECK(write.batch->parks[0].owed[0].destination == "a");
    CHECK(write.batch->parks[0].owed[0].attempts == 1);
    CHECK_FALSE(h.has<send_command>());  // 2 is not sent: its key is parked
    h.engine.outcomes_written(0);
    h.step();
    // Recorded: its deliveries are due, and the next claim asks for them.
    const auto claims = h.all<claim_command>();
    REQUIRE_FALSE(claims.empty());
    CHECK(claims.back().request.deliveries_due);
    write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->parks.size() == 1);
    CHECK(write.batch->parks[0].id == 2);
    CHECK(write.batch->parks[0].owed[0].due_in == 0ms);
    CHECK(write.batch->parks[0].owed[0].attempts == 0);
    h.engine.outcomes_written(0);
    h.step();
    h.answer(sends[1], ok());
    CHECK_FALSE(h.has<write_outcomes_command>());
    CHECK(h.engine.windows()->in_flight() == 0);
}

TEST_CASE("relay engine, windows: a smaller share (another relay registered) hands the surplus over as soon as "
          "it is known, not at the next tick") {
    harness h(windows_config(4));
    (void)start_reading(h);
    page_returns(h, {});  // the window read nothing: every cursor is at a boundary
    CHECK_FALSE(h.has<release_cursors_command>());
    // The answer to a take_cursors_command: nothing free, and two relays alive.
    h.engine.cursors_taken({}, 32);
    h.step();
    const auto release = h.one<release_cursors_command>();
    CHECK(release.position.slots.size() == 32);
    CHECK(h.engine.windows()->slots_held() == 32);
}

TEST_CASE("relay engine, windows: a checkpoint fenced out drops the cursors; shutdown hands the position over") {
    SUBCASE("fenced") {
        harness h(windows_config(4));
        (void)start_reading(h);
        page_returns(h, {window_event(1)});
        const auto send = h.one<send_command>();
        h.answer(send, ok());
        const auto checkpoint = *h.engine.windows()->checkpoint();
        h.engine.checkpointed(checkpoint, 0);
        h.step();
        CHECK_FALSE(h.engine.windows()->holding());
    }
    SUBCASE("shutdown") {
        harness h(windows_config(4));
        (void)start_reading(h);
        page_returns(h, {window_event(1), window_event(2)});
        const auto sends = h.all<send_command>();
        h.answer(sends[1], ok());
        h.engine.signalled(15);
        h.step();
        CHECK_FALSE(h.has<finish_command>());  // 1 is still being sent
        h.answer(sends[0], ok());
        const auto finish = h.one<finish_command>();
        REQUIRE(finish.cursors);
        CHECK(finish.cursors->snap_a == "9:9:");
        CHECK(finish.cursors->slots.size() == 64);
        CHECK(finish.last.empty());
    }
}

TEST_CASE("relay engine, windows: events held back for their key do not make it read again; a full queue "
          "reads again once half of it is free, not for every event handed out") {
    harness h(windows_config(4));
    (void)start_reading(h);
    SUBCASE("held back for their key") {
        page_returns(h, {window_event(1, "k"), window_event(2, "k"), window_event(3, "k")});
        CHECK(h.all<send_command>().size() == 1);
        CHECK_FALSE(h.has<claim_command>());  // 2 and 3 wait for 1, not for the database
    }
    SUBCASE("a full queue") {
        const auto limit = static_cast<std::int64_t>(relay_engine::window_queue_limit);
        std::vector<window_event_read> page;
        for (std::int64_t id = 1; id <= limit; ++id) page.push_back(window_event(id, "k"));  // one at a time
        page_returns(h, std::move(page), true);
        auto send = h.one<send_command>();
        // The page was full: room for the one event handed out is not room
        // for a read (a statement for one event).
        auto again = h.one<claim_command>();
        CHECK_FALSE(again.request.window);
        h.claim_returns({});
        CHECK_FALSE(h.has<claim_command>());
        // Sent one by one until the queue is half empty: then a read.
        bool read = false;
        for (std::int64_t i = 0; i < limit && !read; ++i) {
            h.answer(send, ok());
            for (const auto& c : h.all<claim_command>()) read = read || c.request.window.has_value();
            send = h.one<send_command>();
        }
        CHECK(read);
        CHECK(h.engine.windows()->queued() < relay_engine::window_queue_limit / 2);
    }
}

namespace {

// A follower of the run that `head` begins (see the claim in queries.sql).
event follower(std::int64_t id, std::int64_t head, std::string key = "k") {
    auto e = make_event(id, std::move(key));
    e.run_head = head;
    e.hold = fmt::format("hold of {}", head);  // not leased: fenced on its run's hold
    return e;
}

}  // namespace

TEST_CASE("relay engine: a run goes out one event at a time in id order; its outcomes gather until the run ends") {
    harness h(one_destination(4));
    h.start();
    // The claim's rows come in no particular order.
    h.claim_returns({follower(5, 1), make_event(1, "k"), follower(3, 1), make_event(2)});
    auto sends = h.all<send_command>();
    REQUIRE(ids(sends) == std::vector<std::int64_t>{1, 2});
    CHECK(h.engine.held() == 4);
    h.answer(sends[1], ok());  // the unkeyed one
    h.answer(sends[0], ok());
    // Event 1 delivered: event 3 goes at once; nothing of the key is
    // unblocked yet, so its outcome waits with the rest.
    REQUIRE(ids(h.all<send_command>()) == std::vector<std::int64_t>{3});
    CHECK_FALSE(h.has<write_outcomes_command>());
    h.answer(h.one<send_command>(), ok());
    REQUIRE(ids(h.all<send_command>()) == std::vector<std::int64_t>{5});
    CHECK_FALSE(h.has<write_outcomes_command>());
    h.answer(h.one<send_command>(), ok());
    // The run's last: the key is free once this is written, so now.
    const auto write = h.one<write_outcomes_command>();
    std::vector<std::int64_t> delivered;
    for (const auto& r : write.batch->delivered) delivered.push_back(r.id);
    CHECK(delivered == std::vector<std::int64_t>{2, 1, 3, 5});
    // Each outcome carries what it is fenced on: a lease, or the run's hold.
    for (const auto& r : write.batch->delivered) CHECK(r.hold == (r.id > 2 ? "hold of 1" : ""));
    CHECK(write.batch->unblocks_key);
    CHECK(write.batch->handed_back.empty());
}

TEST_CASE("relay engine: an event of a run that is not delivered hands the unsent rest back untouched") {
    harness h(one_destination(4));
    h.start();
    h.claim_returns({make_event(1, "k"), follower(2, 1), follower(3, 1), follower(4, 1)});
    h.answer(h.one<send_command>(), ok());
    REQUIRE(ids(h.all<send_command>()) == std::vector<std::int64_t>{2});
    h.answer(h.one<send_command>(), server_error());
    // 3 and 4 are never sent: back to the outbox with their attempts taken
    // back, written with 2's retry and 1's delivery.
    CHECK_FALSE(h.has<send_command>());
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->delivered.size() == 1);
    CHECK(write.batch->delivered[0].id == 1);
    // (a destination that failed gets a delivery row of its own: fanned out)
    REQUIRE(write.batch->fan_outs.size() == 1);
    CHECK(write.batch->fan_outs[0].ref.id == 2);
    CHECK(write.batch->fan_outs[0].ref.hold == "hold of 1");
    REQUIRE(write.batch->handed_back.size() == 2);
    CHECK(write.batch->handed_back[0].ref.id == 3);
    CHECK(write.batch->handed_back[0].ref.hold == "hold of 1");
    CHECK(write.batch->handed_back[0].delay == 0ms);
    CHECK(write.batch->handed_back[1].ref.id == 4);
    CHECK(write.batch->unblocks_key);
    CHECK(h.engine.held() == 0);
    // Recorded: the key may go on, from the start of the index.
    h.engine.outcomes_written(0);
    h.step();
    const auto claim = h.one<claim_command>();
    CHECK(claim.request.wanted > 0);
    CHECK_FALSE(claim.request.low_mark);
}

TEST_CASE("relay engine: followers whose run's first event the claim did not lease are handed back unsent") {
    harness h(one_destination(4));
    h.start();
    h.claim_returns({follower(7, 6), follower(8, 6), make_event(9)});
    REQUIRE(ids(h.all<send_command>()) == std::vector<std::int64_t>{9});
    // Written at once: the key's hold goes with them.
    const auto write = h.one<write_outcomes_command>();
    REQUIRE(write.batch->handed_back.size() == 2);
    CHECK(write.batch->handed_back[0].ref.id == 7);
    CHECK(write.batch->handed_back[1].ref.id == 8);
    CHECK(write.batch->unblocks_key);
    CHECK(h.engine.held() == 1);  // 9, in flight
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.one<claim_command>().request.wanted > 0);
}

TEST_CASE("relay engine: shutdown hands back a run's waiting followers; the event in flight finishes alone") {
    harness h(one_destination(4));
    h.start();
    h.claim_returns({make_event(1, "k"), follower(2, 1), follower(3, 1)});
    const auto in_flight = h.one<send_command>();
    h.engine.signalled(15);
    h.step();
    const auto handed_back = h.one<write_outcomes_command>();
    REQUIRE(handed_back.batch->handed_back.size() == 2);
    CHECK(handed_back.batch->handed_back[0].ref.id == 2);
    CHECK(handed_back.batch->handed_back[1].ref.id == 3);
    h.engine.outcomes_written(0);
    h.step();
    h.answer(in_flight, ok());
    CHECK_FALSE(h.has<send_command>());
    CHECK(h.one<write_outcomes_command>().batch->delivered.size() == 1);
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.has<finish_command>());
}

TEST_CASE("relay engine: handing a run's rest back frees its slots for the claim a drain wants") {
    harness h(one_destination(4));
    h.start();
    // A full claim (a backlog drains): every slot is taken, the next claim
    // waits for free ones.
    h.claim_returns({make_event(1, "k"), follower(2, 1), follower(3, 1), make_event(4)}, true);
    CHECK_FALSE(h.has<claim_command>());
    const auto sends = h.all<send_command>();
    REQUIRE(ids(sends) == std::vector<std::int64_t>{1, 4});
    // 1 fails: 2 and 3 go back unsent, and their slots to the drain's next
    // claim (which the dispatcher counts as started once it names a size).
    h.answer(sends[0], server_error());
    REQUIRE(h.has<claim_command>());
    h.answer(sends[1], ok());
    h.claim_returns({});
    h.engine.outcomes_written(0);
    h.step();
    CHECK(h.has<claim_command>());
}

TEST_CASE("relay engine: events are claimed without the per-key part until a claim picks a keyed event, then "
          "with it for a second after the last one that did") {
    harness h(one_destination(4));
    const auto first = h.start();
    CHECK(first.request.unkeyed_first);
    const auto claim_comes_back = [&](bool picked_keyed) {
        claim_outcome o;
        o.picked_keyed = picked_keyed;
        o.started = h.clock.now;
        o.done = h.clock.now;
        h.engine.claimed(std::move(o));
        h.step();
    };
    const auto next_claim = [&] {
        h.engine.wake();
        h.step();
        return h.one<claim_command>().request.unkeyed_first;
    };
    claim_comes_back(true);
    CHECK_FALSE(next_claim());
    h.clock.advance(900ms);
    claim_comes_back(false);
    CHECK_FALSE(next_claim());
    h.clock.advance(100ms);
    claim_comes_back(false);
    CHECK(next_claim());
}
