// pg::store — claim, fencing, outcomes, ordering — against a real PostgreSQL.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <map>
#include <future>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "core/claim_sequence.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using outboxd::testing::installed;
using outboxd::testing::scalar;

namespace {

pg::new_event ev(std::string topic, std::optional<std::string> key = std::nullopt) {
    pg::new_event e;
    e.topic = std::move(topic);
    e.payload = R"({"n":1})";
    e.ordering_key = std::move(key);
    return e;
}

std::vector<std::int64_t> ids_of(const std::vector<event>& events) {
    std::vector<std::int64_t> ids;
    for (const auto& e : events) ids.push_back(e.id);
    std::sort(ids.begin(), ids.end());
    return ids;
}

}  // namespace

TEST_CASE("enqueue: ids, payload and headers round-trip through a claim") {
    installed db;
    auto s = db.store("a");
    auto e = ev("orders.created", "order-7");
    e.payload = R"({"total": 12.5, "items": ["x"]})";
    e.headers = R"({"x-tenant": "acme"})";
    const auto id = db.enqueue(e);
    const auto claimed = s.claim(10, 30s).events;
    REQUIRE(claimed.size() == 1);
    CHECK(claimed[0].id == id);
    CHECK(claimed[0].topic == "orders.created");
    CHECK(claimed[0].ordering_key == std::optional<std::string>("order-7"));
    CHECK(nlohmann::json::parse(claimed[0].payload) == nlohmann::json::parse(e.payload));
    REQUIRE(claimed[0].headers.size() == 1);
    CHECK(claimed[0].headers[0] == std::pair<std::string, std::string>("x-tenant", "acme"));
    CHECK(claimed[0].attempt == 1);
}

TEST_CASE("enqueue: a repeated idempotency key returns the first id, even after delivery") {
    installed db;
    auto s = db.store("a");
    auto e = ev("orders.created");
    e.idempotency_key = "req-1";
    const auto first = db.enqueue(e);
    CHECK(db.enqueue(e) == first);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "1");

    auto other_topic = e;
    other_topic.topic = "orders.updated";
    CHECK(db.enqueue(other_topic) != first);

    // Deliver the first; the key still maps to it and makes no new event.
    const auto claimed = s.claim(10, 30s).events;
    std::vector<pg::lease_ref> done;
    for (const auto& c : claimed) done.push_back({c.id, c.attempt, c.tid});
    CHECK(s.complete(done).size() == 2);
    CHECK(db.enqueue(e) == first);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
}

TEST_CASE("purge_idempotency_keys forgets old keys only; the key then makes a new event") {
    installed db;
    auto s = db.store("a");
    auto e = ev("t");
    e.idempotency_key = "order-7";
    const auto first = db.enqueue(e);
    e.idempotency_key = "order-8";
    (void)db.enqueue(e);
    CHECK(s.purge_idempotency_keys(1h) == 0);
    db.query("UPDATE {s}.idempotency_keys SET created_at = now() - interval '2 hours' "
             "WHERE idempotency_key = 'order-7' RETURNING 1");
    CHECK(s.purge_idempotency_keys(1h) == 1);
    e.idempotency_key = "order-7";
    CHECK(db.enqueue(e) != first);
    CHECK(db.query("SELECT count(*) FROM {s}.idempotency_keys") == "2");
}

TEST_CASE("enqueue: concurrent producers with one idempotency key make one event") {
    installed db;
    std::vector<std::future<std::int64_t>> producers;
    for (int i = 0; i < 4; ++i) {
        producers.push_back(std::async(std::launch::async, [&] {
            auto p = db.producer();
            auto e = ev("t");
            e.idempotency_key = "same";
            return p.enqueue(e);
        }));
    }
    std::set<std::int64_t> ids;
    for (auto& p : producers) ids.insert(p.get());
    CHECK(ids.size() == 1);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "1");
}

TEST_CASE("enqueue: the table refuses headers that are not an object of HTTP-safe strings") {
    installed db;
    auto s = db.store("a");
    auto e = ev("t");
    e.headers = R"({"x": 1})";
    CHECK_THROWS_AS((void)db.enqueue(e), pqxx::sql_error);
    e.headers = R"(["x"])";
    CHECK_THROWS_AS((void)db.enqueue(e), pqxx::sql_error);
    e.headers = R"({"bad name": "v"})";
    CHECK_THROWS_AS((void)db.enqueue(e), pqxx::sql_error);
    e.headers = R"({"x-ok": "a\r\nInjected: 1"})";
    CHECK_THROWS_AS((void)db.enqueue(e), pqxx::sql_error);
    e.headers = R"({"x-ok": "fine\tvalue", "X-Tenant_1": "acme"})";
    CHECK(db.enqueue(e) > 0);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "1");
}

TEST_CASE("claim stamps a lease; another relay gets nothing while it holds") {
    installed db;
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    (void)db.enqueue(ev("t"));
    const auto got = a.claim(10, 30s).events;
    REQUIRE(got.size() == 1);
    CHECK(db.query("SELECT lease_owner FROM {s}.events") == "relay-a");
    CHECK(db.query("SELECT attempts FROM {s}.events") == "1");
    // The lease's end in a column of its own (sql/0014): the row stays where
    // it was in the claim index.
    CHECK(db.query("SELECT leased_until > now() + interval '25 seconds' FROM {s}.events") == "t");
    CHECK(db.query("SELECT available_at <= now() FROM {s}.events") == "t");
    CHECK(b.claim(10, 30s).events.empty());
}

TEST_CASE("claim sizes are powers of two up to 1024, never above what was asked") {
    CHECK(pg::claim_size(0) == 0);
    CHECK(pg::claim_size(1) == 1);
    CHECK(pg::claim_size(3) == 2);
    CHECK(pg::claim_size(32) == 32);
    CHECK(pg::claim_size(33) == 32);
    CHECK(pg::claim_size(1023) == 512);
    CHECK(pg::claim_size(5000) == 1024);
}

TEST_CASE("claim never returns more than asked") {
    installed db;
    auto s = db.store("a");
    for (int i = 0; i < 10; ++i) (void)db.enqueue(ev("t"));
    CHECK(s.claim(0, 30s).events.empty());
    CHECK(s.claim(3, 30s).events.size() == 2);  // the prepared size below 3
    CHECK(s.claim(4, 30s).events.size() == 4);
    CHECK(s.claim(100, 30s).events.size() == 4);
    CHECK(s.claim(100, 30s).events.empty());
}

TEST_CASE("two claimers racing never get the same event, and together get all") {
    installed db;
    {
        pqxx::work tx(*db.admin);
        tx.exec(fmt::format("SELECT {}.enqueue('t', '{{}}') FROM generate_series(1, 3000)", db.schema.q()));
        tx.commit();
    }
    auto drain = [&](std::string owner) {
        auto s = db.store(owner);
        std::vector<std::int64_t> mine;
        for (;;) {
            const auto got = s.claim(25, 60s).events;
            if (got.empty()) break;
            for (const auto& e : got) mine.push_back(e.id);
        }
        return mine;
    };
    auto fa = std::async(std::launch::async, drain, "a");
    auto fb = std::async(std::launch::async, drain, "b");
    const auto a = fa.get();
    const auto b = fb.get();
    std::set<std::int64_t> all(a.begin(), a.end());
    for (const auto id : b) CHECK_MESSAGE(all.insert(id).second, "event " << id << " claimed twice");
    CHECK(all.size() == 3000);
    CHECK(a.size() + b.size() == 3000);
}

TEST_CASE("an expired lease is claimable again, and the old holder is fenced out") {
    installed db;
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    const auto id = db.enqueue(ev("t"));
    const auto first = a.claim(1, 1ms).events;
    REQUIRE(first.size() == 1);
    // Wait until the database's clock has passed the 1 ms lease.
    std::vector<event> second;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (second.empty() && std::chrono::steady_clock::now() < deadline) {
        second = b.claim(1, 30s).events;
    }
    REQUIRE(second.size() == 1);
    CHECK(second[0].id == id);
    CHECK(second[0].attempt == 2);

    // relay-a finishes late: none of its outcomes may touch relay-b's claim.
    const pg::lease_ref stale{id, first[0].attempt, first[0].tid};
    CHECK(a.complete(std::vector{stale}).empty());
    CHECK_FALSE(a.reschedule(stale, 1h, "late"));
    CHECK_FALSE(a.bury(stale, "late", 500, ""));
    CHECK(db.query("SELECT lease_owner || ':' || attempts FROM {s}.events") == "relay-b:2");

    CHECK(b.complete(std::vector{db.lease(id, 2)}) == std::vector<std::int64_t>{id});
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
}

// The fence has two halves, and each must hold alone: the tests above change
// owner and attempt together, so they would pass with either half removed.
TEST_CASE("a relay that re-claims its own expired lease is fenced out by the attempt alone") {
    // Three events, one per outcome, so that each outcome's fence shows alone.
    installed db;
    auto a = db.store("relay-a");
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(db.enqueue(ev("t")));
    REQUIRE(a.claim(4, 1ms).events.size() == 3);
    // The same owner claims them again once the 1 ms leases have expired.
    std::vector<event> again;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (again.size() < 3 && std::chrono::steady_clock::now() < deadline) {
        for (auto& e : a.claim(4, 30s).events) again.push_back(std::move(e));
    }
    REQUIRE(again.size() == 3);
    for (const auto& e : again) CHECK(e.attempt == 2);
    const auto state = [&] {
        return db.query("SELECT string_agg(lease_owner || ':' || attempts || ':' || "
                        "(leased_until > now() + interval '20 seconds'), ',' ORDER BY id) FROM {s}.events");
    };
    REQUIRE(state() == "relay-a:2:true,relay-a:2:true,relay-a:2:true");

    // The first attempts' outcomes arrive late: same owner, old attempt.
    CHECK(a.complete(std::vector{db.lease(ids[0], 1)}).empty());
    CHECK_FALSE(a.reschedule({ids[1], 1}, 1h, "late"));
    CHECK_FALSE(a.bury({ids[2], 1}, "late", 500, ""));
    CHECK(state() == "relay-a:2:true,relay-a:2:true,relay-a:2:true");
    CHECK(db.query("SELECT count(*) FROM {s}.dead_letters") == "0");

    std::vector<pg::lease_ref> current;
    for (const auto id : ids) current.push_back(db.lease(id, 2));
    CHECK(a.complete(current).size() == 3);
}

TEST_CASE("another relay naming the current attempt is fenced out by the owner alone") {
    installed db;
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(db.enqueue(ev("t")));
    REQUIRE(a.claim(4, 30s).events.size() == 3);
    const auto state = [&] {
        return db.query("SELECT string_agg(lease_owner || ':' || attempts || ':' || "
                        "(leased_until > now() + interval '20 seconds'), ',' ORDER BY id) FROM {s}.events");
    };
    // The right attempt, but relay-a holds it.
    CHECK(b.complete(std::vector{db.lease(ids[0], 1)}).empty());
    CHECK_FALSE(b.reschedule({ids[1], 1}, 1h, "not mine"));
    CHECK_FALSE(b.bury({ids[2], 1}, "not mine", 500, ""));
    CHECK(state() == "relay-a:1:true,relay-a:1:true,relay-a:1:true");
    CHECK(db.query("SELECT count(*) FROM {s}.dead_letters") == "0");
    CHECK(a.reschedule({ids[1], 1}, 1h, "mine"));
}

TEST_CASE("reschedule: not claimable before its time; next_due says when") {
    installed db;
    auto s = db.store("a");
    const auto id = db.enqueue(ev("t"));
    const auto got = s.claim(1, 30s).events;
    REQUIRE(got.size() == 1);
    CHECK(s.reschedule({id, 1}, 1h, "HTTP 500: boom"));
    CHECK(db.query("SELECT last_error FROM {s}.events") == "HTTP 500: boom");
    CHECK(db.query("SELECT lease_owner IS NULL FROM {s}.events") == "t");
    CHECK(s.claim(10, 30s).events.empty());
    const auto due = s.claim(0, 30s).next_due;
    REQUIRE(due.has_value());
    CHECK(*due > 3590s);
    CHECK(*due <= 3600s);
}

TEST_CASE("reschedule stores an error text that is not valid UTF-8") {
    installed db;
    auto s = db.store("a");
    const auto id = db.enqueue(ev("t"));
    REQUIRE(s.claim(1, 30s).events.size() == 1);
    CHECK(s.reschedule({id, 1}, 1ms, std::string("bad \xff\xfe bytes \0 here", 20)));
    CHECK(db.query("SELECT last_error LIKE 'bad %' FROM {s}.events") == "t");
}

TEST_CASE("bury moves the event to dead letters with what went wrong") {
    installed db;
    auto s = db.store("a");
    auto e = ev("orders", "k1");
    e.idempotency_key = "idem";
    const auto id = db.enqueue(e);
    REQUIRE(s.claim(1, 30s).events.size() == 1);
    CHECK(s.bury({id, 1}, "permanent failure: HTTP 410", 410, "gone for good"));
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    CHECK(db.query("SELECT id || '|' || topic || '|' || ordering_key || '|' || attempts || '|' || last_status || '|' || "
                   "response_excerpt || '|' || idempotency_key FROM {s}.dead_letters") ==
          fmt::format("{}|orders|k1|1|410|gone for good|idem", id));
}

TEST_CASE("bury of an id that already has a dead letter succeeds and keeps the newer death") {
    // An event id can come back after it died: a producer re-inserts the
    // event under its id, or an outbox is restored with an older id sequence.
    installed db;
    auto s = db.store("a");
    const auto id = db.enqueue(ev("orders"));
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, last_error, died_at) "
             "VALUES (" + std::to_string(id) + ", 'orders', '{{}}', '{{}}', now() - interval '3 days', 7, 'old', "
             "now() - interval '2 days') RETURNING 1");
    REQUIRE(s.claim(1, 30s).events.size() == 1);
    CHECK(s.bury({id, 1}, "permanent failure: HTTP 410", 410, "gone"));
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    CHECK(db.query("SELECT count(*) || '|' || min(attempts) || '|' || min(last_error) || '|' || min(last_status) || "
                   "'|' || bool_and(died_at > now() - interval '1 minute') FROM {s}.dead_letters") ==
          "1|1|permanent failure: HTTP 410|410|true");
}

TEST_CASE("a destination's dead delivery replaces an earlier dead letter of that event and destination") {
    installed db;
    auto s = db.store("a");
    const auto id = db.enqueue(ev("orders"));
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, last_error, died_at, "
             "destination) VALUES (" + std::to_string(id) + ", 'orders', '{{}}', '{{}}', now(), 7, 'old', "
             "now() - interval '2 days', 'hooks') RETURNING 1");
    const auto claimed = s.claim(1, 30s).events;
    REQUIRE(claimed.size() == 1);
    CHECK(s.fan_out({id, 1}, {}, std::vector<pg::dead_delivery>{{"hooks", 3, "HTTP 410", 410, "gone"}}));
    CHECK(db.query("SELECT count(*) || '|' || min(attempts) || '|' || min(last_error) || '|' || "
                   "bool_and(died_at > now() - interval '1 minute') FROM {s}.dead_letters") == "1|3|HTTP 410|true");
}

TEST_CASE("purge_dead_letters removes dead letters older than the retention, at most a batch at a time") {
    installed db;
    auto s = db.store("a");
    // Five that died 40 days ago (two of them one event at two destinations), one yesterday.
    db.query("WITH old AS (INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, died_at, "
             "destination) SELECT i, 't', '{{}}', '{{}}', now(), 1, now() - interval '40 days', d "
             "FROM (VALUES (1, NULL), (2, NULL), (3, 'a'), (3, 'b'), (4, NULL)) AS v(i, d) RETURNING 1) "
             "SELECT count(*) FROM old");
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, died_at) "
             "VALUES (5, 't', '{{}}', '{{}}', now(), 1, now() - interval '1 day') RETURNING 1");
    constexpr auto thirty_days = std::chrono::hours(30 * 24);
    CHECK(s.purge_dead_letters(thirty_days, 2) == 2);
    CHECK(s.purge_dead_letters(thirty_days, 2) == 2);
    CHECK(s.purge_dead_letters(thirty_days, 2) == 1);
    CHECK(s.purge_dead_letters(thirty_days, 2) == 0);
    CHECK(db.query("SELECT string_agg(id::text, ',') FROM {s}.dead_letters") == "5");
}

TEST_CASE("release hands back what we hold, due now") {
    installed db;
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    for (int i = 0; i < 3; ++i) (void)db.enqueue(ev("t"));
    REQUIRE(a.claim(2, 1h).events.size() == 2);
    CHECK(a.release() == 2);
    CHECK(b.claim(10, 30s).events.size() == 3);
}

TEST_CASE("per-key order: only the oldest event of a key is claimable, with the run of due events behind it") {
    installed db;
    auto s = db.store("a");
    const auto k1 = db.enqueue(ev("t", "k"));
    const auto k2 = db.enqueue(ev("t", "k"));
    const auto free1 = db.enqueue(ev("t"));
    const auto j1 = db.enqueue(ev("t", "j"));
    const auto free2 = db.enqueue(ev("t"));
    auto delayed = ev("t", "k");
    delayed.delay = 1h;
    const auto k3 = db.enqueue(delayed);
    const auto k4 = db.enqueue(ev("t", "k"));
    const auto hold_of = [&](const std::string& key) {
        return db.query("SELECT coalesce(max(event_id), 0) FROM {s}.key_holds WHERE ordering_key = '" + key + "'");
    };

    // k2 comes as k1's run: due right behind it. k3 is not due yet, which
    // ends the run there; k4 waits behind k3.
    auto first = s.claim(10, 30s).events;
    std::sort(first.begin(), first.end(), [](const event& x, const event& y) { return x.id < y.id; });
    CHECK(ids_of(first) == std::vector<std::int64_t>{k1, k2, free1, j1, free2});
    for (const auto& e : first) {
        CAPTURE(e.id);
        CHECK(e.run_head == (e.id == k2 ? std::optional<std::int64_t>(k1) : std::nullopt));
    }
    // The hold names the run's last event: k1's outcome leaves the key held.
    CHECK(hold_of("k") == std::to_string(k2));
    CHECK(s.claim(10, 30s).events.empty());
    CHECK(s.complete(std::vector{db.lease(k1, 1)}).size() == 1);
    CHECK(hold_of("k") == std::to_string(k2));
    // k2 handed back unsent (the relay does so with a run's rest when an
    // event of it is not delivered): the key is free, k2 due, its attempt
    // not counted.
    const auto follower = std::find_if(first.begin(), first.end(), [&](const event& e) { return e.id == k2; });
    REQUIRE(follower != first.end());
    CHECK_FALSE(follower->hold.empty());
    CHECK(s.hand_back(pg::lease_ref{k2, 1, follower->tid, follower->hold}, 0ms));
    CHECK(hold_of("k") == "0");
    auto again = s.claim(10, 30s).events;
    REQUIRE(ids_of(again) == std::vector<std::int64_t>{k2});
    CHECK(again[0].attempt == 1);
    CHECK_FALSE(again[0].run_head.has_value());
    // ... and while k2 waits for a retry, nothing of k goes.
    CHECK(s.reschedule(db.lease(k2, 1), 1ms, "retry"));
    std::vector<event> next;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (next.empty() && std::chrono::steady_clock::now() < deadline) next = s.claim(10, 30s).events;
    CHECK(ids_of(next) == std::vector<std::int64_t>{k2});
    CHECK(s.complete(std::vector{db.lease(k2, 2)}).size() == 1);
    CHECK(hold_of("k") == "0");
    // k3 is the key's oldest now, and not due: k4 stays behind it.
    CHECK(s.claim(10, 30s).events.empty());
    (void)k3;
    (void)k4;
}

TEST_CASE("runs share out what the claim has room for, each key's first follower before any key's second") {
    installed db;
    auto s = db.store("a");
    CHECK(db.query("WITH backlog AS (INSERT INTO {s}.events (topic, ordering_key, payload) "
                   "SELECT 't', 'key-' || (g % 3), '{}' FROM generate_series(1, 30) g RETURNING 1) "
                   "SELECT count(*) FROM backlog") == "30");
    // 8: three keys' first events and five followers, two keys' runs of two
    // and one of one, each in id order behind its head.
    const auto got = s.claim(8, 30s).events;
    REQUIRE(got.size() == 8);
    std::map<std::string, std::vector<std::int64_t>> by_key;
    std::map<std::string, std::int64_t> head_of;
    for (const auto& e : got) {
        by_key[*e.ordering_key].push_back(e.id);
        if (!e.run_head) head_of[*e.ordering_key] = e.id;
    }
    REQUIRE(by_key.size() == 3);
    std::vector<std::size_t> lengths;
    for (auto& [key, ids] : by_key) {
        CAPTURE(key);
        std::sort(ids.begin(), ids.end());
        // consecutive events of the key: ids 3 apart
        for (std::size_t i = 1; i < ids.size(); ++i) CHECK(ids[i] == ids[i - 1] + 3);
        CHECK(head_of.at(key) == ids.front());
        for (const auto& e : got) {
            if (*e.ordering_key == key && e.id != ids.front()) CHECK(e.run_head == ids.front());
        }
        lengths.push_back(ids.size());
        CHECK(db.query("SELECT event_id FROM {s}.key_holds WHERE ordering_key = '" + key + "'") ==
              std::to_string(ids.back()));
    }
    std::sort(lengths.begin(), lengths.end());
    CHECK(lengths == std::vector<std::size_t>{2, 3, 3});
    // A claim of one takes no run; every key is held now anyway.
    CHECK(s.claim(1, 30s).events.empty());
}

TEST_CASE("a run stops at an event another claim has locked, and at an event already out") {
    installed db;
    auto s = db.store("a");
    for (int i = 0; i < 5; ++i) (void)db.enqueue(ev("t", "k"));
    // Another session locks the key's third event, as a concurrent claim's
    // examination would: the run is the first two.
    auto other = testing::connect();
    pqxx::work lock(*other);
    lock.exec(fmt::format("SELECT 1 FROM {}.events WHERE id = 3 FOR UPDATE", db.schema.q()));
    auto got = s.claim(10, 30s).events;
    std::sort(got.begin(), got.end(), [](const event& x, const event& y) { return x.id < y.id; });
    CHECK(ids_of(got) == std::vector<std::int64_t>{1, 2});
    CHECK(db.query("SELECT event_id FROM {s}.key_holds") == "2");
    lock.commit();
}

TEST_CASE("a dead-lettered event no longer blocks its key") {
    installed db;
    auto s = db.store("a");
    const auto k1 = db.enqueue(ev("t", "k"));
    const auto k2 = db.enqueue(ev("t", "k"));
    REQUIRE(ids_of(s.claim(1, 30s).events) == std::vector<std::int64_t>{k1});
    CHECK(s.bury({k1, 1}, "poison", 400, ""));
    CHECK(ids_of(s.claim(10, 30s).events) == std::vector<std::int64_t>{k2});
}

TEST_CASE("delayed events wait for their time") {
    installed db;
    auto s = db.store("a");
    auto e = ev("t");
    e.delay = 1h;
    (void)db.enqueue(e);
    CHECK(s.claim(10, 30s).events.empty());
    const auto due = s.claim(0, 30s).next_due;
    REQUIRE(due.has_value());
    CHECK(*due > 3590s);
}

TEST_CASE("next_due is empty when nothing waits") {
    installed db;
    auto s = db.store("a");
    CHECK_FALSE(s.claim(0, 30s).next_due.has_value());
}

TEST_CASE("a lost connection is reported and the next call reconnects") {
    installed db;
    auto s = db.store("a");
    s.connect();
    (void)db.enqueue(ev("t"));
    // Kill every other idle session of ours: the store's connection among them.
    (void)scalar(*db.admin, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
    bool threw = false;
    try {
        (void)s.claim(10, 30s).events;
    } catch (const pqxx::broken_connection& e) {
        threw = true;
        // Reads as what happens next, whatever libpq's words were
        // ("server closed the connection unexpectedly", "Could not obtain
        // client encoding: not connected.", ...); those follow on one line.
        const std::string what = e.what();
        CHECK(what.starts_with("lost the connection to the database; reconnecting at the next statement ("));
        CHECK(what.find('\n') == std::string::npos);
    }
    CHECK(threw);
    CHECK_FALSE(s.connected());
    CHECK(s.claim(10, 30s).events.size() == 1);
}

TEST_CASE("a replayed dead letter waits while a later event of its key is in flight") {
    installed db;
    auto s = db.store("a");
    const auto k1 = db.enqueue(ev("t", "k"));
    const auto k2 = db.enqueue(ev("t", "k"));
    REQUIRE(ids_of(s.claim(1, 30s).events) == std::vector<std::int64_t>{k1});
    CHECK(s.bury({k1, 1}, "poison", 400, ""));
    REQUIRE(ids_of(s.claim(10, 30s).events) == std::vector<std::int64_t>{k2});
    // k1 comes back while k2 is out: it must not go out alongside k2.
    {
        pqxx::work tx(*db.admin);
        tx.exec(fmt::format("WITH r AS (DELETE FROM {0}.dead_letters RETURNING *) INSERT INTO {0}.events "
                            "(id, topic, ordering_key, payload, headers, created_at) OVERRIDING SYSTEM VALUE "
                            "SELECT id, topic, ordering_key, payload, headers, created_at FROM r",
                            db.schema.q()));
        tx.commit();
    }
    CHECK(s.claim(10, 30s).events.empty());
    CHECK(s.complete(std::vector{db.lease(k2, 1)}).size() == 1);
    CHECK(ids_of(s.claim(10, 30s).events) == std::vector<std::int64_t>{k1});
}

TEST_CASE("a lease leaves the claim index alone: no next due for it; a lease that ran out is claimed from the "
          "start of the index") {
    installed db;
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    (void)db.enqueue(ev("t"));
    REQUIRE(a.claim(10, 60s).events.size() == 1);
    // Its end is in leased_until (sql/0014), not in available_at: nothing in
    // the claim index falls due when it ends. A dead relay's leases are
    // taken over with its session (live_leases_pgtest); a hung one's are
    // found by a claim from the start of the index, the relay's sweep.
    const auto r = b.claim(10, 30s);
    CHECK(r.events.empty());
    CHECK_FALSE(r.next_due.has_value());

    const auto expiring = db.enqueue(ev("t"));
    REQUIRE(a.claim(10, 1ms).events.size() == 1);
    std::vector<event> again;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (again.empty() && std::chrono::steady_clock::now() < deadline) again = b.claim(10, 30s).events;
    REQUIRE(again.size() == 1);
    CHECK(again[0].id == expiring);
    CHECK(again[0].attempt == 2);
}

TEST_CASE("a lease is a heap-only update: it writes no index entry") {
    installed db;
    auto a = db.store("relay-a");
    for (int i = 0; i < 8; ++i) (void)db.enqueue(ev("t"));
    REQUIRE(a.claim(8, 30s).events.size() == 8);
    // The statistics reach the shared counters when the claim's session goes
    // idle (within a second); each query here is a transaction of its own.
    std::string hot;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
        hot = db.query("SELECT pg_stat_get_tuples_hot_updated('{s}.events'::regclass) || '/' || "
                       "pg_stat_get_tuples_updated('{s}.events'::regclass)");
        if (hot != "0/0") break;
        std::this_thread::sleep_for(50ms);
    }
    // Every lease kept its row version on its page, with no new entry in the
    // claim, key or primary key index: an indexed column in the lease (its
    // end in available_at before sql/0014) makes this 0/8.
    CHECK(hot == "8/8");
}

TEST_CASE("a claim behind a watermark skips what lies before it; a claim without one finds it") {
    installed db;
    auto s = db.store("a");
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 6; ++i) ids.push_back(db.enqueue(ev("t")));
    const auto first = s.claim(2, 30s);
    REQUIRE(ids_of(first.events) == std::vector<std::int64_t>{ids[0], ids[1]});
    REQUIRE(first.last.has_value());
    CHECK(first.last->id == ids[1]);
    // A late commit: due earlier than everything claimed so far.
    db.query("UPDATE {s}.events SET available_at = now() - interval '1 hour' WHERE id = " +
             std::to_string(ids[5]) + " RETURNING 1");
    const auto second = s.claim(2, 30s, first.last);
    CHECK(ids_of(second.events) == std::vector<std::int64_t>{ids[2], ids[3]});
    CHECK(second.last->id == ids[3]);
    CHECK(ids_of(s.claim(4, 30s, second.last).events) == std::vector<std::int64_t>{ids[4]});
    // Without the watermark, the late one is first in line.
    CHECK(ids_of(s.claim(4, 30s).events) == std::vector<std::int64_t>{ids[5]});
}

TEST_CASE("a followed claim from the low mark says when the next one is due only when it leases nothing") {
    installed db;
    auto s = db.store("a");
    const auto first = s.claim(10, 30s);
    // A retry due in 30 s, and an event due now.
    const auto retry = db.enqueue(ev("t"));
    db.query("UPDATE {s}.events SET available_at = now() + interval '30 seconds' WHERE id = " +
             std::to_string(retry) + " RETURNING 1");
    (void)db.enqueue(ev("t"));
    // Not followed (idle, poll, wal): the claim that leases says it.
    auto r = s.claim(10, 30s, std::nullopt, first.low_mark, false);
    CHECK(r.events.size() == 1);
    REQUIRE(r.next_due);
    CHECK(*r.next_due > 25s);
    CHECK(*r.next_due <= 30s);
    // Followed (a busy `auto` relay): the claim that leases does not; the
    // one that leases nothing, which comes next, does.
    (void)db.enqueue(ev("t"));
    r = s.claim(10, 30s, std::nullopt, r.low_mark, true);
    CHECK(r.events.size() == 1);
    CHECK_FALSE(r.next_due);
    r = s.claim(10, 30s, std::nullopt, r.low_mark, true);
    CHECK(r.events.empty());
    REQUIRE(r.next_due);
    CHECK(*r.next_due > 25s);
    CHECK(*r.next_due <= 30s);
}

TEST_CASE("a claim from the low mark skips what is due before it; after a claim from the beginning the low mark "
          "is 5 s before the claim") {
    installed db;
    auto s = db.store("a");
    for (int i = 0; i < 3; ++i) (void)db.enqueue(ev("t"));
    const auto first = s.claim(10, 30s);
    REQUIRE(first.events.size() == 3);
    // "low mark|checked at|floor" (tests/pg/low_mark_pgtest.cpp): no check yet
    CHECK(db.query("SELECT split_part('" + first.low_mark + "', '|', 1)::timestamptz "
                   "BETWEEN now() - interval '6 seconds' AND now() - interval '4 seconds'") == "t");
    // A late commit (due an hour ago), and an event due now.
    const auto late = db.enqueue(ev("t"));
    db.query("UPDATE {s}.events SET available_at = now() - interval '1 hour' WHERE id = " + std::to_string(late) +
             " RETURNING 1");
    const auto now_due = db.enqueue(ev("t"));
    CHECK(ids_of(s.claim(10, 30s, std::nullopt, first.low_mark).events) == std::vector<std::int64_t>{now_due});
    CHECK(ids_of(s.claim(10, 30s).events) == std::vector<std::int64_t>{late});
}

namespace {

// The most rows any node of a plan produced (EXPLAIN ANALYZE, FORMAT JSON),
// and the nodes, for the failure message.
void walk(const nlohmann::json& plan, double& most, std::vector<std::string>& nodes) {
    const double rows = plan.value("Actual Rows", 0.0) * plan.value("Actual Loops", 1.0);
    most = std::max(most, rows);
    nodes.push_back(fmt::format("{}{} ({} rows)", plan.value("Node Type", ""),
                                plan.contains("Relation Name") ? " on " + plan["Relation Name"].get<std::string>() : "",
                                rows));
    if (plan.contains("Plans")) {
        for (const auto& p : plan["Plans"]) walk(p, most, nodes);
    }
}

}  // namespace

namespace {

// A statement's text as PREPARE ... AS takes it: no trailing semicolon.
std::string without_semicolon(std::string sql) {
    while (!sql.empty() && (sql.back() == ';' || std::isspace(static_cast<unsigned char>(sql.back())))) sql.pop_back();
    return sql;
}

}  // namespace

TEST_CASE("the claims' generic plans, made while the outbox was small, never read the whole backlog") {
    // The relay plans each claim once, at its first use (usually at startup,
    // with whatever statistics the outbox had then), and that plan serves a
    // backlog of any size. Plans that read every due row and sort them look
    // cheapest on a small table: a seq scan and a sort (statistics of an empty
    // table: 676 ms per claim at 50,000 rows), or a bitmap scan and a sort
    // (statistics of 10 rows: one benchmark drain fell to 2,661 events/s, 37 s
    // of PostgreSQL CPU). This runs each claim, planned on a table of 0, 10
    // and 1,000 rows left over from earlier traffic, against 20,000 due rows,
    // and checks that no step of the plan handled more rows than a claim takes.
    bool unkeyed = false;
    SUBCASE("the claim") {}
    SUBCASE("the claim without keys") { unkeyed = true; }
    for (const int before : {0, 10, 1000}) {
        CAPTURE(before);
        installed db;
        const auto s = db.store("a");
        auto conn = testing::connect();
        pqxx::nontransaction tx(*conn);
        for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
        const auto fill = [&](int n) {
            tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, {})",
                                db.schema.q(), n));
        };
        // As after earlier traffic: the table's pages are still there, the
        // rows mostly gone (the state a relay usually starts in).
        fill(20000);
        tx.exec(fmt::format("DELETE FROM {}.events", db.schema.q()));
        fill(before);
        tx.exec(fmt::format("VACUUM ANALYZE {}.events", db.schema.q()));
        // Server-side prepared statements, planned now (libpqxx would
        // prepare lazily, at the first exec_prepared).
        auto prepare = [&](const std::string& name, std::string sql) {
            tx.exec("PREPARE " + name + " AS " + without_semicolon(std::move(sql)));
            tx.exec("EXPLAIN EXECUTE " + name +
                    (name == "claim" ? "('a', 1)" : name == "claim_from" ? "('a', 1, '-infinity', false)" : "('a', 1, '-infinity', 0)"));
        };
        prepare("claim", s.claim_sql(128, pg::claim_from::beginning, unkeyed));
        prepare("claim_from", s.claim_sql(128, pg::claim_from::low_mark, unkeyed));
        prepare("claim_after", s.claim_sql(128, pg::claim_from::drain_watermark, unkeyed));

        fill(20000);
        for (const std::string execute : {"EXECUTE claim('a', 30000)", "EXECUTE claim_from('a', 30000, '-infinity', false)",
                                          "EXECUTE claim_after('a', 30000, '-infinity', 0)"}) {
            CAPTURE(execute);
            const auto text = tx.exec1("EXPLAIN (ANALYZE, FORMAT JSON) " + execute)[0].as<std::string>();
            double most = 0;
            std::vector<std::string> nodes;
            walk(nlohmann::json::parse(text)[0]["Plan"], most, nodes);
            CAPTURE(fmt::format("{}", fmt::join(nodes, " | ")));
            CHECK(most <= 256);  // a claim of 128: at most 128 rows (and their returned copies) per step
        }
    }
}

namespace {

// Buffers a plan node read (EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)).
double buffers_of(const nlohmann::json& plan) {
    return plan.value("Shared Hit Blocks", 0.0) + plan.value("Shared Read Blocks", 0.0);
}

// Rows a plan node and those below it read and threw away (filters, join filters).
double rows_removed(const nlohmann::json& plan) {
    double n = plan.value("Rows Removed by Filter", 0.0) + plan.value("Rows Removed by Join Filter", 0.0);
    if (plan.contains("Plans")) {
        for (const auto& p : plan["Plans"]) n += rows_removed(p);
    }
    return n;
}

// Every node with its buffers, for the failure message.
void list_buffers(const nlohmann::json& plan, std::vector<std::string>& nodes, int depth = 0);

// The plan's nodes, one a line, for CAPTURE.
std::string plan_nodes(const nlohmann::json& plan) {
    std::vector<std::string> nodes;
    list_buffers(plan, nodes);
    return fmt::format("\n{}", fmt::join(nodes, "\n"));
}

// Runs `statement` under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON): its plan's root node.
nlohmann::json analyzed_plan(pqxx::transaction_base& tx, const std::string& statement) {
    return nlohmann::json::parse(
        tx.exec1("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement)[0].as<std::string>())[0]["Plan"];
}

// Runs `run` in a subcase for each way a drained outbox comes to have
// statistics of 0 rows on N pages: a VACUUM that cannot truncate it, an ANALYZE.
void in_each_drained_state(const std::function<void(const std::string&)>& run) {
    const std::string states[] = {"VACUUM (TRUNCATE false)", "ANALYZE"};
    for (const auto& each : states) {
        SUBCASE(each.c_str()) { run(each); }
    }
}

void list_buffers(const nlohmann::json& plan, std::vector<std::string>& nodes, int depth) {
    nodes.push_back(fmt::format("{}{}{}{} ({} buffers)", std::string(static_cast<std::size_t>(depth) * 2, ' '),
                                plan.value("Node Type", ""),
                                plan.contains("Index Name") ? " using " + plan["Index Name"].get<std::string>() : "",
                                plan.contains("Relation Name") ? " on " + plan["Relation Name"].get<std::string>() : "",
                                buffers_of(plan)));
    if (plan.contains("Plans")) {
        for (const auto& p : plan["Plans"]) list_buffers(p, nodes, depth + 1);
    }
}

}  // namespace

TEST_CASE("the claims' generic plans, made while the statistics say the outbox is empty but its pages remain, "
          "read only what they claim") {
    // A VACUUM of an outbox just drained that cannot truncate it (deleted
    // rows not yet removable for a snapshot still open, or a lock), or an
    // ANALYZE of it, records 0 rows on N pages; until the next one, the
    // planner takes the table for a single row whatever it holds. A claim
    // planned then looked its rows up by id in the claim index
    // (available_at, id), where id is not the leading column: one scan of
    // the whole index per row claimed (250,000 buffers and ~300 ms a claim
    // of 128 at 100,000 due rows). This plans each claim in that state and
    // runs it against 20,000 due rows.
    bool unkeyed = false;
    SUBCASE("the claim") {}
    SUBCASE("the claim without keys") { unkeyed = true; }
    installed db;
    const auto s = db.store("a");
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
    const auto fill = [&](int n) {
        tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, {})",
                            db.schema.q(), n));
    };
    fill(20000);
    tx.exec(fmt::format("DELETE FROM {}.events", db.schema.q()));
    tx.exec(fmt::format("VACUUM (TRUNCATE false) {}.events", db.schema.q()));
    REQUIRE(db.query("SELECT reltuples = 0 AND relpages > 0 FROM pg_class WHERE oid = '{s}.events'::regclass") == "t");
    auto prepare = [&](const std::string& name, std::string sql) {
        tx.exec("PREPARE " + name + " AS " + without_semicolon(std::move(sql)));
        tx.exec("EXPLAIN EXECUTE " + name +
                (name == "claim" ? "('a', 1)" : name == "claim_from" ? "('a', 1, '-infinity', false)" : "('a', 1, '-infinity', 0)"));
    };
    prepare("claim", s.claim_sql(128, pg::claim_from::beginning, unkeyed));
    prepare("claim_from", s.claim_sql(128, pg::claim_from::low_mark, unkeyed));
    prepare("claim_after", s.claim_sql(128, pg::claim_from::drain_watermark, unkeyed));

    fill(20000);
    for (const std::string execute : {"EXECUTE claim('a', 30000)", "EXECUTE claim_from('a', 30000, '-infinity', false)",
                                      "EXECUTE claim_after('a', 30000, '-infinity', 0)"}) {
        CAPTURE(execute);
        const auto plan = analyzed_plan(tx, execute);
        const auto nodes = plan_nodes(plan);
        CAPTURE(nodes);
        // The 128 rows, their index entries old and new, the scan to them:
        // ~1,000 buffers. Each scan of the whole claim index is ~80 more.
        CHECK(buffers_of(plan) <= 2000);
    }
}

TEST_CASE("a claim over a backlog of few keys reads a bounded part of it, not every due row") {
    // Only the first waiting event of a key is due, so over 10 keys a
    // 20,000-event backlog has 10 due events. The claim walked the claim
    // index up to its LIMIT, testing the key rule on every row it met: it
    // never reached the LIMIT and read the whole backlog at every claim
    // (~22,000 buffers, ~60 ms), with the keys' heads already out as with
    // them still waiting. Each claim here is planned as the relay plans it.
    installed db;
    auto s = db.store("a");
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
    tx.exec(fmt::format("INSERT INTO {}.events (topic, ordering_key, payload) "
                        "SELECT 't', 'key-' || (g % 10), '{{}}' FROM generate_series(1, 20000) g",
                        db.schema.q()));
    tx.exec(fmt::format("ANALYZE {}.events", db.schema.q()));
    tx.exec("PREPARE claim AS " + without_semicolon(s.claim_sql(128, pg::claim_from::beginning, false)));
    tx.exec("PREPARE claim_from AS " + without_semicolon(s.claim_sql(128, pg::claim_from::low_mark, false)));
    tx.exec("PREPARE claim_after AS " + without_semicolon(s.claim_sql(128, pg::claim_from::drain_watermark, false)));
    const auto explain = [&](const std::string& execute, int leases) {
        CAPTURE(execute);
        tx.exec("BEGIN");
        const auto plan = analyzed_plan(tx, execute);
        const auto leased =
            tx.exec1(fmt::format("SELECT count(*) FROM {}.events WHERE lease_owner = 'a'", db.schema.q()))[0].as<int>();
        tx.exec("ROLLBACK");
        const auto nodes = plan_nodes(plan);
        CAPTURE(nodes);
        CHECK(leased == leases);
        // At most a few hundred rows of the backlog and their probes of the
        // key index, and the 128 leases (~35 buffers each, the row's new
        // version and its index entries): several thousand buffers. The
        // whole backlog is ~22,000.
        CHECK(buffers_of(plan) <= 9000);
        CHECK(rows_removed(plan) <= 1500);
    };
    // The keys' first events and their runs fill the claim: 10 + 118, of
    // which the 10 first events are leased (the runs go under their keys'
    // holds, unleased). With those out, the next claim takes nothing.
    SUBCASE("the keys' first events waiting") {
        explain("EXECUTE claim('a', 30000)", 10);
        explain("EXECUTE claim_from('a', 30000, '-infinity', false)", 10);
        explain("EXECUTE claim_after('a', 30000, '-infinity', 0)", 10);
    }
    SUBCASE("the keys' first events out") {
        REQUIRE(s.claim(128, 30s).events.size() == 128);
        explain("EXECUTE claim('a', 30000)", 10);
        explain("EXECUTE claim_from('a', 30000, '-infinity', false)", 10);
        explain("EXECUTE claim_after('a', 30000, '-infinity', 0)", 10);
    }
}

namespace {

void run_complete_case(const std::string& state_sql) {
    const std::string& state = state_sql;
    installed db;
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    const auto fill = [&](int n) {
        tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, {})",
                            db.schema.q(), n));
    };
    // 100,000 rows: on a small table a sequential scan is the cheaper plan
    // and the planner may rightly take it; on a large one it must not read
    // the whole table per batch.
    fill(100000);
    tx.exec(fmt::format("DELETE FROM {}.events", db.schema.q()));
    tx.exec(fmt::format("{} {}.events", state, db.schema.q()));
    REQUIRE(db.query("SELECT reltuples = 0 AND relpages > 0 FROM pg_class WHERE oid = '{s}.events'::regclass") == "t");
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    tx.exec("PREPARE complete AS " + without_semicolon(pg::q::complete::text(db.schema.name())));
    fill(100000);
    // 128 of them leased by "a" (attempt 1), as a claim leaves them.
    const auto leased = tx.exec(fmt::format(
        "UPDATE {0}.events SET attempts = 1, lease_owner = 'a', available_at = now() + interval '1 minute' "
        "WHERE id IN (SELECT id FROM {0}.events ORDER BY id LIMIT 128) RETURNING id, ctid",
        db.schema.q()));
    std::vector<std::string> ids, attempts, tids;
    for (const auto& row : leased) {
        ids.push_back(row[0].c_str());
        attempts.emplace_back("1");
        tids.push_back(fmt::format("\"{}\"", row[1].c_str()));
    }
    // holds NULL: leased rows, not a run's followers
    const auto args = fmt::format("'{{{}}}', '{{{}}}', 'a', '{{{}}}', NULL", fmt::join(ids, ","),
                                  fmt::join(attempts, ","), fmt::join(tids, ","));
    for (const std::string mode : {"force_custom_plan", "force_generic_plan"}) {
        CAPTURE(mode);
        tx.exec("SET plan_cache_mode = " + mode);
        tx.exec("BEGIN");
        const auto plan = analyzed_plan(tx, "EXECUTE complete(" + args + ")");
        const auto deleted = tx.exec1(fmt::format("SELECT 100000 - count(*) FROM {}.events", db.schema.q()))[0].as<int>();
        tx.exec("ROLLBACK");
        const auto nodes = plan_nodes(plan);
        CAPTURE(nodes);
        CHECK(deleted == 128);
        // The 128 rows and their index entries: a few hundred buffers, and
        // no row read to be thrown away (the trap read every row of the
        // table, through the claim index or the primary key, per statement
        // or per row of the batch).
        CHECK(buffers_of(plan) <= 2000);
        CHECK(rows_removed(plan) <= 1000);
    }
}

}  // namespace

TEST_CASE("complete, planned while the statistics say the outbox is empty but its pages remain, reads only what it "
          "deletes") {
    // The outcome statement meets the same statistics as the claims above
    // (0 rows on N pages after a drained outbox was vacuumed): it looked each
    // delivered id up in the claim index (available_at, id), one scan of the
    // whole index per row, and a batch of thousands ran into the statement
    // timeout, so that nothing was recorded and every event went out again.
    in_each_drained_state(run_complete_case);
}

TEST_CASE("complete, planned while the outbox was small, reads only what it deletes once the outbox has grown") {
    // The outcome session plans `complete` once (its generic plan costs no
    // more than its custom ones) and keeps that plan until the table's
    // statistics change. Made while the outbox was small, the plan was a
    // sequential scan, which then read the whole table at every batch as
    // the outbox grew between two autovacuums: under load, a busy `auto`
    // relay's batches of ~13 events read ~250 buffers each instead of ~40.
    installed db;
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    // No autovacuum or autoanalyze meanwhile: new statistics replace the plan.
    tx.exec(fmt::format("ALTER TABLE {}.events SET (autovacuum_enabled = false)", db.schema.q()));
    // The outcome session's settings, and those it runs `complete` with.
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    for (const auto& setting : pg::store::complete_settings()) tx.exec(setting);
    tx.exec("SET plan_cache_mode = force_generic_plan");
    tx.exec("PREPARE complete AS " + without_semicolon(pg::q::complete::text(db.schema.name())));
    tx.exec("EXPLAIN EXECUTE complete('{}', '{}', 'a', '{}', '{}')");  // the generic plan, made on the empty table
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, 100000)",
                        db.schema.q()));
    const auto leased = tx.exec(fmt::format(
        "UPDATE {0}.events SET attempts = 1, lease_owner = 'a', available_at = now() + interval '1 minute' "
        "WHERE id IN (SELECT id FROM {0}.events ORDER BY id DESC LIMIT 16) RETURNING id, ctid",
        db.schema.q()));
    std::vector<std::string> ids, attempts, tids;
    for (const auto& row : leased) {
        ids.push_back(row[0].c_str());
        attempts.emplace_back("1");
        tids.push_back(fmt::format("\"{}\"", row[1].c_str()));
    }
    tx.exec("BEGIN");
    const auto plan = analyzed_plan(tx, fmt::format("EXECUTE complete('{{{}}}', '{{{}}}', 'a', '{{{}}}', NULL)",
                                                    fmt::join(ids, ","), fmt::join(attempts, ","),
                                                    fmt::join(tids, ",")));
    const auto deleted = tx.exec1(fmt::format("SELECT 100000 - count(*) FROM {}.events", db.schema.q()))[0].as<int>();
    tx.exec("ROLLBACK");
    const auto nodes = plan_nodes(plan);
    CAPTURE(nodes);
    CHECK(deleted == 16);
    // The 16 rows and the page each is on: a few dozen buffers. The whole
    // table is ~900.
    CHECK(buffers_of(plan) <= 200);
    CHECK(rows_removed(plan) <= 100);
}

namespace {

// tx as the relay's claiming session, with `claim_from` (a claim of 16 from
// the low mark) prepared, and no autovacuum on the events table to tidy up
// behind the test's dead rows.
void prepare_claim_from(pqxx::nontransaction& tx, const installed& db, const pg::store& s) {
    tx.exec(fmt::format("ALTER TABLE {}.events SET (autovacuum_enabled = false)", db.schema.q()));
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
    tx.exec("PREPARE claim_from AS " + without_semicolon(s.claim_sql(16, pg::claim_from::low_mark, false)));
}

// 5,000 events written and delivered in the last 4 s; their rows scattered
// over the table in another order than their index entries', as leases
// leave them.
void write_and_deliver_recent(pqxx::nontransaction& tx, const installed& db) {
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload, available_at) "
                        "SELECT 't', '{{}}', now() - (i * 7919 % 5000 + 1) * interval '0.8 millisecond' "
                        "FROM generate_series(1, 5000) AS i",
                        db.schema.q()));
    tx.exec(fmt::format("DELETE FROM {}.events", db.schema.q()));
}

}  // namespace

TEST_CASE("a busy relay's claim that leases events does not read the index entries of the last minute's leases") {
    // Each lease moves its row's available_at a lease period ahead, into a
    // new index entry, and the event is deleted when delivered: the entries
    // of every lease of the last minute lie between now and the leases in
    // flight, dead until vacuum. The search for the next due walked all of
    // them at every claim (a busy relay claims ~10 events at a time, back to
    // back): ~70 buffers a claim after 10 s at 4,000 events/s. Here: 50,000
    // such entries (~170 index pages), then a claim of 10 due events.
    installed db;
    const auto s = db.store("a");
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    prepare_claim_from(tx, db, s);
    // Written an hour ago (their first entries lie behind the low mark),
    // leased over the last minute, delivered.
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload, available_at) "
                        "SELECT 't', '{{}}', now() - interval '1 hour' FROM generate_series(1, 50000)",
                        db.schema.q()));
    tx.exec(fmt::format("UPDATE {}.events SET attempts = 1, lease_owner = 'b', "
                        "available_at = now() + (id % 60000) * interval '1 millisecond'",
                        db.schema.q()));
    tx.exec(fmt::format("DELETE FROM {}.events", db.schema.q()));
    // The first scan to meet them marks them dead in the index; later ones
    // still read their pages.
    tx.exec(fmt::format("SELECT available_at FROM {}.events WHERE available_at > now() ORDER BY available_at LIMIT 1",
                        db.schema.q()));
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, 10)",
                        db.schema.q()));
    // followed: a busy `auto` relay's claim
    const std::string args = "'a', 60000, now() - interval '5 seconds', true";
    tx.exec("BEGIN");
    const auto plan = analyzed_plan(tx, "EXECUTE claim_from(" + args + ")");
    const auto leased =
        tx.exec1(fmt::format("SELECT count(*) FROM {}.events WHERE lease_owner = 'a'", db.schema.q()))[0].as<int>();
    tx.exec("ROLLBACK");
    const auto nodes = plan_nodes(plan);
    CAPTURE(nodes);
    CHECK(leased == 10);
    // 10 rows leased, their old and new index entries: ~100 buffers.
    CHECK(buffers_of(plan) <= 150);
}

TEST_CASE("a claim that comes back less than full walks its range of the claim index once, even while a long "
          "transaction keeps the entries of delivered events alive") {
    // While a transaction elsewhere holds back vacuum, the index entries of
    // events delivered since cannot be marked dead, so a claim visits the
    // heap for each entry in its range: the last 5 s of delivered events
    // (the low mark). A claim that came back less than full then walked
    // that range once to pick its rows and once more to find its bound (with
    // keys, a third time for the key rule): at 300 events/s under a held
    // transaction, ~3,300 buffers and ~1.5 ms a claim against ~25 and
    // ~0.15 ms without one (bench/results/claims-long-transaction-2026-12-03.md).
    for (const bool keyed : {false, true}) {
        CAPTURE(keyed);
        installed db;
        const auto s = db.store("a");
        auto conn = testing::connect();
        pqxx::nontransaction tx(*conn);
        prepare_claim_from(tx, db, s);

        auto holder_conn = testing::connect();
        // One snapshot for the whole transaction, and an xid.
        pqxx::transaction<pqxx::repeatable_read> holder(*holder_conn, "long transaction");
        holder.exec("SELECT txid_current()");

        write_and_deliver_recent(tx, db);  // behind the hold
        tx.exec(fmt::format("INSERT INTO {}.events (topic, payload, ordering_key) "
                            "SELECT 't', '{{}}', {} FROM generate_series(1, 3) AS i",
                            db.schema.q(), keyed ? "'k' || i" : "NULL"));
        // One walk of the range the claim reads, to its bound (4 x 16 + 256 rows).
        const auto walk = analyzed_plan(tx, fmt::format("SELECT e.id, e.ctid, e.ordering_key FROM {}.events e "
                                                        "WHERE e.available_at <= now() "
                                                        "AND e.available_at >= now() - interval '5 seconds' "
                                                        "ORDER BY e.available_at, e.id LIMIT 320",
                                                        db.schema.q()));
        REQUIRE(buffers_of(walk) >= 1000);  // a heap visit for each of the 5,000 entries (~30 a page)

        tx.exec("BEGIN");
        const auto plan = analyzed_plan(tx, "EXECUTE claim_from('a', 60000, now() - interval '5 seconds', false)");
        const auto leased =
            tx.exec1(fmt::format("SELECT count(*) FROM {}.events WHERE lease_owner = 'a'", db.schema.q()))[0].as<int>();
        tx.exec("ROLLBACK");
        holder.commit();
        const auto nodes = plan_nodes(plan);
        CAPTURE(nodes);
        CAPTURE(buffers_of(walk));
        CHECK(leased == 3);
        // The walk once, and a few dozen buffers for the rest (three leases,
        // their holds, the search for the next due).
        CHECK(buffers_of(plan) <= buffers_of(walk) + 200);
    }
}

TEST_CASE("with no writer in progress, a claim from a checked low mark walks only what was written since the check, "
          "even while a long transaction keeps the entries of delivered events alive") {
    // The walk left by the test above: the range behind the low mark. A low
    // mark 5 s back held every event delivered in the last 5 s; one that
    // rests on a check of the writers in progress (tests/pg/
    // low_mark_pgtest.cpp) holds what was written since the check.
    installed db;
    auto s = db.store("a");
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    prepare_claim_from(tx, db, s);
    auto holder_conn = testing::connect();
    pqxx::transaction<pqxx::repeatable_read> holder(*holder_conn, "long transaction");
    holder.exec("SELECT txid_current()");

    write_and_deliver_recent(tx, db);  // behind the hold
    std::this_thread::sleep_for(100ms);  // all of them written more than 50 ms before the check
    const auto from_start = s.claim(16, 30s);
    const auto checked = s.claim(16, 30s, std::nullopt, from_start.low_mark);
    const auto resting = s.claim(16, 30s, std::nullopt, checked.low_mark);
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, 3)",
                        db.schema.q()));
    // What a low mark 5 s back walked.
    const auto walk = analyzed_plan(tx, fmt::format("SELECT e.id FROM {}.events e WHERE e.available_at <= now() "
                                                    "AND e.available_at >= now() - interval '5 seconds' "
                                                    "ORDER BY e.available_at, e.id LIMIT 320",
                                                    db.schema.q()));
    REQUIRE(buffers_of(walk) >= 1000);

    tx.exec("BEGIN");
    const auto plan =
        analyzed_plan(tx, "EXECUTE claim_from('a', 60000, " + tx.quote(resting.low_mark) + ", false)");
    const auto leased =
        tx.exec1(fmt::format("SELECT count(*) FROM {}.events WHERE lease_owner = 'a'", db.schema.q()))[0].as<int>();
    tx.exec("ROLLBACK");
    holder.commit();
    const auto nodes = plan_nodes(plan);
    CAPTURE(nodes);
    CAPTURE(buffers_of(walk));
    CAPTURE(resting.low_mark);
    CHECK(leased == 3);
    CHECK(buffers_of(plan) <= 200);
}

namespace {

// The state a drained outbox leaves (see the claims' test above) on both
// tables: their pages remain, their statistics say 0 rows.
void drain_and_leave_pages(pqxx::nontransaction& tx, installed& db, const std::string& state, int rows) {
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, {})",
                        db.schema.q(), rows));
    tx.exec(fmt::format("INSERT INTO {0}.deliveries (event_id, destination) SELECT id, 'd1' FROM {0}.events",
                        db.schema.q()));
    tx.exec(fmt::format("DELETE FROM {}.deliveries", db.schema.q()));
    tx.exec(fmt::format("DELETE FROM {}.events", db.schema.q()));
    tx.exec(fmt::format("{} {}.events", state, db.schema.q()));
    tx.exec(fmt::format("{} {}.deliveries", state, db.schema.q()));
    REQUIRE(db.query("SELECT bool_and(reltuples = 0 AND relpages > 0) FROM pg_class "
                     "WHERE oid IN ('{s}.events'::regclass, '{s}.deliveries'::regclass)") == "t");
}

void run_claim_deliveries_case(const std::string& state) {
    installed db;
    const auto s = db.store("a");
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    drain_and_leave_pages(tx, db, state, 20000);
    // The claiming session's settings (it claims deliveries too).
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
    tx.exec("PREPARE claim_deliveries AS " + without_semicolon(s.claim_deliveries_sql(128)));
    tx.exec("EXPLAIN EXECUTE claim_deliveries('a', 1, '{d1}', false)");  // the generic plan, made now
    // 20,000 parked events, each owing one delivery, the earliest due
    // belonging to the newest events (a claim in id order would not see it).
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload, fanned_out, available_at) "
                        "SELECT 't', '{{}}', true, 'infinity' FROM generate_series(1, 20000)",
                        db.schema.q()));
    tx.exec(fmt::format("INSERT INTO {0}.deliveries (event_id, destination, available_at) "
                        "SELECT id, 'd1', now() - id * interval '1 millisecond' FROM {0}.events",
                        db.schema.q()));
    for (const std::string mode : {"force_custom_plan", "force_generic_plan"}) {
        CAPTURE(mode);
        tx.exec("SET plan_cache_mode = " + mode);
        tx.exec("BEGIN");
        const auto plan = analyzed_plan(tx, "EXECUTE claim_deliveries('a', 30000, '{d1}', false)");
        const auto leased =
            tx.exec1(fmt::format("SELECT count(*) FROM {}.deliveries WHERE lease_owner = 'a'", db.schema.q()))[0]
                .as<int>();
        tx.exec("ROLLBACK");
        const auto nodes = plan_nodes(plan);
        CAPTURE(nodes);
        CHECK(leased == 128);
        CHECK(plan.value("Actual Rows", 0.0) == 128);
        // 128 deliveries, their events and index entries: ~2,100 buffers,
        // as with true statistics. Each scan of a whole index of events is
        // ~80 more, each walk of events in id order up to a parked one ~260.
        CHECK(buffers_of(plan) <= 3000);
        CHECK(rows_removed(plan) <= 1000);
    }
}

}  // namespace

TEST_CASE("claim_deliveries, planned while the statistics say the outbox is empty but its pages remain, reads only "
          "what it claims") {
    // As `complete` above: it looked each delivery's event up by id, and in
    // that state a plan walked every event in id order per delivery (the
    // check that the event exists, and the join that returns it), or
    // scanned the whole claim index per row.
    in_each_drained_state(run_claim_deliveries_case);
}

namespace {

// One statement that ends (or follows) one event's lease, as the outcome
// session runs it: its arguments, and the rows it should touch.
struct single_row_case {
    std::string name;
    std::string sql;
    std::string args;    // for a plan made before the table filled up
    std::string check;   // counts what the statement did (1), in its transaction
};

template <typename Q>
std::string with_tid(std::string args, std::size_t without_tid, const std::string& tid) {
    if (Q::params.size() > without_tid) args += fmt::format(", '{}'", tid);
    if (Q::params.size() > without_tid + 1) args += ", NULL";  // no hold: a leased row
    return args;
}

void run_single_row_case(const std::string& state) {
    installed db;
    auto conn = testing::connect();
    pqxx::nontransaction tx(*conn);
    drain_and_leave_pages(tx, db, state, 100000);
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    // 100,000 events leased by "a" (attempt 1), as claims leave them; one of
    // them parked by a fan-out, its delivery to d1 done.
    tx.exec(fmt::format("INSERT INTO {}.events (topic, payload, attempts, lease_owner, available_at) "
                        "SELECT 't', '{{}}', 1, 'a', now() + interval '1 minute' FROM generate_series(1, 100000)",
                        db.schema.q()));
    const auto leased = tx.exec1(fmt::format(
        "SELECT id, ctid FROM {}.events ORDER BY id DESC LIMIT 1 OFFSET 1", db.schema.q()));
    const auto parked = tx.exec1(fmt::format(
        "UPDATE {0}.events SET fanned_out = true, available_at = 'infinity', lease_owner = NULL "
        "WHERE id = (SELECT max(id) FROM {0}.events) RETURNING id", db.schema.q()));
    const auto id = leased[0].as<std::int64_t>();
    const std::string tid = leased[1].c_str();
    const auto parked_id = parked[0].as<std::int64_t>();
    const auto in = [&](std::string sql) { return fmt::format(fmt::runtime(sql), db.schema.q(), id, parked_id); };
    const auto text = [&](std::string sql) { return without_semicolon(std::move(sql)); };
    const auto& schema = db.schema.name();
    const std::vector<single_row_case> cases{
        {"reschedule", text(pg::q::reschedule::text(schema)),
         with_tid<pg::q::reschedule>(fmt::format("{}, 1, 'a', 1000, 'e'", id), 5, tid),
         in("SELECT count(*) FROM {0}.events WHERE id = {1} AND lease_owner IS NULL")},
        {"bury", text(pg::q::bury::text(schema)),
         with_tid<pg::q::bury>(fmt::format("{}, 1, 'a', 'e', '500', 'x'", id), 6, tid),
         in("SELECT count(*) FROM {0}.dead_letters WHERE id = {1}")},
        {"hand_back", text(pg::q::hand_back::text(schema)),
         with_tid<pg::q::hand_back>(fmt::format("{}, 1, 'a', 1000", id), 4, tid),
         in("SELECT count(*) FROM {0}.events WHERE id = {1} AND lease_owner IS NULL")},
        {"fan_out", text(pg::q::fan_out::text(schema)),
         with_tid<pg::q::fan_out>(fmt::format("{}, 1, 'a'", id), 3, tid),
         in("SELECT count(*) FROM {0}.events WHERE id = {1} AND fanned_out")},
        {"fan_out_deliveries", text(pg::q::fan_out_deliveries::text(schema)),
         fmt::format("{}, '{{d2}}', '{{0}}', '{{1}}', '{{NULL}}'", parked_id),
         in("SELECT count(*) FROM {0}.deliveries WHERE event_id = {2}")},
        {"fan_out_dead", text(pg::q::fan_out_dead::text(schema)),
         fmt::format("{}, 'd2', 1, 'e', '500', 'x'", parked_id),
         in("SELECT count(*) FROM {0}.dead_letters WHERE id = {2}")},
        {"lock_events", text(pg::q::lock_events::text(schema)), fmt::format("'{{{}}}'", parked_id),
         in("SELECT count(*) FROM {0}.events WHERE id = {2} AND xmax::text::bigint = txid_current() % 4294967296")},
        // Not delete_finished_events: its check for deliveries left walks
        // deliveries_pkey in that state (bench/NOTES.md, "Database").
    };
    for (const auto& c : cases) {
        CAPTURE(c.name);
        tx.exec("PREPARE " + c.name + " AS " + c.sql);
        for (const std::string mode : {"force_custom_plan", "force_generic_plan"}) {
            CAPTURE(mode);
            tx.exec("SET plan_cache_mode = " + mode);
            tx.exec("BEGIN");
            const auto plan = analyzed_plan(tx, "EXECUTE " + c.name + "(" + c.args + ")");
            const auto did = tx.exec1(c.check)[0].as<int>();
            tx.exec("ROLLBACK");
            const auto nodes = plan_nodes(plan);
            CAPTURE(nodes);
            CHECK(did == 1);
            // One row, its index entries, the key hold, a dead letter: a few
            // dozen buffers. A scan of the whole claim index is ~780.
            CHECK(buffers_of(plan) <= 100);
        }
        tx.exec("DEALLOCATE " + c.name);
    }
}

}  // namespace

TEST_CASE("the single-row outcome statements, planned while the statistics say the outbox is empty but its pages "
          "remain, read only their row") {
    // As `complete` above: looked up by id, in that state each used the
    // claim index (available_at, id), where id is not the leading column:
    // a scan of the whole index per statement.
    in_each_drained_state(run_single_row_case);
}

namespace {

// The store's claims as the relay runs them (claim sequence over the store).
class store_port final : public claim_port {
public:
    explicit store_port(pg::store& s) : s_(s) {}
    claim_result claim_events(std::size_t size, std::chrono::milliseconds lease,
                              const std::optional<claim_watermark>& after,
                              const std::optional<std::string>& low_mark, bool unkeyed) override {
        ++claims;
        return s_.claim(size, lease, after, low_mark, false, unkeyed);
    }
    std::vector<event> claim_deliveries(std::size_t size, std::chrono::milliseconds lease,
                                        std::span<const std::string> destinations) override {
        return s_.claim_deliveries(size, lease, destinations);
    }
    std::size_t release_untracked(const held_leases& keep) override { return s_.release_untracked(keep); }
    window_read_result read_window(const window_read_request& request) override {
        return s_.read_window_page(request);
    }
    int claims = 0;

private:
    pg::store& s_;
};

// `count` events in one statement; the ordering key of the g-th (from 1) is
// the SQL expression `key` of g (NULL: none).
void insert_backlog(installed& db, const std::string& key, int count) {
    CHECK(db.query(fmt::format("WITH backlog AS (INSERT INTO {{s}}.events (topic, ordering_key, payload) "
                               "SELECT 't', {}, '{{}}' FROM generate_series(1, {}) g RETURNING 1) "
                               "SELECT count(*) FROM backlog",
                               key, count)) == std::to_string(count));
}

// What the relay asks of a claim for `wanted` events while nothing is out.
claim_request claim_of(std::size_t wanted) {
    claim_request r;
    r.wanted = wanted;
    r.lease = 30s;
    return r;
}

}  // namespace

TEST_CASE("an event without a key behind a backlog of blocked keys is claimed by the claims that go on behind "
          "the first, and they stop at its end") {
    // 3,000 events over 2 keys, then one without a key, a minute old. A
    // claim of 16 examines 320 rows: the keys' first events and 318 rows
    // that wait behind them. It comes back full, so the relay goes on behind
    // it, and finds the event without a key near the end; the drain ends
    // there, and the look for late commits starts where it began, behind
    // the backlog.
    installed db;
    auto s = db.store("a");
    CHECK(db.query("WITH backlog AS (INSERT INTO {s}.events (topic, ordering_key, payload, available_at) "
                   "SELECT 't', 'key-' || (g % 2), '{}', now() - interval '1 minute' "
                   "FROM generate_series(1, 3000) g RETURNING 1) SELECT count(*) FROM backlog") == "3000");
    const auto loner = db.query("INSERT INTO {s}.events (topic, payload, available_at) "
                                "VALUES ('t', '{}', now() - interval '1 minute') RETURNING id");
    store_port port(s);
    auto r = claim_of(16);
    std::vector<std::int64_t> got;
    bool ended = false;
    for (int run = 0; run < 30 && !ended; ++run) {
        const auto out = run_claim(port, r);
        for (const auto& e : out.events) got.push_back(e.id);
        r.drain_watermark = out.drain_watermark;
        r.low_mark = out.low_mark;
        ended = !out.full;
    }
    CHECK(ended);
    std::sort(got.begin(), got.end());
    // The keys' first events with their runs (7 each: the claim's 16 less
    // the 2 picked, shared out), and the loner.
    std::vector<std::int64_t> expected;
    for (std::int64_t id = 1; id <= 16; ++id) expected.push_back(id);
    expected.push_back(std::stoll(loner));
    CHECK(got == expected);
    // 3,001 rows, 320 a claim: 10 claims, and the one after the drain.
    CHECK(port.claims <= 12);
    // Nothing else is due: the next claim starts behind the backlog.
    const auto again = run_claim(port, r);
    CHECK(again.events.empty());
    CHECK_FALSE(again.full);
    CHECK(port.claims <= 13);
}

TEST_CASE("a claim over more keys than a quarter of its size takes that many keys with runs behind them, and "
          "says it is full so that the claims behind it take the other keys at once") {
    // 100 keys, 10 events each, round robin. Each key a claim takes costs
    // it a hold, a walk of the key index each way and, later, an outcome
    // written at once; a claim of 128 that took all 100 keys' first events
    // left room for runs of one or two. It takes 32 keys (a quarter of its
    // size) with runs of 4, and reports itself full with its watermark at
    // the last key it took, so that the relay claims again at once, behind
    // it, where the other keys' first events are.
    installed db;
    auto s = db.store("a");
    insert_backlog(db, "'key-' || (g % 100)", 1000);
    store_port port(s);
    auto r = claim_of(128);
    std::set<std::string> seen;
    for (int claim = 0; claim < 3; ++claim) {
        CAPTURE(claim);
        const auto out = run_claim(port, r);
        CHECK(out.full);
        REQUIRE(out.drain_watermark);
        std::map<std::string, std::vector<std::int64_t>> by_key;
        for (const auto& e : out.events) by_key[*e.ordering_key].push_back(e.id);
        CHECK(out.events.size() == 128);
        CHECK(by_key.size() == 32);
        for (auto& [key, ids] : by_key) {
            CAPTURE(key);
            CHECK(seen.insert(key).second);  // no key twice
            std::sort(ids.begin(), ids.end());
            REQUIRE(ids.size() == 4);
            // The key's first four events (ids 100 apart), of the 32 keys
            // whose first events come next in the backlog.
            CHECK(ids.front() > claim * 32);
            CHECK(ids.front() <= (claim + 1) * 32);
            for (std::size_t i = 1; i < ids.size(); ++i) CHECK(ids[i] == ids[i - 1] + 100);
        }
        r.drain_watermark = out.drain_watermark;
        r.low_mark = out.low_mark;
    }
    // The four keys left, with their whole backlogs (10 each): fewer keys
    // than the claim may take, so their runs share out all its room.
    const auto last = run_claim(port, r);
    std::set<std::string> keys;
    for (const auto& e : last.events) keys.insert(*e.ordering_key);
    CHECK(keys.size() == 4);
    CHECK(last.events.size() == 40);
    for (const auto& k : keys) CHECK(seen.insert(k).second);
    CHECK(seen.size() == 100);
}

TEST_CASE("a claim that took as many keys as it may sets its watermark at its last key, not at the rows without "
          "a key it picked behind it") {
    // Odd ids over 50 keys (each key's first event is its residue: 1, 3,
    // ... 99), even ids without a key. A claim of 64 may take 16 keys: the
    // first events 1..31, and rows without a key, 2..96. The next claim
    // goes on behind the watermark: behind 96, key-33's first event (33)
    // would be out of its reach, and its key would wait until something
    // sent the relay back to the beginning.
    installed db;
    auto s = db.store("a");
    insert_backlog(db, "CASE WHEN g % 2 = 1 THEN 'key-' || (g % 100) END", 400);
    store_port port(s);
    auto r = claim_of(64);
    const auto first = run_claim(port, r);
    CHECK(first.events.size() == 64);
    CHECK(first.full);
    REQUIRE(first.drain_watermark);
    CHECK(first.drain_watermark->id == 31);
    r.drain_watermark = first.drain_watermark;
    r.low_mark = first.low_mark;
    const auto second = run_claim(port, r);
    std::vector<std::int64_t> heads;
    for (const auto& e : second.events) {
        if (e.ordering_key && !e.run_head) heads.push_back(e.id);
    }
    std::sort(heads.begin(), heads.end());
    std::vector<std::int64_t> expected;
    for (std::int64_t id = 33; id <= 63; id += 2) expected.push_back(id);
    CHECK(heads == expected);
}

TEST_CASE("the claim without keys leases only the events without an ordering key, leaves the keyed ones it "
          "picked as they were, and says it picked them") {
    installed db;
    auto s = db.store("a");
    CHECK(db.query("WITH w AS (INSERT INTO {s}.events (topic, ordering_key, payload) VALUES "
                   "('t', NULL, '{{}}'), ('t', NULL, '{{}}'), ('t', 'k', '{{}}'), ('t', 'k', '{{}}'), ('t', NULL, '{{}}') "
                   "RETURNING 1) SELECT count(*) FROM w") == "5");
    const auto unkeyed = s.claim(16, 30s, std::nullopt, std::nullopt, false, true);
    std::vector<std::int64_t> ids;
    for (const auto& e : unkeyed.events) ids.push_back(e.id);
    std::sort(ids.begin(), ids.end());
    CHECK(ids == std::vector<std::int64_t>{1, 2, 5});
    CHECK(unkeyed.picked_keyed);
    CHECK(unkeyed.picked == 5);
    // The keyed ones: no lease, no attempt, no hold.
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE ordering_key IS NOT NULL AND lease_owner IS NULL "
                   "AND leased_until IS NULL AND attempts = 0") == "2");
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds") == "0");

    // The full claim from the same place takes the key's first event and its run.
    const auto full = s.claim(16, 30s);
    ids.clear();
    for (const auto& e : full.events) ids.push_back(e.id);
    std::sort(ids.begin(), ids.end());
    CHECK(ids == std::vector<std::int64_t>{3, 4});
    CHECK(full.picked_keyed);

    // Delivered (deleted, the key's hold dropped, as their outcomes do):
    // nothing keyed left to pick.
    CHECK(db.query("WITH d AS (DELETE FROM {s}.events WHERE id IN (3, 4) RETURNING 1) SELECT count(*) FROM d") == "2");
    CHECK(db.query("WITH d AS (DELETE FROM {s}.key_holds RETURNING 1) SELECT count(*) FROM d") == "1");
    CHECK(db.query("INSERT INTO {s}.events (topic, payload) VALUES ('t', '{{}}') RETURNING id") == "6");
    const auto again = s.claim(16, 30s, std::nullopt, std::nullopt, false, true);
    REQUIRE(again.events.size() == 1);
    CHECK(again.events[0].id == 6);
    CHECK_FALSE(again.picked_keyed);
}

TEST_CASE("claims that go first without keys take a mixed backlog whole, each key in order") {
    // 600 events, every fourth without a key, the others over 3 keys. The
    // relay's claims (run_claim over the store) with unkeyed_first, as an
    // outbox that has not shown a keyed event for a second claims: the
    // claim without keys picks keyed rows at once, and the full claim that
    // follows takes the keys' first events with their runs.
    installed db;
    auto s = db.store("a");
    insert_backlog(db, "CASE WHEN g % 4 = 0 THEN NULL ELSE 'key-' || (g % 3) END", 600);
    store_port port(s);
    auto r = claim_of(64);
    r.unkeyed_first = true;
    std::map<std::string, std::vector<std::int64_t>> by_key;
    std::size_t unkeyed = 0;
    std::size_t total = 0;
    bool picked_keyed = false;
    for (int claim = 0; claim < 200 && total < 600; ++claim) {
        const auto out = run_claim(port, r);
        picked_keyed = picked_keyed || out.picked_keyed;
        std::vector<std::string> got;
        std::map<std::string, std::vector<std::int64_t>> this_claim;  // a claim's rows come in no order
        for (const auto& e : out.events) {
            got.push_back(std::to_string(e.id));
            if (e.ordering_key) {
                this_claim[*e.ordering_key].push_back(e.id);
            } else {
                ++unkeyed;
            }
        }
        for (auto& [key, ids] : this_claim) {
            std::sort(ids.begin(), ids.end());
            by_key[key].insert(by_key[key].end(), ids.begin(), ids.end());
        }
        total += out.events.size();
        // Delivered before the next claim: deleted, the keys' holds dropped
        // (as the outcomes do), and the next claim from the start of the
        // index once this one took all it could (as after a keyed event
        // finished).
        if (!got.empty()) {
            CHECK(db.query(fmt::format("WITH d AS (DELETE FROM {{s}}.events WHERE id IN ({}) RETURNING 1) "
                                       "SELECT count(*) FROM d",
                                       fmt::join(got, ","))) == std::to_string(got.size()));
        }
        db.query("WITH d AS (DELETE FROM {s}.key_holds RETURNING 1) SELECT count(*) FROM d");
        r.drain_watermark = out.drain_watermark;
        r.low_mark.reset();
    }
    CHECK(picked_keyed);
    CHECK(unkeyed == 150);
    CHECK(by_key.size() == 3);
    for (const auto& [key, ids] : by_key) {
        CAPTURE(key);
        CHECK(ids.size() == 150);
        CHECK(std::is_sorted(ids.begin(), ids.end()));  // no claim took a key's event before an earlier one's
    }
}
