#include "core/relay_metrics.hpp"

#include <doctest/doctest.h>

#include "fake_clock.hpp"

#include <chrono>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/relay_engine.hpp"

// What the relay engine reports to its metrics observer, on simulated time.

using namespace outboxd;
using namespace std::chrono_literals;

namespace {

using testing::fake_clock;

struct report {
    std::string destination;
    delivery_result result;
    std::int32_t attempt;
    std::optional<std::chrono::microseconds> since_commit;
};

struct recorder final : relay_metrics {
    void delivery(std::string_view d, delivery_result r, std::int32_t a,
                  std::optional<std::chrono::microseconds> s) override {
        reports.push_back({std::string(d), r, a, s});
    }
    void claimed(std::size_t n) override { claims.push_back(n); }
    void claim_failed(std::string_view why) override { failures.emplace_back(why); }
    void woken(wake_source s) override { wakes.push_back(s); }
    std::vector<report> reports;
    std::vector<std::size_t> claims;
    std::vector<std::string> failures;
    std::vector<wake_source> wakes;
};

destination_config destination(std::string name, std::size_t max_concurrency = 32) {
    destination_config d;
    d.name = std::move(name);
    d.connect_timeout = 1s;
    d.request_timeout = 2s;
    d.max_concurrency = max_concurrency;
    d.retry.max_attempts = 2;
    return d;
}

config two_destinations() {
    config c;
    c.consume = "claims";  // as a relay settles relay.consume = "auto"
    c.concurrency = 4;
    c.lease = 30s;
    c.sweep_interval = 30s;
    c.destinations.push_back(destination("a"));
    c.destinations.push_back(destination("b", 1));
    c.routes.push_back({{"orders.>"}, {"a", "b"}});
    return c;
}

event make_event(std::int64_t id, std::string topic = "orders.created", std::int32_t attempt = 1) {
    event e;
    e.id = id;
    e.topic = std::move(topic);
    e.payload = "{}";
    e.attempt = attempt;
    e.age_at_claim = 250ms;
    return e;
}

send_result status(unsigned s) {
    send_result r;
    r.status = s;
    return r;
}

struct harness {
    harness() : cfg(two_destinations()), engine(cfg, clock, 7) {
        log::set_level(log::level::error);
        engine.observe(&seen);
    }
    ~harness() { log::set_level(log::level::info); }
    std::vector<send_command> claim(std::vector<event> events) {
        claim_outcome o;
        o.events = std::move(events);
        o.started = clock.now;
        o.done = clock.now;
        engine.claimed(std::move(o));
        std::vector<send_command> sends;
        for (auto& c : engine.take_commands()) {
            if (auto* s = std::get_if<send_command>(&c)) sends.push_back(*s);
        }
        return sends;
    }
    config cfg;
    fake_clock clock;
    relay_engine engine;
    recorder seen;
};

}  // namespace

TEST_CASE("relay metrics: each destination's result is reported with its attempt; latency since commit when delivered") {
    harness h;
    h.engine.start("msg_1_");
    (void)h.engine.take_commands();
    const auto sends = h.claim({make_event(1)});
    REQUIRE(sends.size() == 2);
    CHECK(h.seen.claims == std::vector<std::size_t>{1});
    h.clock.now += 40ms;
    h.engine.sent(sends[0].send_id, status(200));
    h.engine.sent(sends[1].send_id, status(503));
    REQUIRE(h.seen.reports.size() == 2);
    const auto& delivered = h.seen.reports[0];
    CHECK(delivered.destination == "a");
    CHECK(delivered.result == delivery_result::delivered);
    CHECK(delivered.attempt == 1);
    // 250 ms old when claimed, delivered 40 ms after the claim began.
    CHECK(delivered.since_commit == std::chrono::microseconds(290'000));
    const auto& failed = h.seen.reports[1];
    CHECK(failed.destination == "b");
    CHECK(failed.result == delivery_result::retry);
    CHECK_FALSE(failed.since_commit);
}

TEST_CASE("relay metrics: the last attempt's failure is dead; no route is the event's own (destination \"\")") {
    harness h;
    h.engine.start("msg_1_");
    (void)h.engine.take_commands();
    auto e = make_event(2, "orders.created", 2);
    e.destination = "a";  // a fanned-out delivery at its last attempt
    const auto sends = h.claim({e, make_event(3, "nobody.listens")});
    REQUIRE(sends.size() == 1);
    h.engine.sent(sends[0].send_id, status(500));
    REQUIRE(h.seen.reports.size() == 2);
    CHECK(h.seen.reports[0].destination == "");
    CHECK(h.seen.reports[0].result == delivery_result::retry);
    CHECK(h.seen.reports[1].destination == "a");
    CHECK(h.seen.reports[1].result == delivery_result::dead);
    CHECK(h.seen.reports[1].attempt == 2);
}

TEST_CASE("relay metrics: a destination without a free connection is reported handed back, not attempted") {
    harness h;
    h.engine.start("msg_1_");
    (void)h.engine.take_commands();
    // b takes one request at a time: the second event goes to a only.
    const auto sends = h.claim({make_event(4), make_event(5)});
    CHECK(sends.size() == 3);
    for (const auto& s : sends) {
        if (s.e->id == 5) h.engine.sent(s.send_id, status(200));
    }
    REQUIRE(h.seen.reports.size() == 2);
    CHECK(h.seen.reports[0].destination == "a");
    CHECK(h.seen.reports[0].result == delivery_result::delivered);
    CHECK(h.seen.reports[1].destination == "b");
    CHECK(h.seen.reports[1].result == delivery_result::handed_back);
    CHECK(h.seen.reports[1].attempt == 0);
}

TEST_CASE("relay metrics: sweeps and due timers are wake-ups; claim failures carry their reason") {
    harness h;
    h.engine.start("msg_1_");
    arm_timer_command sweep;
    for (auto& c : h.engine.take_commands()) {
        if (auto* a = std::get_if<arm_timer_command>(&c); a && a->timer == relay_timer::sweep) sweep = *a;
    }
    h.engine.claim_failed("connection refused");
    CHECK(h.seen.failures == std::vector<std::string>{"connection refused"});
    h.clock.now += 30s;
    h.engine.timer_fired(relay_timer::sweep, sweep.generation);
    REQUIRE(h.seen.wakes.size() == 1);
    CHECK(h.seen.wakes[0] == wake_source::sweep);
}
