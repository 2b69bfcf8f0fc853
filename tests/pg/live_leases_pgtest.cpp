// Leases bound to a live relay (sql/0006, pg::store::bind_leases_to_session
// and take_over_dead_relays) against a real PostgreSQL: real sessions, real
// advisory locks.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "pg/producer.hpp"
#include "pg/status.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using outboxd::testing::scalar;

namespace {

using testing::installed;

pg::new_event ev(std::optional<std::string> key = std::nullopt) {
    pg::new_event e;
    e.topic = "t";
    e.payload = R"({"n":1})";
    e.ordering_key = std::move(key);
    return e;
}

// A session's backend ends a moment after its client closed it: takes over
// until something is taken, or gives up after a deadline.
pg::store::takeover take_over_within(pg::store& s, std::chrono::seconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
        auto t = s.take_over_dead_relays();
        if (!t.relays.empty() || std::chrono::steady_clock::now() > until) return t;
        std::this_thread::sleep_for(10ms);
    }
}

// relay-a and relay-peer, each with its leases bound to its session.
struct two_live_relays {
    installed db;
    pg::store a = db.store("relay-a");
    pg::store peer = db.store("relay-peer");
    two_live_relays() {
        a.bind_leases_to_session();
        peer.bind_leases_to_session();
    }
};

}  // namespace

TEST_CASE("live leases: a relay's leases are not taken over while its session lives, and are the moment it ends") {
    two_live_relays r;
    auto& [db, a, peer] = r;
    const auto keyed = db.enqueue(ev("k"));
    const auto plain = db.enqueue(ev());
    const auto claimed = a.claim(10, 60s);
    REQUIRE(claimed.events.size() == 2);

    // Alive: tried, not taken (several times: a try never steals).
    for (int i = 0; i < 3; ++i) {
        const auto t = peer.take_over_dead_relays();
        CHECK(t.relays.empty());
        CHECK(t.leases == 0);
    }
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE lease_owner = 'relay-a' AND leased_until > now()") == "2");
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds") == "1");

    a.disconnect();  // as a kill -9 would: the session ends, nothing else
    const auto t = take_over_within(peer, 5s);
    REQUIRE(t.relays == std::vector<std::string>{"relay-a"});
    CHECK(t.leases == 2);
    // Due now, attempt kept, key hold gone, relay forgotten.
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE lease_owner IS NULL AND available_at <= now() "
                   "AND attempts = 1") == "2");
    CHECK(db.query("SELECT count(*) FROM {s}.key_holds") == "0");
    CHECK(db.query("SELECT string_agg(lease_owner, ',') FROM {s}.relays") == "relay-peer");
    // The peer claims them at once, as the next attempt.
    const auto again = peer.claim(10, 60s);
    REQUIRE(again.events.size() == 2);
    for (const auto& e : again.events) CHECK(e.attempt == 2);
    // A late outcome of the dead relay (a zombie) is refused by the fencing.
    auto zombie = db.store("relay-a");
    CHECK(zombie.complete(std::vector<pg::lease_ref>{db.lease(keyed, 1), db.lease(plain, 1)}).empty());
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "2");
}

TEST_CASE("live leases: a relay that holds no lock (an older outboxd, or live leases off) is never taken over") {
    installed db;
    auto old = db.store("relay-old");  // not bound
    auto peer = db.store("relay-peer");
    peer.bind_leases_to_session();
    (void)db.enqueue(ev());
    REQUIRE(old.claim(10, 60s).events.size() == 1);
    old.disconnect();
    const auto t = peer.take_over_dead_relays();
    CHECK(t.relays.empty());
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE lease_owner = 'relay-old' AND leased_until > now()") ==
          "1");
}

TEST_CASE("live leases: a relay that lost its connection holds its lock again before its next claim") {
    two_live_relays r;
    auto& [db, a, peer] = r;
    (void)db.enqueue(ev());
    a.disconnect();
    REQUIRE(a.claim(10, 60s).events.size() == 1);  // on a new session, registered again first
    CHECK(peer.take_over_dead_relays().relays.empty());
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE lease_owner = 'relay-a' AND leased_until > now()") == "1");
    CHECK(db.query("SELECT count(*) FROM {s}.relays WHERE lease_owner = 'relay-a'") == "1");
}

TEST_CASE("live leases: a dead relay's lease that already ran out is handed back too, due now") {
    // Since sql/0014 a lease that ran out stays behind the relays' low marks
    // (its end is not in the claim index): only a claim from the start of the
    // index, a sweep, would find it. The takeover hands it back as due now.
    two_live_relays r;
    auto& [db, a, peer] = r;
    const auto id = db.enqueue(ev());
    REQUIRE(a.claim(10, 1ms).events.size() == 1);
    const auto written = db.query("SELECT available_at::text FROM {s}.events");
    std::this_thread::sleep_for(5ms);
    CHECK(db.query("SELECT leased_until <= now() FROM {s}.events") == "t");
    a.disconnect();
    const auto t = take_over_within(peer, 5s);
    REQUIRE(t.relays == std::vector<std::string>{"relay-a"});
    CHECK(t.leases == 1);
    // Due as of the takeover: ahead of any low mark a claim had before it.
    CHECK(db.query("SELECT lease_owner IS NULL AND leased_until IS NULL AND attempts = 1 "
                   "AND available_at > '" + written + "' FROM {s}.events WHERE id = " + std::to_string(id)) == "t");
}

TEST_CASE("live leases: a relay sees the live relays registered with the other consume mode, and only those") {
    installed db;
    auto claiming = db.store("relay-claims");
    auto claiming_too = db.store("relay-claims-2");
    auto windows = db.store("relay-windows");
    windows.set_consume_windows(true);
    claiming.bind_leases_to_session();
    claiming_too.bind_leases_to_session();
    windows.bind_leases_to_session();
    CHECK(db.query("SELECT string_agg(lease_owner || '=' || consume, ',' ORDER BY lease_owner) FROM {s}.relays") ==
          "relay-claims=claims,relay-claims-2=claims,relay-windows=windows");

    const auto seen_by_windows = windows.relays_consuming_otherwise();
    REQUIRE(seen_by_windows.size() == 2);
    CHECK(seen_by_windows[0].lease_owner == "relay-claims");
    CHECK(seen_by_windows[0].consume == "claims");
    CHECK(seen_by_windows[1].lease_owner == "relay-claims-2");
    const auto seen_by_claims = claiming.relays_consuming_otherwise();
    REQUIRE(seen_by_claims.size() == 1);  // not the other claiming relay
    CHECK(seen_by_claims[0].lease_owner == "relay-windows");
    CHECK(seen_by_claims[0].consume == "windows");

    // A relay older than sql/0015 registers without a mode: not counted.
    CHECK(db.query("WITH done AS (UPDATE {s}.relays SET consume = NULL WHERE lease_owner = 'relay-claims-2' "
                   "RETURNING 1) SELECT count(*) FROM done") == "1");
    // A dead relay's row stays until a takeover forgets it: not counted either.
    claiming.disconnect();
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!windows.relays_consuming_otherwise().empty() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(10ms);
    }
    CHECK(windows.relays_consuming_otherwise().empty());
    CHECK(db.query("SELECT count(*) FROM {s}.relays") == "3");
    // The locks it tried are not kept: the dead relay's takeover still works.
    CHECK(take_over_within(windows, 5s).relays == std::vector<std::string>{"relay-claims"});
}

TEST_CASE("live leases: a dead relay being taken over by a peer does not look alive to anyone else meanwhile") {
    // A takeover keeps the dead relay's lock until it commits (so that relay
    // cannot register again in between). Every other relay that asks "who is
    // alive?" meanwhile (a relay choosing its consume mode, the one-mode
    // check, the cursor share, status) must still see it dead: a relay
    // started during a peer's takeover once chose the dead relays' mode and
    // was then refused beside the live ones (exit 8).
    installed db{"pgt", "windows"};
    auto dead = db.store("relay-dead");  // claims
    auto taker = db.store("relay-taker");
    auto second_taker = db.store("relay-taker-2");
    auto reader = db.store("relay-reader");
    reader.set_consume_windows(true);
    for (auto* s : {&dead, &taker, &second_taker, &reader}) s->bind_leases_to_session();
    const auto id = db.enqueue(ev());
    REQUIRE(dead.claim(10, 60s).events.size() == 1);
    dead.disconnect();
    const auto dead_lock_held = [&] {
        return db.query("SELECT count(*) FROM pg_locks l JOIN {s}.relays r ON r.lease_owner = 'relay-dead' "
                        "WHERE l.locktype = 'advisory' AND l.objsubid = 1 "
                        "AND ((l.classid::bigint << 32) | l.objid::bigint) = r.lock_key") != "0";
    };
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (dead_lock_held() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    REQUIRE_FALSE(dead_lock_held());

    // The takeover stops at the dead relay's lease, which another session
    // holds a row lock on: it has found the relay dead and keeps its lock.
    auto blocker_conn = testing::connect();
    pqxx::work blocker(*blocker_conn);
    blocker.exec(fmt::format("SELECT 1 FROM {}.events WHERE id = {} FOR UPDATE", db.schema.q(), id));
    auto takeover = std::async(std::launch::async, [&] { return taker.take_over_dead_relays(); });
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (db.query("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'") == "0") {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        REQUIRE(takeover.wait_for(10ms) == std::future_status::timeout);
    }
    REQUIRE(dead_lock_held());

    // Everyone else still sees the dead relay dead, without waiting.
    const auto owners = [](const std::vector<pg::store::registered_relay>& relays) {
        std::vector<std::string> out;
        for (const auto& r : relays) out.push_back(r.lease_owner);
        return out;
    };
    const std::vector<std::string> claiming_alive{"relay-taker", "relay-taker-2"};
    CHECK(owners(reader.live_relays()) == claiming_alive);
    CHECK(owners(reader.relays_consuming_otherwise()) == claiming_alive);
    CHECK(pg::published_circuits(*db.admin, db.schema.name()).live_relays == 3);
    CHECK(reader.take_free_cursors({}).share == 22);  // ceil(64 / 3 live relays)
    // A second peer skips the relay being taken over: it neither waits for
    // the first takeover nor takes the relay over a second time after it.
    auto second = std::async(std::launch::async, [&] { return second_taker.take_over_dead_relays(); });
    CHECK(second.wait_for(5s) == std::future_status::ready);

    blocker.commit();
    CHECK(second.get().relays.empty());
    const auto t = takeover.get();
    CHECK(t.relays == std::vector<std::string>{"relay-dead"});
    CHECK(t.leases == 1);
    CHECK(db.query("SELECT count(*) FROM {s}.relays WHERE lease_owner = 'relay-dead'") == "0");
}
