#include "core/window_reader.hpp"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

using namespace outboxd;

namespace {

std::vector<taken_cursor> every_slot_at(const std::string& a, std::optional<std::string> b = std::nullopt,
                                        std::int64_t done_below = 0) {
    std::vector<taken_cursor> out;
    for (int s = 0; s < window_slots; ++s) out.push_back({s, a, b, done_below, 7});
    return out;
}

window_event_read read(std::int64_t id, std::optional<std::string> key = std::nullopt, bool key_pending = false) {
    window_event_read r;
    r.e.id = id;
    r.e.topic = std::string(1, 't');  // (assigning a literal trips GCC 12's -Wrestrict here)
    r.e.ordering_key = std::move(key);
    r.slot = static_cast<int>(id % window_slots);
    r.key_pending = key_pending;
    return r;
}

window_page page(std::string b, std::vector<window_event_read> events, bool full) {
    return {std::move(b), std::move(events), full};
}

std::vector<std::int64_t> ids(const std::vector<window_reader::step>& steps) {
    std::vector<std::int64_t> out;
    for (const auto& s : steps) out.push_back(s.e->id);
    return out;
}

}  // namespace

TEST_CASE("window reader: each window starts at the last one's B; a full page is followed behind its last id") {
    window_reader r(1000);
    CHECK_FALSE(r.next_read(100));  // no cursor held: nothing to read
    r.hold(every_slot_at("1:1:"));
    auto q = r.next_read(100);
    REQUIRE(q);
    CHECK(q->snap_a == "1:1:");
    CHECK_FALSE(q->snap_b);
    CHECK(q->done_below == 0);
    CHECK_FALSE(q->slots);  // every slot: no filter
    CHECK(q->limit == 100);
    CHECK_FALSE(r.next_read(100));  // one read at a time
    r.page_read(page("90:95:91", {read(3), read(5)}, true));
    q = r.next_read(100);
    REQUIRE(q);
    CHECK(q->snap_a == "1:1:");
    CHECK(q->snap_b == "90:95:91");
    CHECK(q->done_below == 6);
    r.page_read(page("ignored:", {read(8)}, false));
    q = r.next_read(100);
    REQUIRE(q);
    CHECK(q->snap_a == "90:95:91");
    CHECK_FALSE(q->snap_b);
    CHECK(q->done_below == 0);
}

TEST_CASE("window reader: the checkpoint trails the lowest unsettled event, and moves to B once a window settled") {
    window_reader r(1000);
    r.hold(every_slot_at("1:1:"));
    CHECK(r.checkpoint()->snap_a == "1:1:");
    (void)r.next_read(100);
    r.page_read(page("90:95:", {read(3), read(5), read(9)}, true));
    CHECK(ids(r.take(10)) == std::vector<std::int64_t>{3, 5, 9});
    r.sent_ok(5);
    auto c = r.checkpoint();
    REQUIRE(c);
    CHECK(c->snap_a == "1:1:");
    CHECK(c->snap_b == "90:95:");
    CHECK(c->done_below == 3);
    CHECK(c->slots.size() == 64);
    CHECK(c->epochs.front() == 7);
    r.checkpoint_written(*c);
    CHECK_FALSE(r.checkpoint());  // nothing moved
    r.sent_ok(3);
    CHECK(r.checkpoint()->done_below == 9);
    r.parking(9);
    CHECK(r.checkpoint()->done_below == 9);  // parked, not recorded yet
    r.settled(9);
    CHECK(r.checkpoint()->done_below == 10);  // the window is still being read
    (void)r.next_read(100);
    r.page_read(page("x", {}, false));
    c = r.checkpoint();
    CHECK(c->snap_a == "90:95:");
    CHECK_FALSE(c->snap_b);
    CHECK(c->done_below == 0);
    CHECK(r.idle());
}

TEST_CASE("window reader: cursors inside one window resume it; cursors at different positions restart from the oldest") {
    SUBCASE("one position") {
        window_reader r(1000);
        r.hold(every_slot_at("10:20:", "30:40:33", 57));
        auto c = r.checkpoint();
        REQUIRE(c);
        CHECK(c->snap_a == "10:20:");
        CHECK(c->snap_b == "30:40:33");
        CHECK(c->done_below == 57);
        const auto q = r.next_read(100);
        CHECK(q->snap_a == "10:20:");
        CHECK(q->snap_b == "30:40:33");
        CHECK(q->done_below == 57);
        CHECK(r.checkpoint()->done_below == 57);  // nothing read yet
    }
    SUBCASE("several positions") {
        window_reader r(1000);
        std::vector<taken_cursor> cursors = {{0, "30:40:", std::nullopt, 0, 1},
                                             {1, "10:20:12,15", "30:40:", 99, 1},
                                             {2, "10:20:12", std::nullopt, 0, 1},
                                             {3, "50:60:", std::nullopt, 0, 1}};
        r.hold(cursors);
        const auto q = r.next_read(100);
        REQUIRE(q);
        // xmax 20 is the oldest; of the two, the one that saw more running
        CHECK(q->snap_a == "10:20:12,15");
        CHECK_FALSE(q->snap_b);
        CHECK(q->done_below == 0);
        CHECK(q->slots == std::vector<int>{0, 1, 2, 3});
    }
}

TEST_CASE("window reader: no read while the events read and not handed out fill the queue") {
    window_reader r(3);
    r.hold(every_slot_at("1:1:"));
    auto q = r.next_read(100);
    CHECK(q->limit == 3);
    r.page_read(page("9:9:", {read(1), read(2), read(3)}, true));
    CHECK_FALSE(r.next_read(100));
    (void)r.take(2);
    q = r.next_read(100);
    REQUIRE(q);
    CHECK(q->limit == 2);
}

TEST_CASE("window reader: a key's later events wait for its earlier one; key_pending parks") {
    window_reader r(100);
    r.hold(every_slot_at("1:1:"));
    (void)r.next_read(100);
    r.page_read(page("9:9:", {read(1, "k"), read(2, "k"), read(3, "p", true), read(4)}, false));
    auto steps = r.take(10);
    CHECK(ids(steps) == std::vector<std::int64_t>{1, 3, 4});
    CHECK_FALSE(steps[0].park);
    CHECK(steps[1].park);
    CHECK_FALSE(steps[2].park);
    CHECK(steps[0].slot == 1);
    r.sent_ok(1);
    CHECK(ids(r.take(10)) == std::vector<std::int64_t>{2});
}

TEST_CASE("window reader: losing the cursors drops what was read and a read still running") {
    window_reader r(100);
    r.hold(every_slot_at("1:1:"));
    (void)r.next_read(100);
    r.lose();
    CHECK_FALSE(r.holding());
    CHECK_FALSE(r.checkpoint());
    r.page_read(page("9:9:", {read(1)}, false));  // the stale read's answer
    CHECK(r.take(10).empty());
    r.hold(every_slot_at("5:5:"));
    const auto q = r.next_read(100);
    REQUIRE(q);
    CHECK(q->snap_a == "5:5:");
    r.sent_ok(1);  // an outcome of an event read before: ignored
    CHECK(r.epoch_of(3) == 7);
}

TEST_CASE("window reader: cursors taken while others are held join after a catch-up window, nothing read twice") {
    std::vector<taken_cursor> ours = {{0, "10:10:", std::nullopt, 0, 1}, {1, "10:10:", std::nullopt, 0, 1}};
    SUBCASE("theirs behind: (their A, our A] for their slots, then the chain for all") {
        window_reader r(100);
        r.hold(ours);
        (void)r.next_read(10);
        r.page_read(page("20:20:", {}, false));  // our chain is at 20:20: now
        r.hold({{5, "15:15:", std::nullopt, 0, 4}, {6, "12:12:", std::nullopt, 0, 4}});
        auto q = r.next_read(10);
        REQUIRE(q);
        CHECK(q->snap_a == "12:12:");  // the older of theirs
        CHECK(q->snap_b == "20:20:");
        CHECK(q->slots == std::vector<int>{5, 6});
        r.page_read(page("20:20:", {}, false));
        q = r.next_read(10);
        CHECK(q->snap_a == "20:20:");
        CHECK_FALSE(q->snap_b);
        CHECK(q->slots == std::vector<int>{0, 1, 5, 6});
        CHECK(r.epoch_of(5) == 4);
    }
    SUBCASE("ours behind: (our A, their A] for our slots, then the chain from theirs") {
        window_reader r(100);
        r.hold(ours);
        r.hold({{5, "30:30:", std::nullopt, 0, 4}});
        auto q = r.next_read(10);
        CHECK(q->snap_a == "10:10:");
        CHECK(q->snap_b == "30:30:");
        CHECK(q->slots == std::vector<int>{0, 1});
        r.page_read(page("30:30:", {}, false));
        q = r.next_read(10);
        CHECK(q->snap_a == "30:30:");
        CHECK(q->slots == std::vector<int>{0, 1, 5});
    }
}

TEST_CASE("window reader: cursors are shed only at a window boundary, at the chain's position") {
    window_reader r(100);
    r.hold(every_slot_at("1:1:"));
    (void)r.next_read(10);
    CHECK_FALSE(r.shed(32));  // reading
    r.page_read(page("9:9:", {read(1)}, false));
    CHECK_FALSE(r.shed(32));  // 1 is queued
    (void)r.take(1);
    CHECK_FALSE(r.shed(32));  // 1 is unsettled
    r.sent_ok(1);
    const auto shed = r.shed(32);
    REQUIRE(shed);
    CHECK(shed->slots.size() == 32);
    CHECK(shed->snap_a == "9:9:");
    CHECK_FALSE(shed->snap_b);
    CHECK(r.slots_held() == 32);
    const auto q = r.next_read(10);
    REQUIRE(q->slots);
    CHECK(q->slots->size() == 32);
    CHECK(r.checkpoint()->slots.size() == 32);
}

TEST_CASE("window reader: no read while the bodies held reach the byte limit; the mean body of a page is known") {
    window_reader r(100, 10'000);
    r.hold(every_slot_at("1:1:"));
    (void)r.next_read(10);
    auto big = read(1);
    big.e.payload = std::string(20'000, 'x');
    r.page_read(page("9:9:", {big, read(2)}, true));
    CHECK(r.held_bytes() > 20'000);
    CHECK(r.mean_event_bytes() > 10'000);
    CHECK_FALSE(r.next_read(10));  // over the limit, though the queue has room
    (void)r.take(10);
    r.sent_ok(1);
    CHECK(r.held_bytes() < 10'000);
    CHECK(r.next_read(10));
}
