// The figures of /metrics from a real PostgreSQL: relay_stats (backlog,
// oldest pending age, schema version) and the claim's age of each event
// (the commit-to-delivery latency).
#include <doctest/doctest.h>

#include <chrono>

#include "core/embedded_sql.hpp"
#include "pg/producer.hpp"
#include "pg/status.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;

namespace {

pg::new_event ev(std::chrono::milliseconds delay = 0ms) {
    pg::new_event e;
    e.topic = "t";
    e.payload = R"({"n":1})";
    e.delay = delay;
    return e;
}

}  // namespace

TEST_CASE("relay stats: backlog counts undelivered work (capped), oldest pending the longest-due unleased work") {
    testing::installed db;
    auto store = db.store("relay-a");
    store.connect();
    auto s = store.read_stats(100);
    CHECK(s.backlog == 0);
    CHECK(s.oldest_pending_seconds == 0);
    CHECK(s.schema_version == embedded::migrations().back().version);

    const auto a = db.enqueue(ev());
    db.enqueue(ev());
    db.enqueue(ev(1h));  // not due: backlog, not pending
    (void)db.query(fmt::format("UPDATE {{s}}.events SET available_at = now() - interval '20 seconds' WHERE id = {} RETURNING id", a));
    s = store.read_stats(100);
    CHECK(s.backlog == 3);
    CHECK(s.oldest_pending_seconds >= 20);
    CHECK(s.oldest_pending_seconds < 80);
    CHECK(store.read_stats(2).backlog == 2);  // the cap, per table

    // Claimed (leased) work is not pending; fanned out, an event counts as
    // its deliveries.
    const auto claimed = store.claim(2, 30s, std::nullopt, std::nullopt);
    REQUIRE(claimed.events.size() == 2);
    s = store.read_stats(100);
    CHECK(s.backlog == 3);
    CHECK(s.oldest_pending_seconds == 0);
    const auto& first = claimed.events.front();
    const owed_delivery owed[] = {{"x", 0ms, 1, std::string("HTTP 500")}, {"y", 1h, 1, std::string("HTTP 500")}};
    REQUIRE(store.fan_out({first.id, first.attempt}, owed, {}));
    s = store.read_stats(100);
    CHECK(s.backlog == 4);  // one event left fanned out, two deliveries, two events
    CHECK(s.oldest_pending_seconds >= 0);
}

TEST_CASE("relay stats: a run's followers being sent under their key's hold are not pending") {
    testing::installed db;
    auto store = db.store("relay-a");
    store.connect();
    for (int i = 0; i < 3; ++i) {
        auto e = ev();
        e.ordering_key = "k";
        (void)db.enqueue(e);
    }
    (void)db.query("WITH u AS (UPDATE {s}.events SET available_at = now() - interval '20 seconds' RETURNING 1) "
                   "SELECT count(*) FROM u");
    // The key's run: its first event leased, the other two under the hold.
    const auto claimed = store.claim(10, 30s, std::nullopt, std::nullopt);
    REQUIRE(claimed.events.size() == 3);
    CHECK(store.read_stats(100).oldest_pending_seconds == 0);
    // Another event, due 5 s ago: the oldest due work not in flight.
    const auto waiting = db.enqueue(ev());
    (void)db.query(fmt::format("UPDATE {{s}}.events SET available_at = now() - interval '5 seconds' WHERE id = {} "
                               "RETURNING id", waiting));
    const auto s = store.read_stats(100);
    CHECK(s.backlog == 4);
    CHECK(s.oldest_pending_seconds >= 5);
    CHECK(s.oldest_pending_seconds < 20);
}

TEST_CASE("relay stats: a claim says how old each event is by the database's clock") {
    testing::installed db;
    auto store = db.store("relay-a");
    store.connect();
    const auto id = db.enqueue(ev());
    (void)db.query(fmt::format("UPDATE {{s}}.events SET created_at = now() - interval '5 seconds' WHERE id = {} RETURNING id", id));
    const auto claimed = store.claim(4, 30s, std::nullopt, std::nullopt);
    REQUIRE(claimed.events.size() == 1);
    REQUIRE(claimed.events[0].age_at_claim);
    CHECK(*claimed.events[0].age_at_claim >= 5s);
    CHECK(*claimed.events[0].age_at_claim < 10s);
}

TEST_CASE("relay stats and status: a window event its slot's cursor has passed is delivered, though cleanup has not "
          "deleted it yet") {
    testing::installed db("pgt", "windows");
    auto store = db.store("relay-a");
    store.connect();
    const auto passed = db.enqueue(ev());
    db.enqueue(ev());
    // Every slot's cursor past both (as a windows relay checkpoints them).
    (void)db.query("WITH c AS (INSERT INTO {s}.cursors (destination, slot, snap_a, system_identifier) "
                   "SELECT '', g, pg_current_snapshot(), (SELECT system_identifier FROM pg_control_system()) "
                   "FROM generate_series(0, 63) g RETURNING 1) SELECT count(*) FROM c");
    const auto settled = db.enqueue(ev());
    const auto open = db.enqueue(ev());
    // Inside a window that sees the last two, settled below `open`.
    (void)db.query(fmt::format("WITH c AS (UPDATE {{s}}.cursors SET snap_b = pg_current_snapshot(), done_below = {} "
                               "RETURNING 1) SELECT count(*) FROM c",
                               open));
    (void)db.query(fmt::format("WITH u AS (UPDATE {{s}}.events SET available_at = now() - interval '20 seconds' "
                               "WHERE id IN ({}, {}) RETURNING 1) SELECT count(*) FROM u",
                               passed, settled));
    const auto s = store.read_stats(100);
    CHECK(s.backlog == 1);
    CHECK(s.oldest_pending_seconds < 20);  // not the delivered ones' age
    const auto rows = pg::outbox_status(*db.admin, db.schema.name());
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].pending == 1);
    CHECK(rows[0].oldest_pending_seconds < 20);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "4");  // still there, for cleanup
}

TEST_CASE("relay stats and status: a window event read by the relay that owns its slot's cursor is in flight, "
          "as of that relay's checkpoint") {
    testing::installed db("pgt", "windows");
    auto store = db.store("relay-a");
    store.connect();
    (void)db.query("WITH c AS (INSERT INTO {s}.cursors (destination, slot, snap_a, system_identifier) "
                   "SELECT '', g, pg_current_snapshot(), (SELECT system_identifier FROM pg_control_system()) "
                   "FROM generate_series(0, 63) g RETURNING 1) SELECT count(*) FROM c");
    const auto read = db.enqueue(ev());
    // A checkpoint of the window being sent: B sees `read`, nothing done in it yet.
    (void)db.query(fmt::format("WITH c AS (UPDATE {{s}}.cursors SET snap_b = pg_current_snapshot(), done_below = {} "
                               "RETURNING 1) SELECT count(*) FROM c",
                               read));
    [[maybe_unused]] const auto later = db.enqueue(ev());  // committed after that checkpoint's B
    (void)db.query(fmt::format("WITH u AS (UPDATE {{s}}.events SET available_at = now() - interval '20 seconds' "
                               "WHERE id = {} RETURNING 1) SELECT count(*) FROM u",
                               read));

    // No relay owns the cursors (it died, or released them): both are pending.
    auto rows = pg::outbox_status(*db.admin, db.schema.name());
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].pending == 2);
    CHECK(rows[0].in_flight == 0);
    CHECK(store.read_stats(100).oldest_pending_seconds >= 20);

    (void)db.query("WITH c AS (UPDATE {s}.cursors SET owner = 'relay-a', epoch = 1 RETURNING 1) "
                   "SELECT count(*) FROM c");
    rows = pg::outbox_status(*db.admin, db.schema.name());
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].in_flight == 1);  // `read`
    CHECK(rows[0].pending == 1);    // `later`: no checkpoint has seen it read
    CHECK(rows[0].oldest_pending_seconds < 20);
    const auto s = store.read_stats(100);
    CHECK(s.backlog == 2);  // undelivered, both
    CHECK(s.oldest_pending_seconds < 20);
}
