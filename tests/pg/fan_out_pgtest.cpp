// Per-destination delivery state (sql/0002) through pg::store: fan-out,
// per-destination order, fencing, the last delivery deleting its event, and
// replay of one destination's dead letter — against a real PostgreSQL.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "pg/dead_letters.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using outboxd::testing::installed;
using outboxd::testing::scalar;

namespace {

pg::new_event ev(std::optional<std::string> key = std::nullopt) {
    pg::new_event e;
    e.topic = "orders.created";
    e.payload = R"({"n":1})";
    e.ordering_key = std::move(key);
    return e;
}

pg::owed_delivery owe(std::string destination, std::chrono::milliseconds due_in = 0ms, int attempts = 1) {
    return {std::move(destination), due_in, attempts, std::string("HTTP 500")};
}

// What a claim returned, as "id@destination" (destination "*" for a whole event).
std::vector<std::string> claimed(const std::vector<event>& events) {
    std::vector<std::string> out;
    for (const auto& e : events) out.push_back(fmt::format("{}@{}", e.id, e.destination.value_or("*")));
    std::sort(out.begin(), out.end());
    return out;
}

// Every destination these tests use.
const std::vector<std::string> destinations{"a", "b", "c", "w", "x", "y", "z", "hooks", "search", "audit"};

// What the relay's claim does: due deliveries first, then events, at most
// `n` in all.
std::vector<event> claim_all(pg::store& s, std::size_t n) {
    auto got = s.claim_deliveries(n, 30s, destinations);
    auto events = s.claim(n - got.size(), 30s).events;
    std::move(events.begin(), events.end(), std::back_inserter(got));
    return got;
}

std::string at(std::int64_t id, const std::string& destination) { return fmt::format("{}@{}", id, destination); }

}  // namespace

TEST_CASE("fan-out parks the event and gives each owed destination a delivery of its own") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    // "hooks" accepted it; "audit" and "search" failed.
    REQUIRE(s.fan_out({id, 1}, std::vector{owe("audit"), owe("search")}, {}));

    CHECK(db.query("SELECT fanned_out FROM {s}.events") == "t");
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries WHERE attempts = 1 AND last_error = 'HTTP 500'") == "2");
    const auto got = claim_all(s, 10);
    REQUIRE(claimed(got) == std::vector{at(id, "audit"), at(id, "search")});
    for (const auto& e : got) {
        CHECK(e.attempt == 2);  // attempts count per destination
        CHECK(e.payload == R"({"n": 1})");
    }
    // The first delivery done leaves the event; the last one takes it along.
    CHECK(s.finish_deliveries({{{id, "audit", 2}}, {}, {}}) == 0);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "1");
    CHECK(s.finish_deliveries({{{id, "search", 2}}, {}, {}}) == 0);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "0");
}

TEST_CASE("fan-out with nothing owed: dead destinations become dead letters and the event is done") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, {}, std::vector{pg::dead_delivery{"audit", 1, "HTTP 410: gone", 410, "gone"}}));
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    CHECK(db.query("SELECT destination || ' ' || last_status || ' ' || attempts FROM {s}.dead_letters") ==
          "audit 410 1");
}

TEST_CASE("fan-out is fenced: a stale lease writes nothing") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    auto other = db.store("b");
    CHECK_FALSE(other.fan_out({id, 1}, std::vector{owe("audit")}, {}));  // not b's lease
    CHECK_FALSE(s.fan_out({id, 7}, std::vector{owe("audit")}, {}));      // not this attempt
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "0");
    CHECK(db.query("SELECT fanned_out FROM {s}.events") == "f");
}

TEST_CASE("delivery outcomes are fenced on owner and attempt") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, std::vector{owe("audit")}, {}));
    REQUIRE(claim_all(s, 10).size() == 1);
    auto other = db.store("b");
    CHECK(other.finish_deliveries({{{id, "audit", 2}}, {}, {}}) == 1);
    CHECK(s.finish_deliveries({{{id, "audit", 1}}, {}, {}}) == 1);
    CHECK(s.finish_deliveries({{}, {{{id, "audit", 3}, 1s, "x"}}, {}}) == 1);
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "1");
    CHECK(s.finish_deliveries({{}, {}, {{{id, "audit", 2}, "HTTP 410", 410, ""}}}) == 0);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    CHECK(db.query("SELECT destination FROM {s}.dead_letters") == "audit");
}

TEST_CASE("each delivery outcome is fenced by the attempt alone and by the owner alone") {
    // Three events, one per outcome, so that each outcome's fence shows alone.
    installed db;
    auto a = db.store("a");
    auto b = db.store("b");
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(db.enqueue(ev()));
    REQUIRE(claim_all(a, 4).size() == 3);
    for (const auto id : ids) REQUIRE(a.fan_out({id, 1}, std::vector{owe("audit")}, {}));
    // Relay a claims the deliveries (attempt 2) with a lease that expires at
    // once, then claims them again (attempt 3): its own expired leases.
    REQUIRE(a.claim_deliveries(4, 1ms, destinations).size() == 3);
    std::vector<event> again;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (again.size() < 3 && std::chrono::steady_clock::now() < deadline) {
        for (auto& e : a.claim_deliveries(4, 30s, destinations)) again.push_back(std::move(e));
    }
    REQUIRE(again.size() == 3);
    for (const auto& e : again) CHECK(e.attempt == 3);
    const auto state = [&] {
        return db.query("SELECT string_agg(lease_owner || ':' || attempts || ':' || "
                        "(available_at > now() + interval '20 seconds'), ',' ORDER BY event_id) FROM {s}.deliveries");
    };
    const std::string held = "a:3:true,a:3:true,a:3:true";
    REQUIRE(state() == held);
    const auto ref = [&](int i, std::int32_t attempt) { return pg::delivery_ref{ids[i], "audit", attempt}; };

    // Same owner, the expired attempt (2).
    CHECK(a.finish_deliveries({{ref(0, 2)}, {}, {}}) == 1);
    CHECK(a.finish_deliveries({{}, {{ref(1, 2), 1h, "late"}}, {}}) == 1);
    CHECK(a.finish_deliveries({{}, {}, {{ref(2, 2), "late", 410, ""}}}) == 1);
    CHECK(state() == held);
    // The live attempt (3), named by another relay.
    CHECK(b.finish_deliveries({{ref(0, 3)}, {}, {}}) == 1);
    CHECK(b.finish_deliveries({{}, {{ref(1, 3), 1h, "not mine"}}, {}}) == 1);
    CHECK(b.finish_deliveries({{}, {}, {{ref(2, 3), "not mine", 410, ""}}}) == 1);
    CHECK(state() == held);
    CHECK(db.query("SELECT count(*) FROM {s}.dead_letters") == "0");
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "3");

    CHECK(a.finish_deliveries({{ref(0, 3), ref(1, 3), ref(2, 3)}, {}, {}}) == 0);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
}

TEST_CASE("a failing destination blocks its key there only; the other destination goes on in order") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto e1 = db.enqueue(ev("k"));
    const auto e2 = db.enqueue(ev("k"));
    const auto e3 = db.enqueue(ev("k"));
    // A claim of one: e1 alone, without the run of its key behind it.
    REQUIRE(claimed(claim_all(s, 1)) == std::vector{at(e1, "*")});
    // e1: "hooks" took it, "audit" failed and retries in an hour.
    REQUIRE(s.fan_out({e1, 1}, std::vector{owe("audit", 1h)}, {}));

    // e2 is claimable now, but its key has a delivery waiting: it says so,
    // and the relay fans it out to queue behind e1 at each destination.
    auto got = claim_all(s, 10);
    REQUIRE(claimed(got) == std::vector{at(e2, "*")});
    CHECK(got[0].key_pending);
    REQUIRE(s.fan_out({e2, 1}, std::vector{owe("hooks", 0ms, 0), owe("audit", 0ms, 0)}, {}));

    // hooks: e2 goes (nothing earlier of k waits there); audit: e1 first.
    got = claim_all(s, 10);
    REQUIRE(claimed(got) == std::vector{at(e2, "hooks"), at(e3, "*")});
    CHECK(got[0].attempt == 1);
    for (const auto& e : got) {
        if (!e.destination) CHECK(e.key_pending);  // e3 too queues behind
    }
    REQUIRE(s.fan_out({e3, 1}, std::vector{owe("hooks", 0ms, 0), owe("audit", 0ms, 0)}, {}));
    // e3@hooks waits for e2@hooks, which is in flight.
    CHECK(claim_all(s, 10).empty());
    CHECK(s.finish_deliveries({{{e2, "hooks", 1}}, {}, {}}) == 0);
    CHECK(claimed(claim_all(s, 10)) == std::vector{at(e3, "hooks")});
    CHECK(s.finish_deliveries({{{e3, "hooks", 1}}, {}, {}}) == 0);
    // audit still holds all three back behind e1's retry, due in an hour.
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries WHERE destination = 'audit'") == "3");
    const auto due = s.claim(0, 30s).next_due;
    REQUIRE(due.has_value());
    CHECK(*due > 3500s);
}

TEST_CASE("the per-destination rule also holds back an earlier event of the key that is not fanned out") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto e1 = db.enqueue(ev("k"));
    const auto e2 = db.enqueue(ev("k"));
    // e2 owes "audit" while e1 (older) is still a plain event, as after a
    // replay of e1: e2's delivery must wait for e1.
    {
        pqxx::work tx(*db.admin);
        tx.exec(fmt::format("UPDATE {0}.events SET fanned_out = true, available_at = 'infinity' WHERE id = {1}; "
                            "INSERT INTO {0}.deliveries (event_id, destination, ordering_key) VALUES ({1}, 'audit', 'k')",
                            db.schema.q(), e2));
        tx.commit();
    }
    CHECK(claimed(claim_all(s, 10)) == std::vector{at(e1, "*")});
    CHECK(claim_all(s, 10).empty());
    CHECK(s.complete(std::vector{db.lease(e1, 1)}).size() == 1);
    CHECK(claimed(claim_all(s, 10)) == std::vector{at(e2, "audit")});
}

TEST_CASE("the event claim says when deliveries are due; a claim of deliveries never returns more than asked") {
    installed db{"fan"};
    auto s = db.store("a");
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 6; ++i) ids.push_back(db.enqueue(ev()));
    REQUIRE(claim_all(s, 4).size() == 4);
    CHECK_FALSE(s.claim(0, 30s).deliveries_due);
    for (int i = 0; i < 3; ++i) REQUIRE(s.fan_out({ids[static_cast<std::size_t>(i)], 1}, std::vector{owe("a"), owe("b")}, {}));
    REQUIRE(s.fan_out({ids[3], 1}, {}, {}));  // done everywhere: deleted
    CHECK(s.claim(0, 30s).deliveries_due);
    CHECK(s.claim_deliveries(4, 30s, destinations).size() == 4);
    CHECK(s.claim(0, 30s).deliveries_due);
    CHECK(claim_all(s, 100).size() == 2 + 2);  // 2 deliveries left, 2 events never claimed
    CHECK_FALSE(s.claim(0, 30s).deliveries_due);  // all leased now
}

TEST_CASE("release hands back deliveries too") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, std::vector{owe("audit")}, {}));
    REQUIRE(claim_all(s, 10).size() == 1);
    CHECK(s.release() == 1);
    auto b = db.store("b");
    CHECK(claimed(claim_all(b, 10)) == std::vector{at(id, "audit")});
}

TEST_CASE("two relays finishing an event's last two deliveries at once: the event is deleted, exactly once") {
    installed db{"fan"};
    for (int round = 0; round < 20; ++round) {
        auto a = db.store("a");
        auto b = db.store("b");
        a.connect();
        b.connect();
        const auto id = db.enqueue(ev());
        REQUIRE(claim_all(a, 10).size() == 1);
        REQUIRE(a.fan_out({id, 1}, std::vector{owe("x"), owe("y")}, {}));
        const auto got_a = claim_all(a, 1);
        const auto got_b = claim_all(b, 1);
        REQUIRE(got_a.size() == 1);
        REQUIRE(got_b.size() == 1);
        std::size_t fenced_a = 9;
        std::size_t fenced_b = 9;
        std::thread ta([&] { fenced_a = a.finish_deliveries({{{id, *got_a[0].destination, 2}}, {}, {}}); });
        std::thread tb([&] { fenced_b = b.finish_deliveries({{{id, *got_b[0].destination, 2}}, {}, {}}); });
        ta.join();
        tb.join();
        CHECK(fenced_a == 0);
        CHECK(fenced_b == 0);
        CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    }
}

TEST_CASE("replaying one destination's dead letter delivers to that destination only") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev("k"));
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, {}, std::vector{pg::dead_delivery{"audit", 1, "HTTP 410", 410, ""}}));
    REQUIRE(db.query("SELECT count(*) FROM {s}.events") == "0");

    const auto dead = pg::list_dead(*db.admin, db.schema.name(), {}, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].destination == std::optional<std::string>("audit"));
    CHECK(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{id});
    // The event comes back under the same id, owed to "audit" alone.
    const auto got = claim_all(s, 10);
    CHECK(claimed(got) == std::vector{at(id, "*")});
    CHECK(got.at(0).only_to == std::vector<std::string>{"audit"});
}

TEST_CASE("dead letters of one event at two destinations coexist, and both replay") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, {},
                      std::vector{pg::dead_delivery{"audit", 1, "HTTP 410", 410, ""},
                                  pg::dead_delivery{"search", 1, "HTTP 410", 410, ""}}));
    CHECK(db.query("SELECT count(*) FROM {s}.dead_letters WHERE id = " + std::to_string(id)) == "2");
    CHECK(pg::replay_dead(*db.admin, db.schema.name(), {std::optional<std::int64_t>(id), {}, {}}) ==
          std::vector<std::int64_t>{id});
    const auto got = claim_all(s, 10);
    CHECK(claimed(got) == std::vector{at(id, "*")});
    CHECK(got.at(0).only_to == std::vector<std::string>{"audit", "search"});
}

TEST_CASE("a relay's store leaves deliveries to destinations it does not know alone, and does not call them due") {
    installed db{"fan"};
    auto s = db.store("relay-a");
    pg::store only_a(testing::database_url(), db.schema.name(), "relay-old", false, false,
                     std::chrono::milliseconds(0), std::vector<std::string>{"a"});
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 1).size() == 1);
    REQUIRE(s.fan_out({id, 1}, std::vector{owe("b")}, {}));

    CHECK_FALSE(only_a.claim(0, 30s).deliveries_due);
    CHECK(only_a.claim_deliveries(4, 30s, std::vector<std::string>{"a"}).empty());
    CHECK(s.claim(0, 30s).deliveries_due);
    CHECK(claimed(s.claim_deliveries(4, 30s, std::vector<std::string>{"b"})) == std::vector{at(id, "b")});
}

TEST_CASE("a replay racing an event's last delivery leaves no delivery without its event") {
    // y's dead letter is replayed while x's delivery, the event's last one,
    // is finished. Forced interleaving: the replay stalls before its commit
    // (a statement trigger of the test's own sleeps), after it found the
    // event still there and wrote y's delivery; the last delivery is
    // finished meanwhile.
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev("k"));
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, std::vector{owe("x")}, std::vector{pg::dead_delivery{"y", 1, "HTTP 410", 410, ""}}));
    const auto got = claim_all(s, 10);
    REQUIRE(claimed(got) == std::vector{at(id, "x")});
    {
        pqxx::nontransaction tx(*db.admin);
        tx.exec(fmt::format("CREATE FUNCTION {0}.stall() RETURNS trigger LANGUAGE plpgsql AS "
                            "$$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$; "
                            "CREATE TRIGGER stall AFTER INSERT ON {0}.events "
                            "FOR EACH STATEMENT EXECUTE FUNCTION {0}.stall()",
                            db.schema.q()));
    }

    auto replayer = testing::connect();
    std::vector<std::int64_t> replayed;
    std::thread replay([&] { replayed = pg::replay_dead(*replayer, db.schema.name(), {}); });
    // Wait until the replay sleeps in the trigger.
    for (int i = 0; i < 200 && db.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") == "0";
         ++i) {
        std::this_thread::sleep_for(10ms);
    }
    pg::delivery_outcomes done;
    done.delivered.push_back({id, "x", got[0].attempt});
    const auto fenced = s.finish_deliveries(done);
    replay.join();
    CHECK(fenced == 0);
    CHECK(replayed == std::vector<std::int64_t>{id});

    // y is owed the event, and the event is there to be sent.
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries d WHERE NOT EXISTS "
                   "(SELECT 1 FROM {s}.events e WHERE e.id = d.event_id)") == "0");
    CHECK(claimed(claim_all(s, 10)) == std::vector{at(id, "y")});
}

TEST_CASE("a delivery without its event is never claimed, and the sweep turns it into a dead letter that says so") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev("k"));
    const auto later = db.enqueue(ev("k"));
    REQUIRE(claim_all(s, 1).size() == 1);
    REQUIRE(s.fan_out({id, 1}, std::vector{owe("x")}, {}));
    // What the replay race left behind in outboxes written before the fix.
    (void)db.query("WITH gone AS (DELETE FROM {s}.events WHERE id = " + std::to_string(id) +
                   " RETURNING id) SELECT count(*) FROM gone");

    CHECK(s.claim_deliveries(10, 30s, destinations).empty());
    const auto buried = s.bury_orphan_deliveries();
    REQUIRE(buried.size() == 1);
    CHECK(buried[0].id == id);
    CHECK(buried[0].destination == "x");
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "0");
    CHECK(db.query("SELECT last_error LIKE '%lost its event row%' FROM {s}.dead_letters WHERE id = " +
                   std::to_string(id)) == "t");
    // Its key is free again at x.
    CHECK(claimed(claim_all(s, 10)) == std::vector{at(later, "*")});
}

TEST_CASE("a dead letter whose event is back in the outbox (not fanned out) waits: replaying it loses nothing") {
    // E died at x and at y. x's dead letter is replayed first: E is back,
    // whole, owed to x. Replaying y's now must not hang a delivery on E
    // (E leaves the table when x is done, and y's payload with it): it stays
    // a dead letter until E has left, and replays then.
    installed db{"fan"};
    auto s = db.store("a");
    const auto id = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({id, 1}, {},
                      std::vector{pg::dead_delivery{"x", 1, "HTTP 410", 410, ""},
                                  pg::dead_delivery{"y", 1, "HTTP 410", 410, ""}}));
    (void)db.query("WITH older AS (UPDATE {s}.dead_letters SET died_at = now() - interval '2 hours' "
                   "WHERE destination = 'x' RETURNING 1) SELECT count(*) FROM older");
    CHECK(pg::replay_dead(*db.admin, db.schema.name(), {std::nullopt, std::nullopt, 1h}) ==
          std::vector<std::int64_t>{id});

    // y's turn, while E is back: nothing replayed, nothing lost.
    CHECK(pg::replay_dead(*db.admin, db.schema.name(), {}).empty());
    CHECK(db.query("SELECT count(*) FROM {s}.dead_letters WHERE destination = 'y'") == "1");
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "0");

    const auto got = claim_all(s, 10);
    REQUIRE(claimed(got) == std::vector{at(id, "*")});
    REQUIRE(s.complete(std::vector{db.lease(id, got[0].attempt)}).size() == 1);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");

    // E has left: y's dead letter replays now, to y only.
    CHECK(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{id});
    CHECK(db.query("SELECT destinations::text FROM {s}.events WHERE id = " + std::to_string(id)) == "{y}");
}

TEST_CASE("a dead letter committed while a replay takes its locks waits for the next replay") {
    // The replay locks the events it owes deliveries to, then replays. A dead
    // letter committed in between belongs to an event it did not lock: a
    // delivery hung on that event could lose it to a relay finishing it at
    // that moment. Forced: the lock statement waits for a row lock the test
    // holds while the new dead letter commits.
    installed db{"fan"};
    auto s = db.store("a");
    const auto e1 = db.enqueue(ev());
    const auto e2 = db.enqueue(ev());
    REQUIRE(claim_all(s, 10).size() == 2);
    REQUIRE(s.fan_out({e1, 1}, std::vector{owe("z")}, std::vector{pg::dead_delivery{"y", 1, "HTTP 410", 410, ""}}));
    REQUIRE(s.fan_out({e2, 1}, std::vector{owe("w")}, {}));

    auto holder = testing::connect();
    pqxx::work hold(*holder);
    (void)hold.exec(fmt::format("SELECT id FROM {}.events WHERE id = {} FOR UPDATE", db.schema.q(), e1));
    auto replayer = testing::connect();
    std::vector<std::int64_t> replayed;
    std::thread replay([&] { replayed = pg::replay_dead(*replayer, db.schema.name(), {}); });
    for (int i = 0; i < 200 && db.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'") == "0";
         ++i) {
        std::this_thread::sleep_for(10ms);
    }
    // A relay buries e2's delivery to x now (as its own transaction).
    (void)db.query("WITH d AS (INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, "
                   "destination) VALUES (" + std::to_string(e2) + ", 't', '{{}}', '{{}}', now(), 3, 'x') "
                   "RETURNING 1) SELECT count(*) FROM d");
    hold.commit();
    replay.join();

    CHECK(replayed == std::vector<std::int64_t>{e1});
    CHECK(db.query("SELECT count(*) FROM {s}.dead_letters WHERE id = " + std::to_string(e2)) == "1");
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries WHERE event_id = " + std::to_string(e2) +
                   " AND destination = 'x'") == "0");
    // The next replay takes it (its event is locked then).
    CHECK(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{e2});
}

TEST_CASE("release_untracked hands back our leases but those kept, due now, with the claim's attempt taken back") {
    installed db{"fan"};
    auto s = db.store("a");
    const auto parked = db.enqueue(ev("k"));
    REQUIRE(claim_all(s, 10).size() == 1);
    REQUIRE(s.fan_out({parked, 1}, std::vector{owe("audit", 0ms, 0), owe("search", 0ms, 0)}, {}));
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(db.enqueue(ev()));
    const auto keyed = db.enqueue(ev("k2"));
    REQUIRE(claim_all(s, 10).size() == 2 + 4);  // both deliveries, four events

    held_leases keep;
    keep.events = {ids[0]};
    keep.delivery_ids = {parked};
    keep.delivery_destinations = {"audit"};
    CHECK(s.release_untracked(keep) == 3 + 1);  // ids[1], ids[2], keyed; search

    auto b = db.store("b");
    auto expected = std::vector{at(ids[1], "*"), at(ids[2], "*"), at(keyed, "*"), at(parked, "search")};
    std::sort(expected.begin(), expected.end());
    CHECK(claimed(claim_all(b, 10)) == expected);
    // Taken back: the claim that lost its answer made no request.
    CHECK(db.query(fmt::format("SELECT attempts FROM {{s}}.events WHERE id = {}", ids[1])) == "1");
    CHECK(db.query(fmt::format("SELECT attempts FROM {{s}}.deliveries WHERE event_id = {} AND destination = 'search'",
                               parked)) == "1");
    // What we kept is still ours: its outcome is recorded.
    CHECK(s.complete(std::vector{db.lease(ids[0], 1)}).size() == 1);
    // The released key's hold went with it (b could claim it above).
}
