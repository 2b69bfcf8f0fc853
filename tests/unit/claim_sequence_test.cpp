#include "core/claim_sequence.hpp"

#include <doctest/doctest.h>

#include <deque>
#include <string>
#include <vector>

// The claim's statements, run against a script: which statement, in which
// order, from where, and what the next claim starts from.

using namespace outboxd;
using namespace std::chrono_literals;

namespace {

struct call {
    std::string what;  // "events" or "deliveries"
    std::size_t size = 0;
    std::optional<claim_watermark> after;
    std::optional<std::string> low_mark;
    std::vector<std::string> destinations = {};
};

class scripted_port final : public claim_port {
public:
    claim_result claim_events(std::size_t size, std::chrono::milliseconds, const std::optional<claim_watermark>& after,
                              const std::optional<std::string>& low_mark, bool unkeyed) override {
        calls.push_back({unkeyed ? "unkeyed events" : "events", size, after, low_mark});
        REQUIRE_FALSE(event_answers.empty());
        auto r = std::move(event_answers.front());
        event_answers.pop_front();
        return r;
    }
    std::vector<event> claim_deliveries(std::size_t size, std::chrono::milliseconds,
                                        std::span<const std::string> destinations) override {
        calls.push_back({"deliveries", size, {}, {}, {destinations.begin(), destinations.end()}});
        REQUIRE_FALSE(delivery_answers.empty());
        auto r = std::move(delivery_answers.front());
        delivery_answers.pop_front();
        return r;
    }
    std::size_t release_untracked(const held_leases& keep) override {
        calls.push_back({"release", keep.events.size() + keep.delivery_ids.size(), {}, {}, keep.delivery_destinations});
        return released;
    }
    window_read_result read_window(const window_read_request& r) override {
        calls.push_back({"window", r.limit, {}, {}, {}});
        REQUIRE_FALSE(window_answers.empty());
        auto a = std::move(window_answers.front());
        window_answers.pop_front();
        return a;
    }
    std::deque<window_read_result> window_answers;
    std::deque<claim_result> event_answers;
    std::deque<std::vector<event>> delivery_answers;
    std::size_t released = 0;
    std::vector<call> calls;
};

std::vector<event> events(std::int64_t first, std::size_t n) {
    std::vector<event> out;
    for (std::size_t i = 0; i < n; ++i) {
        event e;
        e.id = first + static_cast<std::int64_t>(i);
        out.push_back(e);
    }
    return out;
}

claim_result picked(std::int64_t first, std::size_t n, std::string low_mark = "low") {
    claim_result r;
    r.events = events(first, n);
    r.picked = n;
    if (n > 0) r.last = claim_watermark{"t", first + static_cast<std::int64_t>(n) - 1};
    r.low_mark = std::move(low_mark);
    return r;
}

claim_request request(std::size_t wanted) {
    claim_request r;
    r.wanted = wanted;
    r.lease = 30s;
    r.open_destinations = {{"a", 64}};
    r.deliveries_due = false;
    return r;
}

// A claim that goes first without the per-key part.
claim_request unkeyed_first(std::size_t wanted) {
    auto r = request(wanted);
    r.unkeyed_first = true;
    return r;
}

// A claim while a backlog drains, after one that saw deliveries due: the
// deliveries go first.
claim_request draining_with_deliveries_due(std::size_t wanted) {
    auto r = request(wanted);
    r.deliveries_due = true;
    r.drain_watermark = claim_watermark{"t", 0};
    return r;
}

// An event statement's answer that also says deliveries are due.
claim_result seeing_deliveries_due(claim_result r) {
    r.deliveries_due = true;
    return r;
}

}  // namespace

TEST_CASE("claim sequence: sizes are powers of two up to 1024") {
    CHECK(claim_size(0) == 0);
    CHECK(claim_size(1) == 1);
    CHECK(claim_size(3) == 2);
    CHECK(claim_size(128) == 128);
    CHECK(claim_size(1000) == 512);
    CHECK(claim_size(5000) == largest_claim);
}

TEST_CASE("claim sequence: a full claim starts a drain; the next continues behind it") {
    scripted_port db;
    db.event_answers = {picked(1, 4)};
    auto out = run_claim(db, request(4));
    CHECK(out.full);
    REQUIRE(out.drain_watermark);
    CHECK(out.drain_watermark->id == 4);
    CHECK_FALSE(out.low_mark);  // it did not take everything due

    db.event_answers = {picked(5, 4)};
    auto next = request(4);
    next.drain_watermark = out.drain_watermark;
    out = run_claim(db, next);
    REQUIRE(db.calls.size() == 2);
    CHECK(db.calls[1].after->id == 4);
    CHECK(out.drain_watermark->id == 8);
}

TEST_CASE("claim sequence: the end of a drain looks once more from the low mark for late commits") {
    scripted_port db;
    db.event_answers = {picked(9, 1), picked(3, 2, "new low")};
    auto r = request(8);
    r.drain_watermark = claim_watermark{"t", 8};
    r.low_mark = "old low";
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 2);
    CHECK(db.calls[0].size == 8);
    CHECK(db.calls[0].after);
    CHECK_FALSE(db.calls[1].after);
    CHECK(db.calls[1].low_mark == "old low");
    CHECK(db.calls[1].size == 4);  // what is left of 8, in a prepared size
    CHECK(out.events.size() == 3);
    CHECK_FALSE(out.drain_watermark);
    CHECK(out.low_mark == "new low");  // that claim took all it found
    CHECK_FALSE(out.full);
}

namespace {

// A claim that examined its bound of rows and leased none of them: every
// due row it met waits behind an earlier event of its key.
claim_result examined_bound(std::int64_t last, std::size_t size, std::string low_mark) {
    claim_result r;
    r.picked = size;
    r.last = claim_watermark{"t", last};
    r.low_mark = std::move(low_mark);
    return r;
}

// Runs a drain of three claims over rows that wait behind earlier events of
// their keys (two claims examine their bound and take nothing, the third
// reaches the end), the first from `low_mark`, the low mark changed to
// `low_mark_later` during the drain; returns the low mark that the look for
// late commits at its end started from.
std::optional<std::string> drain_end_looks_from(std::optional<std::string> low_mark,
                                                std::optional<std::string> low_mark_later) {
    scripted_port db;
    db.event_answers = {examined_bound(16, 4, "L1"), examined_bound(32, 4, "L2"), picked(40, 0, "L3"),
                        picked(1, 0, "L4")};
    auto r = request(4);
    r.low_mark = std::move(low_mark);
    auto out = run_claim(db, r);
    CHECK(out.full);
    r.drain_watermark = out.drain_watermark;
    out = run_claim(db, r);
    CHECK(out.full);
    r.drain_watermark = out.drain_watermark;
    r.low_mark = std::move(low_mark_later);
    out = run_claim(db, r);
    CHECK_FALSE(out.full);
    CHECK_FALSE(out.drain_watermark);
    CHECK(out.low_mark == "L4");
    REQUIRE(db.calls.size() == 4);
    CHECK(db.calls[2].after->id == 32);
    CHECK_FALSE(db.calls[3].after);
    return db.calls[3].low_mark;
}

}  // namespace

TEST_CASE("claim sequence: after a drain through rows of blocked keys, the look for late commits starts where "
          "the drain began, not at those rows") {
    // Rows that wait behind earlier events of their keys are examined and
    // skipped, like rows another claim holds. The low mark of the claim
    // that began the drain (its start less 5 seconds) is behind everything
    // the drain examined; from the older low mark, the look would meet the
    // same rows, examine its bound of them, and start the same drain again,
    // claim after claim, while nothing changes.
    CHECK(drain_end_looks_from("L0", "L0") == "L1");
    CHECK(drain_end_looks_from(std::nullopt, std::nullopt) == "L1");
    // Unless the low mark was moved back during the drain (a sweep, a
    // wake-up from the start): then from there.
    CHECK(drain_end_looks_from("L0", std::nullopt) == std::nullopt);
}

TEST_CASE("claim sequence: deliveries first while a drain goes on and the last claim saw them due; else after "
          "the events when their statement saw some due") {
    scripted_port db;
    db.delivery_answers = {events(100, 1)};
    db.event_answers = {picked(1, 2)};  // full: the drain goes on
    auto out = run_claim(db, draining_with_deliveries_due(4));
    REQUIRE(db.calls.size() == 2);
    CHECK(db.calls[0].what == "deliveries");
    CHECK(db.calls[0].size == 4);
    CHECK(db.calls[1].what == "events");
    CHECK(db.calls[1].after);
    CHECK(db.calls[1].size == 2);  // 3 left: the prepared size 2
    CHECK(out.events.size() == 3);

    // Outside a drain the events go first, whatever the last claim saw:
    // what is due at the event statement's now() is due at the delivery
    // statement's, later, too.
    scripted_port later;
    later.event_answers = {seeing_deliveries_due(picked(1, 1))};
    later.delivery_answers = {events(100, 2)};
    auto again = request(4);
    again.deliveries_due = true;
    out = run_claim(later, again);
    REQUIRE(later.calls.size() == 2);
    CHECK(later.calls[0].what == "events");
    CHECK(later.calls[0].size == 4);
    CHECK(later.calls[1].what == "deliveries");
    CHECK(later.calls[1].size == 2);  // what the events left, in a prepared size
    CHECK(out.deliveries_due);
    CHECK(out.events.size() == 3);

    // ... and none are claimed when that statement saw none due.
    scripted_port none;
    none.event_answers = {picked(1, 1)};
    out = run_claim(none, again);
    REQUIRE(none.calls.size() == 1);
    CHECK(none.calls[0].what == "events");
}

TEST_CASE("claim sequence: deliveries that fell due between the delivery and the event statements are claimed "
          "after the events") {
    // A retry fell due after the delivery statement's now() and before the
    // event statement's: that statement says deliveries are due, and its
    // "when is the next one" looks only at what is not due yet. Left there,
    // the retry waited for the sweep (an e2e run: 10 s and more).
    scripted_port db;
    db.delivery_answers = {events(100, 1), events(101, 1)};
    db.event_answers = {seeing_deliveries_due(picked(1, 4))};  // full: the drain goes on
    const auto out = run_claim(db, draining_with_deliveries_due(8));
    REQUIRE(db.calls.size() == 3);
    CHECK(db.calls[0].what == "deliveries");
    CHECK(db.calls[1].what == "events");
    CHECK(db.calls[2].what == "deliveries");
    CHECK(db.calls[2].size == 2);  // 3 left: the prepared size 2
    CHECK(out.events.size() == 6);
    CHECK(out.events.back().id == 101);
}

TEST_CASE("claim sequence: deliveries claimed after the events leave out the connections the first ones took") {
    scripted_port db;
    auto to = [](std::int64_t id, const char* destination) {
        event e;
        e.id = id;
        e.destination = destination;
        return e;
    };
    db.delivery_answers = {{to(100, "a"), to(101, "a")}, {to(102, "b")}, {to(103, "b")}};
    db.event_answers = {seeing_deliveries_due(picked(1, 8))};  // full: the drain goes on
    auto r = draining_with_deliveries_due(16);
    r.open_destinations = {{"a", 2}, {"b", 3}};
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 4);  // a, b, events, b
    CHECK(db.calls[2].what == "events");
    CHECK(db.calls[3].what == "deliveries");
    CHECK(db.calls[3].destinations == std::vector<std::string>{"b"});  // a's two connections are taken
    CHECK(db.calls[3].size == 2);                                      // b has two left
    CHECK(out.events.size() == 12);
}

TEST_CASE("claim sequence: no destination with a free connection, no delivery claim") {
    scripted_port db;
    auto seen = picked(1, 0);
    seen.deliveries_due = true;
    db.event_answers = {seen};
    auto r = request(4);
    r.deliveries_due = true;
    r.open_destinations.clear();
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 1);
    CHECK(db.calls[0].what == "events");
    CHECK(out.deliveries_due);  // still due: claimed once a connection frees up
}

TEST_CASE("claim sequence: a claim that picked rows it could not lease still counts as full") {
    scripted_port db;
    auto r = picked(1, 1);
    r.picked = 2;  // one row's key was held by another claim
    db.event_answers = {r};
    const auto out = run_claim(db, request(2));
    CHECK(out.full);
    CHECK(out.drain_watermark);
}

TEST_CASE("claim sequence: no more deliveries for a destination than it has free connections") {
    scripted_port db;
    db.delivery_answers = {events(100, 8), events(200, 1), events(300, 0)};
    db.event_answers = {picked(1, 0), picked(1, 0)};  // the drain ends: once more from the low mark
    auto r = draining_with_deliveries_due(16);
    r.open_destinations = {{"slow", 1}, {"fast", 32}, {"probing", 1}};
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 5);
    CHECK(db.calls[0].destinations == std::vector<std::string>{"fast"});
    CHECK(db.calls[0].size == 16);
    CHECK(db.calls[1].destinations == std::vector<std::string>{"slow"});
    CHECK(db.calls[1].size == 1);
    CHECK(db.calls[2].destinations == std::vector<std::string>{"probing"});
    CHECK(db.calls[2].size == 1);
    CHECK(db.calls[3].what == "events");
    CHECK(db.calls[3].size == 4);  // 16 - 9 = 7 left: the prepared size 4
    CHECK(out.events.size() == 9);
    CHECK(out.full);  // "slow" came back full: more may be due there
}

TEST_CASE("claim sequence: after a failed claim, untracked leases are handed back before anything is claimed") {
    scripted_port db;
    db.event_answers.push_back(picked(7, 2));
    db.released = 3;
    auto r = request(8);
    r.release_all_but = held_leases{{4, 5}, {6}, {"a"}};
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 2);
    CHECK(db.calls[0].what == "release");
    CHECK(db.calls[0].size == 3);  // what the relay holds is kept
    CHECK(db.calls[0].destinations == std::vector<std::string>{"a"});
    CHECK(db.calls[1].what == "events");
    CHECK(out.released == 3);
    CHECK(out.events.size() == 2);
}

TEST_CASE("claim sequence: an ordinary claim hands nothing back") {
    scripted_port db;
    db.event_answers.push_back(picked(1, 1));
    (void)run_claim(db, request(8));
    REQUIRE(db.calls.size() == 1);
    CHECK(db.calls[0].what == "events");
}

TEST_CASE("claim sequence, windows: the page first, then deliveries when the read says some are due") {
    scripted_port db;
    claim_request r;
    r.wanted = 4;
    r.windows = true;
    r.deliveries_due = false;
    r.open_destinations = {{"a", 8}};
    r.window = window_read_request{"1:1:", std::nullopt, 0, std::nullopt, 256};
    window_read_result read;
    read.page.snap_b = "5:5:";
    read.deliveries_due = true;
    read.next_due = std::chrono::milliseconds(70);
    db.window_answers.push_back(read);
    db.delivery_answers.push_back({event{}, event{}});
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 2);
    CHECK(db.calls[0].what == "window");
    CHECK(db.calls[0].size == 256);
    CHECK(db.calls[1].what == "deliveries");
    CHECK(db.calls[1].size == 4);
    CHECK(out.window->snap_b == "5:5:");
    CHECK(out.events.size() == 2);
    CHECK_FALSE(out.full);
    CHECK(out.deliveries_due);
    CHECK(out.next_due == std::chrono::milliseconds(70));

    SUBCASE("no page may be read (the queue is full), no delivery due: nothing runs") {
        scripted_port idle;
        r.window.reset();
        r.deliveries_due = false;
        const auto nothing = run_claim(idle, r);
        CHECK(idle.calls.empty());
        CHECK_FALSE(nothing.window);
    }
}

TEST_CASE("claim sequence: a low mark from the start: the check is kept, and without one there is nothing to pass") {
    CHECK(low_mark_from_start(std::string("a|b|c")) == std::optional<std::string>("|b|c"));
    CHECK(low_mark_from_start(std::string("|b|c")) == std::optional<std::string>("|b|c"));
    CHECK_FALSE(low_mark_from_start(std::string("a||")));
    CHECK_FALSE(low_mark_from_start(std::string("2026-11-30 00:00:00+00")));
    CHECK_FALSE(low_mark_from_start(std::nullopt));
    // A reach back (below) is a claim from the start's already.
    CHECK(low_mark_from_start(std::string("a|b|c|5")) == std::optional<std::string>("|b|c"));
}

TEST_CASE("claim sequence: a low mark that reaches back to a watched transaction's start keeps the earlier reach") {
    const outboxd::database_time t5{std::chrono::microseconds(5)};
    const outboxd::database_time t9{std::chrono::microseconds(9)};
    CHECK(low_mark_reaching(std::string("a|b|c"), t9) == std::optional<std::string>("a|b|c|9"));
    CHECK(low_mark_reaching(std::string("a|b|c|9"), t5) == std::optional<std::string>("a|b|c|5"));
    CHECK(low_mark_reaching(std::string("a|b|c|5"), t9) == std::optional<std::string>("a|b|c|5"));
    // No check yet: the check's fields stay empty.
    CHECK(low_mark_reaching(std::string("a"), t9) == std::optional<std::string>("a|||9"));
    // From the start already: nothing to add.
    CHECK(low_mark_reaching(std::string("|b|c"), t9) == std::optional<std::string>("|b|c"));
    CHECK_FALSE(low_mark_reaching(std::nullopt, t9));
}

TEST_CASE("claim sequence: the claim without keys answers alone while it picks no keyed event") {
    scripted_port db;
    db.event_answers = {picked(1, 3, "low-2")};
    auto r = unkeyed_first(8);
    r.low_mark = "low-1";
    const auto out = run_claim(db, r);
    REQUIRE(db.calls.size() == 1);
    CHECK(db.calls[0].what == "unkeyed events");
    CHECK(db.calls[0].size == 8);
    CHECK(out.events.size() == 3);
    CHECK_FALSE(out.full);
    CHECK_FALSE(out.picked_keyed);
    CHECK(out.low_mark == "low-2");
}

TEST_CASE("claim sequence: a claim without keys that picked keyed events is followed at once by the full claim, "
          "from the same place, for the rest") {
    // It picked 8 rows and leased the 5 without a key; the keyed ones it
    // left as they were are the full claim's, which may take 2 (the rest,
    // 3, as a claim size).
    const auto unkeyed_answer = [] {
        auto a = picked(1, 5, "low-unkeyed");
        a.picked = 8;
        a.picked_keyed = true;
        return a;
    };
    SUBCASE("the full claim fills the rest: the two count as full, a drain starts behind the second") {
        scripted_port db;
        db.event_answers = {unkeyed_answer(), picked(6, 2, "low-full")};
        auto r = unkeyed_first(8);
        r.low_mark = "low-1";
        const auto out = run_claim(db, r);
        REQUIRE(db.calls.size() == 2);
        CHECK(db.calls[0].what == "unkeyed events");
        CHECK(db.calls[1].what == "events");
        CHECK(db.calls[1].size == 2);
        CHECK(db.calls[1].low_mark == "low-1");
        CHECK_FALSE(db.calls[1].after);
        CHECK(out.events.size() == 7);
        CHECK(out.picked_keyed);
        CHECK(out.full);
        REQUIRE(out.drain_watermark);
        CHECK(out.drain_watermark->id == 7);
    }
    SUBCASE("the full claim took all it found: not full, its low mark for the next claim") {
        scripted_port db;
        db.event_answers = {unkeyed_answer(), picked(6, 1, "low-full"), picked(7, 0, "low-behind")};
        auto r = unkeyed_first(8);
        r.drain_watermark = claim_watermark{"t", 0};
        const auto out = run_claim(db, r);
        // The drain ends: the look behind it for late commits goes through
        // the same two claims (the first one answering alone here).
        REQUIRE(db.calls.size() == 3);
        CHECK(db.calls[1].what == "events");
        REQUIRE(db.calls[1].after);
        CHECK(db.calls[1].after->id == 0);
        CHECK(db.calls[2].what == "unkeyed events");
        CHECK(db.calls[2].size == 2);
        CHECK_FALSE(db.calls[2].after);
        CHECK(out.events.size() == 6);
        CHECK_FALSE(out.full);
        CHECK_FALSE(out.drain_watermark);
        CHECK(out.picked_keyed);
        CHECK(out.low_mark == "low-behind");
    }
}

TEST_CASE("claim sequence: without unkeyed_first every event claim is the full one") {
    scripted_port db;
    db.event_answers = {picked(1, 2)};
    const auto out = run_claim(db, request(8));
    REQUIRE(db.calls.size() == 1);
    CHECK(db.calls[0].what == "events");
    CHECK_FALSE(out.picked_keyed);
}
