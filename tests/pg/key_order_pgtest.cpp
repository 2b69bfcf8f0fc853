// Per-key order under concurrency: two relays and a producer or replayer,
// with the race window forced open. Relay A's claim runs inside an explicit
// transaction on a raw connection and stays uncommitted while the third
// connection commits an older event of the key and relay B claims; then A
// commits. At no point may two events of one key (at one destination) be
// leased at once.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <future>

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

// Every destination these tests use (a relay claims deliveries for its own).
const std::vector<std::string> destinations{"audit", "hooks"};

// Events of `key` leased right now (sent straight to their destinations).
int leased_events(installed& db, const std::string& key) {
    return std::stoi(db.query("SELECT count(*) FROM {s}.events WHERE ordering_key = '" + key +
                              "' AND lease_owner IS NOT NULL AND leased_until > now() AND NOT fanned_out"));
}
int leased_deliveries(installed& db, const std::string& key, const std::string& destination) {
    return std::stoi(db.query("SELECT count(*) FROM {s}.deliveries WHERE ordering_key = '" + key +
                              "' AND destination = '" + destination +
                              "' AND lease_owner IS NOT NULL AND available_at > now()"));
}
pg::new_event ev(std::optional<std::string> key) {
    pg::new_event e;
    e.topic = "orders.created";
    e.payload = R"({"n":1})";
    e.ordering_key = std::move(key);
    return e;
}

// Relay A: a claim statement inside a transaction that stays open until
// commit(), so its leases are invisible to everyone else meanwhile.
class open_claim {
public:
    template <typename... Extra>
    open_claim(const std::string& sql, const std::string& owner, Extra&&... extra)
        : conn_(testing::connect()), tx_(*conn_) {
        result_ = tx_.exec_params(sql, owner, 30000, std::forward<Extra>(extra)...);
    }
    [[nodiscard]] const pqxx::result& result() const { return result_; }
    void commit() { tx_.commit(); }

private:
    std::unique_ptr<pqxx::connection> conn_;
    pqxx::work tx_;
    pqxx::result result_;
};

// Waits (with a deadline) until relay B's claim has either returned or is
// waiting for a lock (the only session in this database that may be).
template <typename T>
void wait_returned_or_blocked(installed& db, std::future<T>& b) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
        if (b.wait_for(10ms) == std::future_status::ready) return;
        if (db.query("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND wait_event_type = 'Lock'") != "0") {
            return;
        }
    }
    FAIL("relay B's claim neither returned nor waited for a lock");
}

}  // namespace

TEST_CASE("a replayed older event is not leased while another relay's uncommitted claim holds a newer one") {
    installed db{"keyorder"};
    auto setup = db.store("setup");
    auto b = db.store("relay-b");
    const auto e1 = db.enqueue(ev("k"));
    const auto e2 = db.enqueue(ev("k"));
    auto first = setup.claim(1, 30s).events;
    REQUIRE(first.size() == 1);
    REQUIRE(first[0].id == e1);
    REQUIRE(setup.bury({e1, 1}, "poison", 400, ""));

    // A claims e2; its snapshot predates the replay of e1.
    open_claim a(setup.claim_sql(16, pg::claim_from::beginning, false), "relay-a");
    REQUIRE(a.result().size() == 2);  // e2 and the extra row
    REQUIRE(a.result()[0][0].as<std::int64_t>() == e2);
    // The replay commits e1 back, older than e2.
    REQUIRE(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{e1});
    // B sees e1, and e2 without A's lease.
    auto b_claim = std::async(std::launch::async, [&] { return b.claim(16, 30s); });
    wait_returned_or_blocked(db, b_claim);
    a.commit();
    const auto result = b_claim.get();
    const auto& got = result.events;
    CAPTURE(got.size());
    CHECK(leased_events(db, "k") <= 1);
    CHECK(got.empty());
    // B picked the older event and could not lease it: not a claim that
    // found nothing due (the relay must not end a drain or move its low
    // mark on it).
    CHECK(result.picked == 1);
}

TEST_CASE("an older event committed after a newer one is not leased while the newer one's claim is uncommitted") {
    installed db{"keyorder"};
    auto b = db.store("relay-b");
    // P1 takes the older id and commits last.
    auto p1_conn = testing::connect();
    pqxx::work p1(*p1_conn);
    const auto e1 = p1.exec1(fmt::format("SELECT {}.enqueue('orders.created', '{{}}', 'k')", db.schema.q()))[0]
                        .as<std::int64_t>();
    const auto e2 = db.enqueue(ev("k"));
    REQUIRE(e1 < e2);

    open_claim a(b.claim_sql(16, pg::claim_from::beginning, false), "relay-a");
    REQUIRE(a.result().size() == 2);
    REQUIRE(a.result()[0][0].as<std::int64_t>() == e2);
    p1.commit();
    auto b_claim = std::async(std::launch::async, [&] { return b.claim(16, 30s).events; });
    wait_returned_or_blocked(db, b_claim);
    a.commit();
    const auto got = b_claim.get();
    CAPTURE(got.size());
    CHECK(leased_events(db, "k") <= 1);
    CHECK(got.empty());
}

TEST_CASE("a replayed delivery is not leased while another relay's uncommitted claim holds a newer one there") {
    installed db{"keyorder"};
    auto setup = db.store("setup");
    auto b = db.store("relay-b");
    const auto e1 = db.enqueue(ev("k"));
    const auto e2 = db.enqueue(ev("k"));
    // Both fanned out to "audit"; e1's delivery there dies while "hooks"
    // still owes e1 (so e1's row stays and the replay is a delivery row).
    REQUIRE(setup.claim(1, 30s).events.size() == 1);
    REQUIRE(setup.fan_out({e1, 1},
                          std::vector{pg::owed_delivery{"audit", 0ms, 1, std::string("HTTP 500")},
                                      pg::owed_delivery{"hooks", 1h, 1, std::string("HTTP 500")}},
                          {}));
    REQUIRE(setup.claim(1, 30s).events.size() == 1);
    REQUIRE(setup.fan_out({e2, 1}, std::vector{pg::owed_delivery{"audit", 0ms, 0, std::nullopt}}, {}));
    auto d1 = setup.claim_deliveries(10, 30s, destinations);
    REQUIRE(d1.size() == 1);
    REQUIRE(d1[0].id == e1);
    pg::delivery_outcomes dead;
    dead.dead.push_back({{e1, "audit", d1[0].attempt}, "HTTP 410", 410, ""});
    REQUIRE(setup.finish_deliveries(dead) == 0);

    // A claims e2@audit; its snapshot predates the replay of e1@audit.
    open_claim a(setup.claim_deliveries_sql(16), "relay-a", "{audit,hooks}", false);  // every destination
    REQUIRE(a.result().size() == 1);
    REQUIRE(a.result()[0][0].as<std::int64_t>() == e2);
    REQUIRE(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{e1});
    auto b_claim = std::async(std::launch::async, [&] { return b.claim_deliveries(16, 30s, destinations); });
    wait_returned_or_blocked(db, b_claim);
    a.commit();
    const auto got = b_claim.get();
    CAPTURE(got.size());
    CHECK(leased_deliveries(db, "k", "audit") <= 1);
    CHECK(got.empty());
}

TEST_CASE("every outcome frees its key's hold at once; a stale outcome frees nothing") {
    installed db{"keyorder"};
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    const auto holds = [&] { return db.query("SELECT count(*) FROM {s}.key_holds"); };
    const auto claim_one = [&](pg::store& s) {
        auto got = s.claim(1, 30s).events;
        REQUIRE(got.size() == 1);
        CHECK(holds() == "1");
        return got[0];
    };
    // Wait (deadline) until a claim returns something, for retries due in 1 ms.
    const auto claim_soon = [&](pg::store& s) {
        const auto deadline = std::chrono::steady_clock::now() + 5s;
        while (std::chrono::steady_clock::now() < deadline) {
            auto got = s.claim(1, 30s).events;
            if (!got.empty()) {
                CHECK(holds() == "1");
                return got[0];
            }
        }
        FAIL("nothing became claimable");
        return event{};
    };
    for (int i = 0; i < 4; ++i) (void)db.enqueue(ev("k"));

    auto e = claim_one(a);
    CHECK(a.reschedule({e.id, e.attempt}, 1ms, "HTTP 500"));
    CHECK(holds() == "0");
    e = claim_soon(a);
    CHECK(a.release() == 1);
    CHECK(holds() == "0");
    e = claim_one(a);
    CHECK(a.complete(std::vector{db.lease(e.id, e.attempt)}).size() == 1);
    CHECK(holds() == "0");
    e = claim_one(a);
    CHECK(a.bury({e.id, e.attempt}, "HTTP 410", 410, ""));
    CHECK(holds() == "0");

    // A crashed relay's hold expires with its lease; its late outcome is
    // fenced and leaves the new holder's hold alone.
    e = a.claim(1, 50ms).events.at(0);
    event taken;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (taken.id == 0 && std::chrono::steady_clock::now() < deadline) {
        auto got = b.claim(1, 30s).events;
        if (!got.empty()) taken = got[0];
    }
    REQUIRE(taken.id == e.id);
    CHECK_FALSE(a.reschedule({e.id, e.attempt}, 1ms, "late"));
    CHECK(holds() == "1");
    // Fanned out: the event's hold goes, each delivery takes its own.
    CHECK(b.fan_out({taken.id, taken.attempt},
                    std::vector{pg::owed_delivery{"audit", 0ms, 1, std::nullopt},
                                pg::owed_delivery{"hooks", 0ms, 1, std::nullopt}},
                    {}));
    CHECK(holds() == "0");
    auto d = b.claim_deliveries(10, 30s, destinations);
    REQUIRE(d.size() == 2);
    CHECK(holds() == "2");
    pg::delivery_outcomes out;
    out.retries.push_back({{d[0].id, *d[0].destination, d[0].attempt}, 1ms, "HTTP 500"});
    out.dead.push_back({{d[1].id, *d[1].destination, d[1].attempt}, "HTTP 410", 410, ""});
    CHECK(b.finish_deliveries(out) == 0);
    CHECK(holds() == "0");
    std::vector<event> again;
    const auto retry_deadline = std::chrono::steady_clock::now() + 5s;
    while (again.empty() && std::chrono::steady_clock::now() < retry_deadline) again = b.claim_deliveries(10, 30s, destinations);
    REQUIRE(again.size() == 1);
    CHECK(holds() == "1");
    pg::delivery_outcomes delivered;
    delivered.delivered.push_back({again[0].id, *again[0].destination, again[0].attempt});
    CHECK(b.finish_deliveries(delivered) == 0);
    CHECK(holds() == "0");
}

TEST_CASE("a replayed delivery waits while a later event of its key is out to every destination") {
    installed db{"keyorder"};
    auto a = db.store("relay-a");
    const auto e1 = db.enqueue(ev("k"));
    const auto e2 = db.enqueue(ev("k"));
    REQUIRE(a.claim(1, 30s).events.size() == 1);
    // e1 went everywhere but "audit", where it died; e2 then goes out whole.
    REQUIRE(a.fan_out({e1, 1}, {}, std::vector{pg::dead_delivery{"audit", 1, "HTTP 410", 410, ""}}));
    const auto out = a.claim(10, 30s).events;
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].id == e2);
    REQUIRE(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{e1});
    // e1 must not go to audit while e2 may be on its way there.
    CHECK(a.claim_deliveries(10, 30s, destinations).empty());
    CHECK(a.claim(10, 30s).events.empty());
    CHECK(a.complete(std::vector{db.lease(e2, 1)}).size() == 1);
    const auto got = a.claim(10, 30s).events;
    REQUIRE(got.size() == 1);
    CHECK(got[0].id == e1);
    CHECK(got[0].only_to == std::vector<std::string>{"audit"});
}

TEST_CASE("a replayed delivery is not leased while another relay's uncommitted claim holds a later event of its key") {
    installed db{"keyorder"};
    auto setup = db.store("setup");
    auto b = db.store("relay-b");
    const auto e1 = db.enqueue(ev("k"));
    const auto e2 = db.enqueue(ev("k"));
    REQUIRE(setup.claim(1, 30s).events.size() == 1);
    REQUIRE(setup.fan_out({e1, 1}, {}, std::vector{pg::dead_delivery{"audit", 1, "HTTP 410", 410, ""}}));

    // A claims e2 whole; its snapshot predates the replay of e1@audit.
    open_claim a(setup.claim_sql(16, pg::claim_from::beginning, false), "relay-a");
    REQUIRE(a.result().size() == 2);
    REQUIRE(a.result()[0][0].as<std::int64_t>() == e2);
    REQUIRE(pg::replay_dead(*db.admin, db.schema.name(), {}) == std::vector<std::int64_t>{e1});
    auto b_claim = std::async(std::launch::async, [&] {
        auto got = b.claim_deliveries(16, 30s, destinations);
        auto events = b.claim(16, 30s).events;
        std::move(events.begin(), events.end(), std::back_inserter(got));
        return got;
    });
    wait_returned_or_blocked(db, b_claim);
    a.commit();
    const auto got = b_claim.get();
    CAPTURE(got.size());
    CHECK(got.empty());
    CHECK(leased_events(db, "k") + leased_deliveries(db, "k", "audit") == 1);
}

TEST_CASE("the sweep forgets key holds that expired long ago, and only those") {
    installed db{"keyorder"};
    auto s = db.store("a");
    (void)db.query("WITH h AS (INSERT INTO {s}.key_holds (ordering_key, destination, event_id, until) VALUES "
                   "('old', '', 1, now() - interval '2 hours'), ('recent', '', 2, now() - interval '1 minute'), "
                   "('live', '', 3, now() + interval '30 seconds') RETURNING 1) SELECT count(*) FROM h");
    CHECK(s.forget_expired_key_holds() == 1);
    CHECK(db.query("SELECT string_agg(ordering_key, ',' ORDER BY ordering_key) FROM {s}.key_holds") == "live,recent");
}

namespace {

// The claim's events by id, and the fence an outcome about each carries.
pg::lease_ref ref_of(const event& e) { return {e.id, e.attempt, e.tid, e.hold}; }

const event& by_id(const std::vector<event>& got, std::int64_t id) {
    const auto it = std::find_if(got.begin(), got.end(), [&](const event& e) { return e.id == id; });
    REQUIRE(it != got.end());
    return *it;
}

// A claim of everything due, retried until it returns something (a hold or
// a lease running out takes a few milliseconds).
std::vector<event> claim_soon(pg::store& s) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
        auto got = s.claim(10, 30s).events;
        if (!got.empty()) return got;
    }
    FAIL("nothing became claimable");
    return {};
}

}  // namespace

TEST_CASE("a run's followers carry no lease: only its first event is written, the rest go under the key's hold") {
    installed db{"keyorder"};
    auto a = db.store("relay-a");
    const auto h = db.enqueue(ev("k"));
    const auto f1 = db.enqueue(ev("k"));
    const auto f2 = db.enqueue(ev("k"));
    const auto got = a.claim(10, 30s).events;
    REQUIRE(got.size() == 3);
    CHECK(by_id(got, h).hold.empty());
    CHECK(by_id(got, f1).run_head == h);
    CHECK_FALSE(by_id(got, f1).hold.empty());
    CHECK(by_id(got, f2).hold == by_id(got, f1).hold);
    for (const auto& e : got) CHECK(e.attempt == 1);
    CHECK(db.query("SELECT string_agg(id::text, ',' ORDER BY id) FROM {s}.events WHERE lease_owner IS NOT NULL") ==
          std::to_string(h));
    CHECK(db.query("SELECT sum(attempts) FROM {s}.events") == "1");
    CHECK(db.query("SELECT event_id || ' ' || lease_owner FROM {s}.key_holds") == fmt::format("{} relay-a", f2));
    // Nothing of k for anyone else meanwhile, the followers being due.
    auto b = db.store("relay-b");
    CHECK(b.claim(10, 30s).events.empty());
    // The head's outcome leaves the key held; a follower's retry counts its
    // attempt; the unsent rest handed back frees the key, attempt not counted.
    CHECK(a.complete(std::vector{ref_of(by_id(got, h))}).size() == 1);
    CHECK(b.claim(10, 30s).events.empty());
    CHECK(a.reschedule(ref_of(by_id(got, f1)), 1ms, "HTTP 500"));
    CHECK(a.hand_back(ref_of(by_id(got, f2)), 0ms));
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds") == "0");
    CHECK(db.query("SELECT string_agg(id || ':' || attempts, ',' ORDER BY id) FROM {s}.events") ==
          fmt::format("{}:1,{}:0", f1, f2));
    const auto again = claim_soon(b);
    REQUIRE(again.size() == 2);
    CHECK(by_id(again, f1).attempt == 2);
    CHECK(by_id(again, f2).attempt == 1);
    CHECK(by_id(again, f2).run_head == f1);
}

TEST_CASE("a run follower's late outcome is refused once its key is held under another hold, ours included") {
    installed db{"keyorder"};
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    const auto h = db.enqueue(ev("k"));
    const auto f1 = db.enqueue(ev("k"));
    const auto f2 = db.enqueue(ev("k"));
    const auto first = a.claim(10, 50ms).events;  // a hold that runs out at once
    REQUIRE(first.size() == 3);
    CHECK(a.complete(std::vector{ref_of(by_id(first, h))}).size() == 1);

    SUBCASE("another relay") {
        const auto taken = claim_soon(b);  // once a's hold ran out
        REQUIRE(taken.size() == 2);
        CHECK(by_id(taken, f1).hold.empty());  // now b's run's first: leased
        // a's late outcomes: f1 is b's lease now, f2 under b's hold.
        CHECK_FALSE(a.reschedule(ref_of(by_id(first, f1)), 1ms, "late"));
        CHECK(a.complete(std::vector{ref_of(by_id(first, f2))}).empty());
        CHECK_FALSE(a.bury(ref_of(by_id(first, f2)), "late", 500, ""));
        CHECK_FALSE(a.hand_back(ref_of(by_id(first, f2)), 0ms));
        CHECK(db.query("SELECT count(*) FROM {s}.events WHERE attempts = 0 AND id = " + std::to_string(f2)) == "1");
        CHECK(b.complete(std::vector{ref_of(by_id(taken, f1)), ref_of(by_id(taken, f2))}).size() == 2);
    }
    SUBCASE("the same relay, claiming the key again") {
        const auto taken = claim_soon(a);
        REQUIRE(taken.size() == 2);
        CHECK(by_id(taken, f2).hold != by_id(first, f2).hold);
        CHECK_FALSE(a.reschedule(ref_of(by_id(first, f2)), 1ms, "late"));
        CHECK(a.complete(std::vector{ref_of(by_id(first, f2))}).empty());
        CHECK(a.complete(std::vector{ref_of(by_id(taken, f1)), ref_of(by_id(taken, f2))}).size() == 2);
    }
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds") == "0");
}

TEST_CASE("a relay's shutdown, or its death, frees its runs' keys at once, the followers untouched") {
    installed db{"keyorder"};
    auto a = db.store("relay-a");
    auto peer = db.store("relay-peer");
    a.bind_leases_to_session();
    peer.bind_leases_to_session();
    for (int i = 0; i < 3; ++i) (void)db.enqueue(ev("k"));
    REQUIRE(a.claim(10, 60s).events.size() == 3);
    CHECK(peer.claim(10, 60s).events.empty());

    SUBCASE("shutdown") { CHECK(a.release() == 1); }
    SUBCASE("death") {
        a.disconnect();
        const auto until = std::chrono::steady_clock::now() + 5s;
        pg::store::takeover t;
        while (t.relays.empty() && std::chrono::steady_clock::now() < until) t = peer.take_over_dead_relays();
        REQUIRE(t.relays == std::vector<std::string>{"relay-a"});
        CHECK(t.leases == 2);  // the run's first event's lease, and the hold over the rest
    }
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds") == "0");
    const auto again = peer.claim(10, 60s).events;
    REQUIRE(again.size() == 3);
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds WHERE lease_owner = 'relay-peer'") == "1");
}
