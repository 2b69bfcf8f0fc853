// Commit-ordered windows (sql/0009, pg::store::read_window and the cursor
// statements) against a real PostgreSQL: real concurrent transactions,
// savepoints, a prepared transaction, real sessions and advisory locks.
// The claim under test: consecutive windows, the B of one being the A of
// the next, read every committed event exactly once and nothing else.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "core/embedded_sql.hpp"
#include "core/sql_ident.hpp"
#include "core/window_safety.hpp"
#include "pg/migrator.hpp"
#include "pg/named_queries.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using outboxd::testing::scalar;

namespace {

using testing::installed;

// A producer's own session, driven statement by statement (BEGIN, SAVEPOINT,
// PREPARE TRANSACTION ... as written), so a test decides exactly when each
// transaction begins, takes its xid and ends.
class session {
public:
    explicit session(const installed& db) : c_(testing::connect()), schema_(db.schema.q()) {}
    // The first column of the first row, if any.
    std::string exec(const std::string& sql) {
        pqxx::nontransaction tx(*c_);
        const auto r = tx.exec(sql);
        return r.empty() || r.columns() == 0 ? std::string() : r[0][0].c_str();
    }
    std::int64_t enqueue(const std::string& key = "") {
        pqxx::nontransaction tx(*c_);
        const auto k = key.empty() ? std::string("NULL") : tx.quote(key);
        return tx.exec1(fmt::format("SELECT {}.enqueue('t', '{{}}', {})", schema_, k))[0].as<std::int64_t>();
    }

private:
    std::unique_ptr<pqxx::connection> c_;
    std::string schema_;
};

std::string snapshot_now(pqxx::connection& c) { return scalar(c, "SELECT pg_current_snapshot()::text"); }

// Reads the window (A, now] whole, in chunks of `chunk` events, and moves A
// to its B. Returns the ids in the order read.
std::vector<std::int64_t> next_window(pg::store& s, std::string& a, std::size_t chunk = 100000,
                                      const std::optional<std::vector<int>>& slots = std::nullopt) {
    std::vector<std::int64_t> ids;
    std::optional<std::string> b;
    std::int64_t from = 0;
    for (;;) {
        const auto w = s.read_window(a, b, from, slots, chunk, {});
        b = w.snap_b;
        for (const auto& e : w.events) ids.push_back(e.id);
        if (w.events.size() < chunk) break;
        from = w.events.back().id + 1;
    }
    a = *b;
    return ids;
}

std::set<std::int64_t> as_set(const std::vector<std::int64_t>& ids) { return {ids.begin(), ids.end()}; }

}  // namespace

TEST_CASE("windows: consecutive windows read every committed event exactly once, in the first window after its "
          "commit") {
    installed db("win", "windows");
    auto reader = db.store("reader");
    session before(db), spanning(db), early_xid(db), plain(db), aborted(db), saved(db), rolled_back(db),
        prepared(db), later(db), long_tx(db);
    const auto gid = "outboxd_win_" + db.schema.name();
    // A prepared transaction outlives its session: never leave one behind.
    struct rollback_prepared {
        installed& db;
        std::string gid;
        ~rollback_prepared() {
            try {
                pqxx::nontransaction tx(*db.admin);
                if (tx.exec1("SELECT count(*) FROM pg_prepared_xacts WHERE gid = " + tx.quote(gid))[0].as<int>()) {
                    tx.exec("ROLLBACK PREPARED " + tx.quote(gid));
                }
            } catch (...) {
            }
        }
    } cleanup{db, gid};

    const auto e0 = before.enqueue();  // committed before A: never read
    // Begins before A and commits after it. The first xid after e0's, so it
    // is A's xmax: it is not in A's xip, and the window starts at it.
    spanning.exec("BEGIN");
    const auto e_spanning = spanning.enqueue();
    long_tx.exec("BEGIN");
    const auto e_long = long_tx.enqueue("long");  // open across four windows
    early_xid.exec("BEGIN");
    early_xid.exec("SELECT pg_current_xact_id()");  // its xid is taken before A, its event written after

    std::string a = snapshot_now(*db.admin);
    CHECK(std::to_string(snapshot_xmax(a)) == spanning.exec("SELECT pg_current_xact_id()"));

    spanning.exec("COMMIT");
    const auto e_early_xid = early_xid.enqueue("k1");
    early_xid.exec("COMMIT");
    const auto e_plain = plain.enqueue("k1");
    aborted.exec("BEGIN");
    const auto e_aborted = aborted.enqueue();
    aborted.exec("ROLLBACK");
    saved.exec("BEGIN");
    saved.exec("SAVEPOINT s");
    const auto e_saved = saved.enqueue("k2");
    saved.exec("RELEASE SAVEPOINT s");
    saved.exec("COMMIT");
    rolled_back.exec("BEGIN");
    const auto e_kept = rolled_back.enqueue();
    rolled_back.exec("SAVEPOINT s");
    const auto e_undone = rolled_back.enqueue();
    rolled_back.exec("ROLLBACK TO SAVEPOINT s");
    rolled_back.exec("COMMIT");
    prepared.exec("BEGIN");
    const auto e_prepared = prepared.enqueue("k2");
    prepared.exec("PREPARE TRANSACTION " + quote_literal(gid));

    std::map<std::int64_t, int> read_in;  // id -> window
    std::vector<std::vector<std::int64_t>> windows;
    const auto read = [&] {
        windows.push_back(next_window(reader, a));
        for (const auto id : windows.back()) {
            CHECK_MESSAGE(read_in.count(id) == 0, "id ", id, " read again in window ", windows.size());
            read_in[id] = static_cast<int>(windows.size());
        }
        CHECK(std::is_sorted(windows.back().begin(), windows.back().end()));
    };

    read();  // 1
    CHECK(as_set(windows[0]) == std::set<std::int64_t>{e_spanning, e_early_xid, e_plain, e_saved, e_kept});
    const auto e_later = later.enqueue();
    read();  // 2
    CHECK(windows[1] == std::vector<std::int64_t>{e_later});
    {
        pqxx::nontransaction tx(*db.admin);
        tx.exec("COMMIT PREPARED " + tx.quote(gid));
    }
    read();  // 3
    CHECK(windows[2] == std::vector<std::int64_t>{e_prepared});
    read();  // 4: nothing, the long transaction still open
    CHECK(windows[3].empty());
    long_tx.exec("COMMIT");
    read();  // 5
    CHECK(windows[4] == std::vector<std::int64_t>{e_long});
    read();  // 6
    CHECK(windows[5].empty());
    CHECK(read_in.count(e0) == 0);
    CHECK(read_in.count(e_aborted) == 0);
    CHECK(read_in.count(e_undone) == 0);
}

TEST_CASE("windows: concurrent producers that commit or roll back at random; the ids read are the committed ids, "
          "each once") {
    installed db("win", "windows");
    auto reader = db.store("reader");
    constexpr int producers = 4;
    constexpr int transactions_each = 120;
    std::mutex m;
    std::set<std::int64_t> committed;
    std::atomic<int> running{producers};
    std::string a = snapshot_now(*db.admin);

    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
        threads.emplace_back([&, p] {
            session s(db);
            std::mt19937 rng(static_cast<unsigned>(p) * 7919U + 17U);
            std::uniform_int_distribution<int> percent(0, 99);
            for (int t = 0; t < transactions_each; ++t) {
                std::vector<std::int64_t> mine;
                s.exec("BEGIN");
                // Some take their xid well before their first event.
                if (percent(rng) < 30) s.exec("SELECT pg_current_xact_id()");
                const int n = 1 + percent(rng) % 3;
                for (int i = 0; i < n; ++i) {
                    // A sleep creates the interleavings (a transaction open
                    // across windows); nothing waits on it.
                    if (percent(rng) < 40) std::this_thread::sleep_for(std::chrono::microseconds(percent(rng) * 60));
                    if (percent(rng) < 20) {
                        s.exec("SAVEPOINT s");
                        const auto id = s.enqueue(percent(rng) < 50 ? "key" + std::to_string(percent(rng) % 5) : "");
                        if (percent(rng) < 50) {
                            s.exec("ROLLBACK TO SAVEPOINT s");
                        } else {
                            s.exec("RELEASE SAVEPOINT s");
                            mine.push_back(id);
                        }
                    } else {
                        mine.push_back(s.enqueue(percent(rng) < 50 ? "key" + std::to_string(percent(rng) % 5) : ""));
                    }
                }
                if (percent(rng) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(percent(rng) % 20));
                if (percent(rng) < 25) {
                    s.exec("ROLLBACK");
                } else {
                    s.exec("COMMIT");
                    const std::lock_guard lock(m);
                    committed.insert(mine.begin(), mine.end());
                }
            }
            --running;
        });
    }

    std::multiset<std::int64_t> read_ids;
    int windows = 0;
    std::mt19937 rng(4242);
    const auto read_one = [&] {
        // Chunks of 7 now and then: a window read in pieces with the same A and B.
        const std::size_t chunk = rng() % 3 == 0 ? 7 : 100000;
        for (const auto id : next_window(reader, a, chunk)) read_ids.insert(id);
        ++windows;
    };
    while (running > 0) read_one();
    for (auto& t : threads) t.join();
    read_one();  // after the last commit

    std::set<std::int64_t> distinct(read_ids.begin(), read_ids.end());
    CHECK(distinct.size() == read_ids.size());  // nothing read twice
    std::vector<std::int64_t> missing, extra;
    std::set_difference(committed.begin(), committed.end(), distinct.begin(), distinct.end(),
                        std::back_inserter(missing));
    std::set_difference(distinct.begin(), distinct.end(), committed.begin(), committed.end(),
                        std::back_inserter(extra));
    CHECK_MESSAGE(missing.empty(), missing.size(), " committed events never read, e.g. ",
                  missing.empty() ? 0 : missing.front());
    CHECK_MESSAGE(extra.empty(), extra.size(), " events read that were not committed");
    CHECK(committed.size() > 300);
    MESSAGE(fmt::format("{} committed events read over {} windows", committed.size(), windows));
}

TEST_CASE("windows: a large window read in chunks, or by slot, gives the ids of one read") {
    installed db("win", "windows");
    auto reader = db.store("reader");
    const std::string a = snapshot_now(*db.admin);
    session open(db), p(db), late(db);
    open.exec("BEGIN");
    const auto e_open = open.enqueue("held");  // running at A's successor, then committed: in xip
    late.exec("BEGIN");
    const auto e_late = late.enqueue();  // running at B (in its xip), committed before the reads: not in B
    for (int t = 0; t < 20; ++t) {
        p.exec(fmt::format("SELECT {}.enqueue('t', jsonb_build_object('g', g), "
                           "CASE WHEN g % 3 = 0 THEN 'key' || (g % 17) END) FROM generate_series(1, 150) g",
                           db.schema.q()));
    }
    open.exec("COMMIT");
    const std::string b = snapshot_now(*db.admin);
    late.exec("COMMIT");
    p.enqueue();  // after B: in no read below

    const auto whole = reader.read_window(a, b, 0, std::nullopt, 1000000, {});
    CHECK(whole.snap_b == b);
    REQUIRE(whole.events.size() == 3001);
    std::vector<std::int64_t> ids;
    for (const auto& e : whole.events) ids.push_back(e.id);
    CHECK(std::is_sorted(ids.begin(), ids.end()));
    CHECK(std::find(ids.begin(), ids.end(), e_open) != ids.end());
    CHECK(std::find(ids.begin(), ids.end(), e_late) == ids.end());

    for (const std::size_t chunk : {1UL, 333UL, 3000UL, 3001UL}) {
        CAPTURE(chunk);
        std::string from_a = a;
        std::vector<std::int64_t> chunked;
        std::int64_t from = 0;
        int reads = 0;
        for (;;) {
            const auto w = reader.read_window(from_a, b, from, std::nullopt, chunk, {});
            ++reads;
            for (const auto& e : w.events) chunked.push_back(e.id);
            if (w.events.size() < chunk) break;
            from = w.events.back().id + 1;
        }
        CHECK(chunked == ids);
        CHECK(reads == static_cast<int>(3001 / chunk + 1));
    }

    // Slots: each event's slot is event_slot() of its key (or id); the
    // windows of every slot group together are the window.
    std::map<std::string, int> key_slot;
    std::vector<std::int64_t> by_slots;
    for (int group = 0; group < 4; ++group) {
        std::vector<int> slots;
        for (int s = group; s < 64; s += 4) slots.push_back(s);
        const auto w = reader.read_window(a, b, 0, slots, 1000000, {});
        for (const auto& e : w.events) {
            CHECK(e.slot % 4 == group);
            if (e.ordering_key) {
                const auto [it, fresh] = key_slot.emplace(*e.ordering_key, e.slot);
                CHECK(it->second == e.slot);
            }
            by_slots.push_back(e.id);
        }
    }
    std::sort(by_slots.begin(), by_slots.end());
    CHECK(by_slots == ids);
    const auto some = whole.events[1500];
    CHECK(std::to_string(some.slot) ==
          db.query(fmt::format("SELECT {{s}}.event_slot(ordering_key, id) FROM {{s}}.events WHERE id = {}", some.id)));

    // The events of a page, by id.
    const std::vector<std::int64_t> page{ids[0], ids[10], ids[3000]};
    const auto bodies = reader.fetch_events(page);
    REQUIRE(bodies.size() == 3);
    CHECK(bodies[0].id == ids[0]);
    CHECK(bodies[2].id == ids[3000]);
    CHECK(bodies[1].topic == "t");
    CHECK(bodies[1].headers == "{}");
    CHECK(bodies[1].payload.find("\"g\"") != std::string::npos);
}

TEST_CASE("windows: the read returns B, both xmaxes and the server's time; the server passes the safety check") {
    installed db("win", "windows");
    auto reader = db.store("reader");
    const std::string a = snapshot_now(*db.admin);
    (void)db.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = std::nullopt, .idempotency_key = std::nullopt});
    const auto w = reader.read_window(a, std::nullopt, 0, std::nullopt, 10, {});
    CHECK(w.events.size() == 1);
    CHECK(w.a_xmax == snapshot_xmax(a));
    CHECK(w.b_xmax == snapshot_xmax(w.snap_b));
    CHECK(w.b_xmax > w.a_xmax);
    CHECK(w.now_us > 0);
    const auto server = reader.window_safety();
    CHECK_FALSE(server.in_recovery);
    CHECK(server.next_xid >= w.b_xmax);
    CHECK(std::to_string(server.system_identifier) ==
          scalar(*db.admin, "SELECT system_identifier FROM pg_control_system()"));
    CHECK(check_window({w.b_xmax, server.system_identifier}, server) == window_verdict::fine);
    CHECK(check_window({server.next_xid + 1, server.system_identifier}, server) == window_verdict::xid_regression);
}

TEST_CASE("windows: an event the read sees committed is due by the read's time, though it began after the read's "
          "statement did") {
    installed db("win", "windows");
    const std::string a = snapshot_now(*db.admin);
    auto sql = pg::query_book(db.schema.name()).sql<pg::q::read_window>();
    while (!sql.empty() && (sql.back() == ';' || std::isspace(static_cast<unsigned char>(sql.back())))) sql.pop_back();
    // The read's now() is taken before its snapshot (a statement's parse and
    // plan come between them; here, as a transaction's now(), a whole
    // statement earlier). An event whose transaction began in between and
    // committed before the snapshot carries an available_at after that now().
    auto c = testing::connect();
    pqxx::work tx(*c);
    (void)tx.exec("SELECT now()");
    const auto id = db.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = std::nullopt,
                                             .idempotency_key = std::nullopt});
    const auto row = tx.exec_params1("WITH r AS (" + sql + ") SELECT r.ids[1], r.available_at_us[1], r.now_us FROM r",
                                     a, nullptr, 0, nullptr, 10, "{hooks}");
    REQUIRE(row[0].as<std::int64_t>() == id);
    CHECK(row[1].as<std::int64_t>() <= row[2].as<std::int64_t>());
}

TEST_CASE("windows: ordering keys that need quoting in an array come back as written") {
    installed db("win", "windows");
    auto reader = db.store("reader");
    const std::string a = snapshot_now(*db.admin);
    const std::vector<std::string> keys{"NULL", "a \"quoted\" key", "back\\slash", "comma,{brace}", " spaced ", "ключ"};
    std::vector<std::int64_t> ids;
    for (const auto& k : keys) {
        ids.push_back(db.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = k, .idempotency_key = std::nullopt}));
    }
    const auto unkeyed = db.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = std::nullopt, .idempotency_key = std::nullopt});
    const auto w = reader.read_window(a, std::nullopt, 0, std::nullopt, 100, {});
    REQUIRE(w.events.size() == keys.size() + 1);
    for (std::size_t i = 0; i < keys.size(); ++i) {
        CHECK(w.events[i].id == ids[i]);
        CHECK(w.events[i].ordering_key == keys[i]);
    }
    CHECK(w.events.back().id == unkeyed);
    CHECK_FALSE(w.events.back().ordering_key);
}

TEST_CASE("windows: a cursor is taken from its owner only when its relay is dead, and a stale epoch writes nothing") {
    installed db("win", "windows");
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    a.bind_leases_to_session();
    b.bind_leases_to_session();

    const auto mine = a.take_cursor("hooks", 5);
    REQUIRE(mine);
    CHECK(mine->epoch == 1);
    CHECK_FALSE(mine->snap_b);
    CHECK(mine->done_below == 0);
    CHECK(std::to_string(mine->system_identifier) ==
          scalar(*db.admin, "SELECT system_identifier FROM pg_control_system()"));
    // Another cursor of the same destination, and the same slot of another, are separate.
    CHECK(b.take_cursor("hooks", 6));
    CHECK(b.take_cursor("audit", 5));

    // Alive: tried, never taken.
    for (int i = 0; i < 3; ++i) CHECK_FALSE(b.take_cursor("hooks", 5));

    const std::string a_snap = snapshot_now(*db.admin);
    const auto w = a.read_window(mine->snap_a, std::nullopt, 0, std::nullopt, 10, {});
    CHECK(a.checkpoint_cursor("hooks", 5, mine->epoch, mine->snap_a, w.snap_b, 42));
    // Taking it again ourselves (our session was replaced): a new epoch; the old one is fenced.
    const auto again = a.take_cursor("hooks", 5);
    REQUIRE(again);
    CHECK(again->epoch == 2);
    CHECK(again->snap_b == w.snap_b);
    CHECK(again->done_below == 42);
    CHECK_FALSE(a.checkpoint_cursor("hooks", 5, mine->epoch, a_snap, std::nullopt, 0));

    // relay-a's session ends: relay-b takes the cursor where it was checkpointed.
    a.disconnect();
    std::optional<pg::store::cursor_lease> taken;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!taken && std::chrono::steady_clock::now() < deadline) {
        taken = b.take_cursor("hooks", 5);
        if (!taken) std::this_thread::sleep_for(10ms);
    }
    REQUIRE(taken);
    CHECK(taken->epoch == 3);
    CHECK(taken->snap_a == mine->snap_a);
    CHECK(taken->snap_b == w.snap_b);
    CHECK(taken->done_below == 42);

    // relay-a comes back: its stale epoch writes nothing, and it cannot take the cursor back.
    a.bind_leases_to_session();
    CHECK_FALSE(a.checkpoint_cursor("hooks", 5, again->epoch, a_snap, std::nullopt, 0));
    CHECK_FALSE(a.release_cursor("hooks", 5, again->epoch));
    CHECK_FALSE(a.take_cursor("hooks", 5));
    CHECK(db.query("SELECT done_below || ' ' || owner || ' ' || epoch FROM {s}.cursors "
                   "WHERE destination = 'hooks' AND slot = 5") == "42 relay-b 3");

    // Handed back: anyone takes it, with a new epoch.
    CHECK(b.checkpoint_cursor("hooks", 5, taken->epoch, w.snap_b, std::nullopt, 0));
    CHECK(b.release_cursor("hooks", 5, taken->epoch));
    const auto back = a.take_cursor("hooks", 5);
    REQUIRE(back);
    CHECK(back->epoch == 4);
    CHECK(back->snap_a == w.snap_b);
    CHECK_FALSE(back->snap_b);

    // An owner that is not a registered relay (never was, or was forgotten) holds nothing.
    (void)db.query("UPDATE {s}.cursors SET owner = 'ghost' WHERE destination = 'hooks' AND slot = 5 RETURNING 1");
    const auto from_ghost = b.take_cursor("hooks", 5);
    REQUIRE(from_ghost);
    CHECK(from_ghost->epoch == 5);

    // A checkpoint whose B is behind its A is refused by the table.
    CHECK_THROWS((void)b.checkpoint_cursor("hooks", 5, from_ghost->epoch, w.snap_b, mine->snap_a, 0));
}

TEST_CASE("windows: migrations 0009 to 0016 and consume-setup windows apply to an outbox with pending events, deliveries and "
          "key holds, without rewriting it; pending events are in no window and today's claim still delivers them") {
    testing::scratch_schema schema("win");
    auto c = testing::connect();
    {
        pqxx::work tx(*c);
        for (const auto& q : embedded::queries()) {
            if (q.name == "bootstrap") tx.exec(render_sql(q.sql, schema.name()));
        }
        for (const auto& m : embedded::migrations()) {
            if (m.version < 9) tx.exec(render_sql(m.sql, schema.name()));
        }
        tx.commit();
    }
    const auto s = schema.q();
    const auto q = [&](const std::string& sql) { return scalar(*c, fmt::format(fmt::runtime(sql), fmt::arg("s", s))); };
    REQUIRE(q("SELECT max(version) FROM {s}.schema_migrations") == "8");
    (void)q("SELECT count({s}.enqueue('t', '{{}}', CASE WHEN g % 2 = 0 THEN 'k' || g % 3 END)) "
            "FROM generate_series(1, 10) g");
    (void)q("WITH d AS (INSERT INTO {s}.deliveries (event_id, destination, ordering_key) "
            "SELECT id, 'hooks', ordering_key FROM {s}.events WHERE id <= 4 RETURNING 1) SELECT count(*) FROM d");
    (void)q("WITH h AS (INSERT INTO {s}.key_holds (ordering_key, destination, event_id, until) "
            "VALUES ('k1', 'hooks', 4, now() + interval '1 minute') RETURNING 1) SELECT count(*) FROM h");
    const auto filenode = q("SELECT pg_relation_filenode('{s}.events')");
    const std::string a = scalar(*c, "SELECT pg_current_snapshot()::text");

    const auto r = pg::migrate(*c, schema.name());
    CHECK(r.applied == std::vector<int>{9, 10, 11, 12, 13, 14, 15, 16});
    // 0016 sets the outbox up for windows, as consume-setup windows does
    // (which may come before or after it: same statements, same names).
    CHECK(q("SELECT count(*) FROM pg_indexes WHERE schemaname = '" + schema.name() + "' AND indexname IN "
            "('events_txid_idx', 'events_pre_window_key_idx')") == "2");
    CHECK(q("SELECT count(*) FROM information_schema.columns WHERE table_schema = '" + schema.name() +
            "' AND column_name = 'txid' AND column_default IS NOT NULL") == "1");
    testing::set_up_consume(*c, schema.name(), "windows");
    CHECK(q("SELECT pg_relation_filenode('{s}.events')") == filenode);  // no rewrite
    CHECK(q("SELECT count(*) FILTER (WHERE txid IS NULL) || '/' || count(*) FROM {s}.events") == "10/10");
    CHECK(q("SELECT count(*) FROM {s}.deliveries") == "4");
    CHECK(q("SELECT count(*) FROM {s}.key_holds") == "1");

    pg::store reader(testing::database_url(), schema.name(), "reader");
    const auto fresh = reader.read_window("1:1:", std::nullopt, 0, std::nullopt, 1000, {});
    CHECK(fresh.events.empty());  // the pending ones have no txid: in no window
    pg::producer producer(testing::database_url(), schema.name());
    const auto after = producer.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = std::nullopt, .idempotency_key = std::nullopt});
    const auto w = reader.read_window(a, std::nullopt, 0, std::nullopt, 1000, {});
    REQUIRE(w.events.size() == 1);
    CHECK(w.events[0].id == after);
    // A new event of a key whose pending events are from before the
    // migration (k0: ids 6 and 10, no deliveries) waits behind them; one of
    // a new key does not.
    CHECK(q("SELECT count(*) FROM {s}.deliveries WHERE ordering_key = 'k0'") == "0");
    const auto behind = producer.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = "k0", .idempotency_key = std::nullopt});
    const auto fresh_key = producer.enqueue(pg::new_event{.topic = "t", .payload = "{}", .ordering_key = "new", .idempotency_key = std::nullopt});
    const auto upgraded = reader.read_window(w.snap_b, std::nullopt, 0, std::nullopt, 1000, {});
    REQUIRE(upgraded.events.size() == 2);
    CHECK(upgraded.events[0].id == behind);
    CHECK(upgraded.events[0].key_pending);
    CHECK(upgraded.events[1].id == fresh_key);
    CHECK_FALSE(upgraded.events[1].key_pending);

    // Today's relay is unchanged: it claims the pending events (and the new one) as before.
    pg::store relay(testing::database_url(), schema.name(), "relay");
    const auto claimed = relay.claim(100, 60s);
    std::set<std::int64_t> claimed_ids;
    for (const auto& e : claimed.events) claimed_ids.insert(e.id);
    CHECK(claimed_ids.count(5) == 1);  // pending, unkeyed, from before the migration
    CHECK(claimed_ids.count(after) == 1);
}

namespace {

pg::new_event window_event(std::optional<std::string> key = std::nullopt,
                           std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    pg::new_event e;
    e.topic = "t";
    e.payload = R"({"n":1})";
    e.ordering_key = std::move(key);
    e.delay = delay;
    return e;
}

int slot_of(installed& db, const std::string& key) {
    return std::stoi(db.query("SELECT {s}.event_slot(" + quote_literal(key) + ", 0)"));
}

// A key of another slot than every one in `taken`.
std::string key_in_new_slot(installed& db, const std::set<int>& taken, const std::string& prefix) {
    for (int i = 0;; ++i) {
        const auto key = prefix + std::to_string(i);
        if (!taken.count(slot_of(db, key))) return key;
    }
}

pg::owed_delivery owed(const std::string& destination, int attempts = 0,
                       std::optional<std::string> error = std::nullopt,
                       std::chrono::milliseconds due_in = std::chrono::milliseconds(0)) {
    return pg::owed_delivery{.destination = destination, .due_in = due_in, .attempts = attempts, .error = std::move(error)};
}

pg::dead_delivery dead(const std::string& destination, const std::string& error, std::optional<int> status) {
    return pg::dead_delivery{
        .destination = destination, .attempts = 1, .error = error, .status = status, .response_excerpt = "gone"};
}

}  // namespace

TEST_CASE("windows: an event committed before its slot's cursor exists is read by the cursor's first window") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto before = db.enqueue(window_event("early"));
    const auto cursor = relay.take_cursor("", slot_of(db, "early"));
    REQUIRE(cursor);
    const auto w = relay.read_window(cursor->snap_a, std::nullopt, 0, std::vector<int>{slot_of(db, "early")}, 100, {});
    REQUIRE(w.events.size() == 1);
    CHECK(w.events[0].id == before);
}

TEST_CASE("windows: parked window events of a key are claimed by claim_deliveries one at a time in id order per "
          "destination; a delayed event is parked due at its available_at") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto k1 = db.enqueue(window_event("k"));
    const auto k2 = db.enqueue(window_event("k"));
    const auto k3 = db.enqueue(window_event("k"));
    const auto delayed = db.enqueue(window_event(std::nullopt, 1h));

    std::map<int, std::int64_t> epochs;  // slot -> epoch
    for (const int slot : {slot_of(db, "k"), std::stoi(db.query(fmt::format(
                                                 "SELECT {{s}}.event_slot(NULL, {})", delayed)))}) {
        const auto c = relay.take_cursor("", slot);
        REQUIRE(c);
        epochs[slot] = c->epoch;
    }
    const auto w = relay.read_window("1:1:", std::nullopt, 0, std::nullopt, 100, {});
    REQUIRE(w.events.size() == 4);
    const auto epoch_of = [&](std::size_t i) { return epochs.at(w.events[i].slot); };
    CHECK(w.events[3].id == delayed);
    CHECK(w.events[3].available_at_us > w.now_us + 3500LL * 1000 * 1000);

    // k1 failed at hooks (delivered at audit); k2 and k3 queue behind it at both
    // (key pending); the delayed one was not due: owed at hooks when it is.
    const std::vector<pg::store::window_park> parks{
        {.id = k1, .epoch = epoch_of(0), .owed = {owed("hooks", 1, "HTTP 503")}, .dead = {}},
        {.id = k2, .epoch = epoch_of(1), .owed = {owed("hooks"), owed("audit")}, .dead = {}},
        {.id = k3, .epoch = epoch_of(2), .owed = {owed("hooks"), owed("audit")}, .dead = {}},
        {.id = delayed, .epoch = epoch_of(3), .owed = {owed("hooks")}, .dead = {}},
    };
    CHECK(relay.park_window_events(parks) == std::vector<std::int64_t>{k1, k2, k3, delayed});
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE fanned_out AND available_at = 'infinity' "
                   "AND lease_owner IS NULL") == "4");
    CHECK(db.query(fmt::format("SELECT attempts || ' ' || last_error FROM {{s}}.deliveries "
                               "WHERE event_id = {} AND destination = 'hooks'", k1)) == "1 HTTP 503");
    CHECK(db.query(fmt::format("SELECT count(*) FROM {{s}}.deliveries WHERE event_id = {}", k1)) == "1");
    CHECK(db.query(fmt::format("SELECT d.available_at = e.created_at + interval '1 hour' FROM {{s}}.deliveries d "
                               "JOIN {{s}}.events e ON e.id = d.event_id WHERE d.event_id = {}",
                               delayed)) == "t");
    CHECK(db.query(fmt::format("SELECT (extract(epoch FROM available_at) * 1000000)::bigint FROM {{s}}.deliveries "
                               "WHERE event_id = {}",
                               delayed)) == std::to_string(w.events[3].available_at_us));

    // From here it is today's delivery path: one at a time per key and destination, in id order.
    const std::vector<std::string> destinations{"hooks", "audit"};
    std::vector<std::set<std::string>> rounds;  // what each claim took, as id@destination
    for (int round = 0; round < 4; ++round) {
        const auto claimed = relay.claim_deliveries(10, 60s, destinations);
        pg::delivery_outcomes done;
        rounds.emplace_back();
        for (const auto& e : claimed) {
            rounds.back().insert(fmt::format("{}@{}", e.id, *e.destination));
            done.delivered.push_back({.id = e.id, .destination = *e.destination, .attempt = e.attempt});
        }
        CHECK(relay.finish_deliveries(done) == 0);
    }
    const auto at = [](std::int64_t id, const char* destination) { return fmt::format("{}@{}", id, destination); };
    CHECK(rounds == std::vector<std::set<std::string>>{{at(k1, "hooks"), at(k2, "audit")},
                                                       {at(k2, "hooks"), at(k3, "audit")},
                                                       {at(k3, "hooks")},
                                                       {}});
    // Done everywhere: the keyed events are gone; the delayed one waits for its time.
    CHECK(db.query("SELECT string_agg(id::text, ',') FROM {s}.events") == std::to_string(delayed));
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries WHERE available_at > now() + interval '50 minutes'") == "1");
}

TEST_CASE("windows: a park is fenced by its cursor (owner and epoch), and writing it twice changes nothing") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    auto other = db.store("relay-b");
    other.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto owing = db.enqueue(window_event("k"));
    const auto all_dead = db.enqueue(window_event("k"));
    const auto one_dead = db.enqueue(window_event("k"));
    const auto cursor = relay.take_cursor("", slot_of(db, "k"));
    REQUIRE(cursor);
    const auto park = [&](std::int64_t epoch) {
        return std::vector<pg::store::window_park>{
            {.id = owing, .epoch = epoch, .owed = {owed("hooks", 2, "timeout")}, .dead = {dead("audit", "HTTP 410", 410)}},
            {.id = all_dead, .epoch = epoch, .owed = {}, .dead = {dead("", "no route for topic t", std::nullopt)}},
            {.id = one_dead, .epoch = epoch, .owed = {}, .dead = {dead("hooks", "HTTP 400", 400)}},
        };
    };
    const auto state = [&] {
        return db.query("SELECT concat_ws(' | ', "
                        "(SELECT string_agg(id || ':' || fanned_out || ':' || available_at, ',' ORDER BY id) FROM {s}.events), "
                        "(SELECT string_agg(event_id || ':' || destination || ':' || attempts || ':' || available_at "
                        "|| ':' || coalesce(last_error, '-'), ',' ORDER BY event_id, destination) FROM {s}.deliveries), "
                        "(SELECT string_agg(id || ':' || coalesce(destination, 'NULL') || ':' || attempts || ':' "
                        "|| last_error || ':' || coalesce(last_status::text, '-') || ':' || died_at, ',' "
                        "ORDER BY id, destination) FROM {s}.dead_letters))");
    };
    const auto untouched = state();

    // Not at our epoch (an older one, a newer one), or not our cursor: nothing.
    CHECK(relay.park_window_events(park(cursor->epoch - 1)).empty());
    CHECK(relay.park_window_events(park(cursor->epoch + 1)).empty());
    CHECK(other.park_window_events(park(cursor->epoch)).empty());
    CHECK(state() == untouched);

    CHECK(relay.park_window_events(park(cursor->epoch)) == std::vector<std::int64_t>{owing, all_dead, one_dead});
    const auto parked = state();
    CHECK(db.query("SELECT string_agg(id::text, ',') FROM {s}.events WHERE fanned_out") == std::to_string(owing));
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "1");
    CHECK(db.query("SELECT string_agg(id || ':' || coalesce(destination, 'NULL') || ':' || coalesce(last_status::text, '-'), "
                   "',' ORDER BY id) FROM {s}.dead_letters") ==
          fmt::format("{}:audit:410,{}:NULL:-,{}:hooks:400", owing, all_dead, one_dead));

    // The same write again (its answer was lost): nothing changes, not even died_at.
    CHECK(relay.park_window_events(park(cursor->epoch)).empty());
    CHECK(state() == parked);

    // Our cursor taken again (a new session of ours): the old epoch parks nothing more.
    const auto later = db.enqueue(window_event("k"));
    const auto again = relay.take_cursor("", slot_of(db, "k"));
    REQUIRE(again);
    CHECK(relay.park_window_events(std::vector<pg::store::window_park>{
                                       {.id = later, .epoch = cursor->epoch, .owed = {owed("hooks")}, .dead = {}}})
              .empty());
    CHECK(db.query(fmt::format("SELECT fanned_out FROM {{s}}.events WHERE id = {}", later)) == "f");
    CHECK(relay.park_window_events(std::vector<pg::store::window_park>{
              {.id = later, .epoch = again->epoch, .owed = {owed("hooks")}, .dead = {}}}) ==
          std::vector<std::int64_t>{later});
}

TEST_CASE("windows: cleanup deletes exactly the delivered window events below the oldest cursor") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto fast_key = key_in_new_slot(db, {}, "fast");
    const auto slow_key = key_in_new_slot(db, {slot_of(db, fast_key)}, "slow");
    const auto lone_key = key_in_new_slot(db, {slot_of(db, fast_key), slot_of(db, slow_key)}, "lone");
    const int slow_slot = slot_of(db, slow_key);
    const int lone_slot = slot_of(db, lone_key);
    std::map<int, std::int64_t> epochs;
    for (int slot = 0; slot < 64; ++slot) {
        const auto c = relay.take_cursor("", slot);
        REQUIRE(c);
        epochs[slot] = c->epoch;
    }
    // One slot has no cursor (nobody has read it yet).
    (void)db.query(fmt::format("DELETE FROM {{s}}.cursors WHERE destination = '' AND slot = {} RETURNING 1", lone_slot));

    const auto old_fast = db.enqueue(window_event(fast_key));
    const auto old_slow = db.enqueue(window_event(slow_key));
    const auto old_unkeyed = db.enqueue(window_event());
    const auto old_lone = db.enqueue(window_event(lone_key));
    const auto pre_migration = db.enqueue(window_event(fast_key));
    (void)db.query(fmt::format("UPDATE {{s}}.events SET txid = NULL WHERE id = {} RETURNING 1", pre_migration));
    const auto fanned = db.enqueue(window_event(fast_key));
    REQUIRE(relay.park_window_events(std::vector<pg::store::window_park>{
                {.id = fanned, .epoch = epochs.at(slot_of(db, fast_key)), .owed = {owed("hooks", 1, "HTTP 503")},
                 .dead = {}}}) == std::vector<std::int64_t>{fanned});
    // "Every transaction below the next xid has ended": true here, and unlike
    // a snapshot taken now, not held back by someone else's transaction
    // (autovacuum's) that happens to be running.
    const auto ended_before_now = [&] {
        const auto next = snapshot_xmax(snapshot_now(*db.admin));
        return fmt::format("{}:{}:", next, next);
    };
    const auto s1 = ended_before_now();
    const auto new_fast = db.enqueue(window_event(fast_key));
    const auto new_slow = db.enqueue(window_event(slow_key));
    const auto s2 = ended_before_now();

    const auto left = [&] { return db.query("SELECT string_agg(id::text, ',' ORDER BY id) FROM {s}.events"); };
    const auto ids = [](std::initializer_list<std::int64_t> l) {
        std::vector<std::string> out;
        for (const auto id : l) out.push_back(std::to_string(id));
        return fmt::format("{}", fmt::join(out, ","));
    };
    const auto everything = left();
    // The cursors at the beginning: nothing is delivered yet.
    CHECK(relay.cleanup_window_events(100) == 0);

    // Every cursor past all events but the slow one, which is past the old ones only.
    for (const auto& [slot, epoch] : epochs) {
        if (slot == lone_slot) continue;
        REQUIRE(relay.checkpoint_cursor("", slot, epoch, slot == slow_slot ? s1 : s2, std::nullopt, 0));
    }
    // A slot without a cursor: nothing goes, its events may be unread.
    CHECK(relay.cleanup_window_events(100) == 0);
    // Its cursor, once created, starts at the beginning: its events stay;
    // those of the other slots go as far as each slot's own cursor passed
    // them (the slow one's new event stays), but not the fanned-out one or
    // the one from before the migration.
    const auto lone = relay.take_cursor("", lone_slot);
    REQUIRE(lone);
    const bool unkeyed_in_lone =
        db.query(fmt::format("SELECT {{s}}.event_slot(NULL, {})", old_unkeyed)) == std::to_string(lone_slot);
    std::vector<std::int64_t> stay = {old_lone, pre_migration, fanned, new_slow};
    if (unkeyed_in_lone) stay.push_back(old_unkeyed);
    std::sort(stay.begin(), stay.end());
    const auto ids_of = [](const std::vector<std::int64_t>& v) { return fmt::format("{}", fmt::join(v, ",")); };
    CHECK(relay.cleanup_window_events(1) == 1);  // in batches
    CHECK(relay.cleanup_window_events(100) == (unkeyed_in_lone ? 2 : 3));
    CHECK(relay.cleanup_window_events(100) == 0);
    CHECK(left() == ids_of(stay));

    // The lone cursor passes the old events: its own go.
    REQUIRE(relay.checkpoint_cursor("", lone_slot, lone->epoch, s2, std::nullopt, 0));
    CHECK(relay.cleanup_window_events(100) == (unkeyed_in_lone ? 2 : 1));
    CHECK(left() == ids({pre_migration, fanned, new_slow}));

    // The lagging cursor catches up: its new event goes too.
    REQUIRE(relay.checkpoint_cursor("", slow_slot, epochs.at(slow_slot), s2, std::nullopt, 0));
    CHECK(relay.cleanup_window_events(100) == 1);
    CHECK(left() == ids({pre_migration, fanned}));
    (void)everything;
    (void)old_fast;
    (void)old_slow;
    (void)old_unkeyed;
    (void)new_fast;
}

TEST_CASE("windows: cleanup deletes an event its slot's cursor has passed, though an older transaction still "
          "runs") {
    // A relay that stops reading (no new event) keeps the B of its last
    // window as A; a writer that was running when that B was taken holds
    // its xmin below the events of the window, which are done all the same.
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();
    std::map<int, std::int64_t> epochs;
    for (int slot = 0; slot < 64; ++slot) epochs[slot] = relay.take_cursor("", slot)->epoch;
    auto older = testing::connect();
    pqxx::work open_writer(*older);
    (void)open_writer.exec(fmt::format("SELECT pg_current_xact_id(), count(*) FROM {}.cursors", db.schema.q()));
    const auto e = db.enqueue(window_event());
    const auto b = snapshot_now(*db.admin);  // sees e committed, the writer running
    for (const auto& [slot, epoch] : epochs) REQUIRE(relay.checkpoint_cursor("", slot, epoch, b, std::nullopt, 0));
    CHECK(relay.cleanup_window_events(100) == 1);
    CHECK(db.query("SELECT count(*) FROM {s}.events WHERE id = " + std::to_string(e)) == "0");
    open_writer.abort();
}

namespace {
// Index entries of events_txid_idx read by every scan so far, as the
// statistics say once every session that scanned it has ended (a backend
// flushes its counters on exit, before it leaves pg_stat_activity).
double txid_index_entries_read(installed& db) {
    return std::stod(db.query(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE schemaname = '" + db.schema.name() +
        "' AND indexrelname = 'events_txid_idx'"));
}

std::set<std::string> client_backends(installed& db) {
    std::set<std::string> pids;
    pqxx::nontransaction tx(*db.admin);
    for (const auto& row : tx.exec("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                   "AND datname = current_database()")) {
        pids.insert(row[0].c_str());
    }
    return pids;
}

// Runs one cleanup on its own new session of `s` and ends that session:
// returns how many it deleted and how many txid index entries it read.
std::pair<std::size_t, double> cleanup_counting_entries(installed& db, pg::store& s, std::size_t batch) {
    s.disconnect();
    const auto before_pids = client_backends(db);
    const auto before = txid_index_entries_read(db);
    const auto deleted = s.cleanup_window_events(batch);
    std::vector<std::string> mine;
    for (const auto& pid : client_backends(db)) {
        if (!before_pids.contains(pid)) mine.push_back(pid);
    }
    REQUIRE(mine.size() == 1);
    s.disconnect();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (db.query("SELECT count(*) FROM pg_stat_activity WHERE pid = " + mine[0]) != "0") {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(10ms);
    }
    return {deleted, txid_index_entries_read(db) - before};
}
}  // namespace

TEST_CASE("windows: cleanup does not walk again the events it deleted while an old transaction holds vacuum "
          "back") {
    // An old transaction with an xid and a snapshot: vacuum keeps the index
    // entries of every event cleanup deletes, and no scan may mark them
    // dead; the xid stays in every later A's xip.
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();
    auto cleaner = db.store("relay-a");
    std::map<int, std::int64_t> epochs;
    for (int slot = 0; slot < 64; ++slot) epochs[slot] = relay.take_cursor("", slot)->epoch;
    auto old = testing::connect();
    pqxx::work held(*old, "held");
    (void)held.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    (void)held.exec(fmt::format("SELECT pg_current_xact_id(), count(*) FROM {}.events", db.schema.q()));

    constexpr int transactions = 20, per_transaction = 1000;
    for (int i = 0; i < transactions; ++i) {
        (void)db.query(fmt::format("SELECT count({{s}}.enqueue('t', '{{}}')) FROM generate_series(1, {})",
                                   per_transaction));
    }
    auto a = snapshot_now(*db.admin);
    for (const auto& [slot, epoch] : epochs) REQUIRE(relay.checkpoint_cursor("", slot, epoch, a, std::nullopt, 0));
    const auto first = cleanup_counting_entries(db, cleaner, 100000);
    CHECK(first.first == std::size_t{transactions * per_transaction});

    // The next second's work: a few more events delivered.
    (void)db.query("SELECT count({s}.enqueue('t', '{}')) FROM generate_series(1, 100)");
    a = snapshot_now(*db.admin);
    for (const auto& [slot, epoch] : epochs) REQUIRE(relay.checkpoint_cursor("", slot, epoch, a, std::nullopt, 0));
    const auto second = cleanup_counting_entries(db, cleaner, 100000);
    CHECK(second.first == 100);
    // About the 100 it deletes, not the 20,000 deleted before.
    CHECK(second.second < 1000);
    CHECK(db.query("SELECT count(*) FROM {s}.events") == "0");
    held.abort();
}

TEST_CASE("windows: cleanup deletes later an event it had to leave while it deleted later ones") {
    // What cleanup passes over stays owed to it: an event its slot's cursor
    // had not passed yet, an event locked by another session, and the event
    // of a transaction still running (its txid below those deleted).
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();
    const auto slow_key = key_in_new_slot(db, {}, "slow");
    const int slow_slot = slot_of(db, slow_key);
    const auto fast_key = key_in_new_slot(db, {slow_slot}, "fast");
    std::map<int, std::int64_t> epochs;
    for (int slot = 0; slot < 64; ++slot) epochs[slot] = relay.take_cursor("", slot)->epoch;
    const auto checkpoint = [&](const std::string& a, const std::optional<std::string>& slow_a) {
        for (const auto& [slot, epoch] : epochs) {
            REQUIRE(relay.checkpoint_cursor("", slot, epoch, slot == slow_slot && slow_a ? *slow_a : a,
                                            std::nullopt, 0));
        }
    };
    const auto left = [&] { return db.query("SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '') FROM {s}.events"); };

    const auto some_later_ones = [&](int rounds, const std::optional<std::string>& slow_a) {
        for (int round = 0; round < rounds; ++round) {
            checkpoint(snapshot_now(*db.admin), slow_a);
            (void)relay.cleanup_window_events(100);
            (void)db.enqueue(window_event(fast_key));
            (void)db.enqueue(window_event());
        }
        checkpoint(snapshot_now(*db.admin), slow_a);
        (void)relay.cleanup_window_events(100);
    };

    // A transaction running, a row locked, every cursor moving on.
    session running(db);
    (void)running.exec("BEGIN");
    const auto of_running = running.enqueue(fast_key);  // takes its xid now
    (void)db.enqueue(window_event(fast_key));
    const auto locked = db.enqueue(window_event(fast_key));
    session locker(db);
    (void)locker.exec("BEGIN");
    (void)locker.exec(fmt::format("SELECT 1 FROM {}.events WHERE id = {} FOR UPDATE", db.schema.q(), locked));
    some_later_ones(3, std::nullopt);
    CHECK(left() == std::to_string(locked));
    (void)locker.exec("COMMIT");
    CHECK(relay.cleanup_window_events(100) == 1);
    CHECK(left().empty());
    (void)running.exec("COMMIT");
    CHECK(left() == std::to_string(of_running));
    some_later_ones(1, std::nullopt);
    CHECK(left().empty());

    // A slot's cursor lagging while the others move on, then catching up.
    const auto a0 = snapshot_now(*db.admin);
    const auto slow = db.enqueue(window_event(slow_key));
    some_later_ones(3, a0);
    CHECK(left() == std::to_string(slow));
    checkpoint(snapshot_now(*db.admin), std::nullopt);
    CHECK(relay.cleanup_window_events(100) == 1);
    CHECK(left().empty());

    // A batch that ends inside a transaction's events: the rest of that
    // transaction's events go with the next batches.
    (void)db.query("SELECT count({s}.enqueue('t', '{}')) FROM generate_series(1, 3)");
    (void)db.enqueue(window_event());
    checkpoint(snapshot_now(*db.admin), std::nullopt);
    for (int i = 0; i < 4; ++i) CHECK(relay.cleanup_window_events(1) == 1);
    CHECK(left().empty());
}

TEST_CASE("windows: a dead relay's cursors are unowned by the takeover, and its late park writes nothing") {
    installed db("win", "windows");
    auto a = db.store("relay-a");
    a.bind_leases_to_session();  // registered (sql/0006): may take cursors
    auto b = db.store("relay-b");
    b.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto e = db.enqueue(window_event("k"));
    const auto mine = a.take_cursor("", slot_of(db, "k"));
    const auto other = a.take_cursor("", (slot_of(db, "k") + 1) % 64);
    REQUIRE(mine);
    REQUIRE(other);

    // Alive: nothing taken over.
    for (int i = 0; i < 3; ++i) CHECK(b.take_over_dead_relays().cursors == 0);
    CHECK(db.query("SELECT count(*) FROM {s}.cursors WHERE owner = 'relay-a'") == "2");

    a.disconnect();  // as a kill -9 would
    pg::store::takeover t;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (t.relays.empty() && std::chrono::steady_clock::now() < deadline) {
        t = b.take_over_dead_relays();
        if (t.relays.empty()) std::this_thread::sleep_for(10ms);
    }
    CHECK(t.relays == std::vector<std::string>{"relay-a"});
    CHECK(t.cursors == 2);
    CHECK(db.query("SELECT count(*) || ' ' || count(owner) || ' ' || sum(epoch) FROM {s}.cursors") ==
          fmt::format("2 0 {}", mine->epoch + other->epoch));

    // relay-a was not quite dead: its park at its old epoch is fenced out.
    CHECK(a.park_window_events(std::vector<pg::store::window_park>{
                                   {.id = e, .epoch = mine->epoch, .owed = {owed("hooks")}, .dead = {}}})
              .empty());
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "0");
    const auto taken = b.take_cursor("", slot_of(db, "k"));
    REQUIRE(taken);
    CHECK(taken->epoch == mine->epoch + 1);
}

TEST_CASE("windows: a park that meets its cursor being taken waits for the take, and is fenced out by it") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto e = db.enqueue(window_event("k"));
    const auto cursor = relay.take_cursor("", slot_of(db, "k"));
    REQUIRE(cursor);

    // Another relay moves the cursor (what take_cursor writes), not committed yet.
    auto taker = testing::connect();
    pqxx::work take(*taker);
    take.exec(fmt::format("UPDATE {}.cursors SET owner = 'relay-b', epoch = epoch + 1 WHERE destination = '' "
                          "AND slot = {}",
                          db.schema.q(), slot_of(db, "k")));

    std::vector<std::int64_t> written{-1};
    std::thread parking([&] {
        written = relay.park_window_events(std::vector<pg::store::window_park>{
            {.id = e, .epoch = cursor->epoch, .owed = {owed("hooks")}, .dead = {}}});
    });
    // The park waits on the cursor's row...
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    bool waiting = false;
    while (!waiting && std::chrono::steady_clock::now() < deadline) {
        waiting = db.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND backend_type = 'client backend' AND datname = current_database()") == "1";
        if (!waiting) std::this_thread::sleep_for(10ms);
    }
    CHECK(waiting);
    // ... and once the take commits, writes nothing: the cursor is no longer ours.
    take.commit();
    parking.join();
    CHECK(written.empty());
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "0");
    CHECK(db.query(fmt::format("SELECT fanned_out FROM {{s}}.events WHERE id = {}", e)) == "f");
}

TEST_CASE("windows: a window read again from an older checkpoint leaves out the events parked by the first read") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    const auto parked = db.enqueue(window_event("k"));
    const auto sent = db.enqueue(window_event("k"));
    const auto unkeyed = db.enqueue(window_event());
    const auto cursor = relay.take_cursor("", slot_of(db, "k"));
    REQUIRE(cursor);
    const auto first = relay.read_window(cursor->snap_a, std::nullopt, 0, std::nullopt, 100, {});
    REQUIRE(first.events.size() == 3);
    REQUIRE(relay.park_window_events(std::vector<pg::store::window_park>{
                {.id = parked, .epoch = cursor->epoch, .owed = {owed("hooks", 1, "HTTP 503")}, .dead = {}}}) ==
            std::vector<std::int64_t>{parked});
    // The relay restarts from its checkpoint (the same A, B and done_below):
    // the parked event is owed by its deliveries row now, not by the window.
    const auto again = relay.read_window(cursor->snap_a, first.snap_b, 0, std::nullopt, 100, {});
    std::vector<std::int64_t> ids;
    for (const auto& e : again.events) ids.push_back(e.id);
    CHECK(ids == std::vector<std::int64_t>{sent, unkeyed});
    // The same for a read that takes a new B.
    ids.clear();
    for (const auto& e : relay.read_window(cursor->snap_a, std::nullopt, 0, std::nullopt, 100, {}).events) ids.push_back(e.id);
    CHECK(ids == std::vector<std::int64_t>{sent, unkeyed});
}

TEST_CASE("windows: the read says per event whether its key is pending: deliveries of the key, or an earlier event "
          "of it from before windows still in the outbox") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();  // registered (sql/0006): may take cursors
    // Before windows (txid NULL): "old" has one still to send, "gone" one
    // already fanned out (its deliveries done), "later" one after the window's.
    const auto old = db.enqueue(window_event("old"));
    const auto gone = db.enqueue(window_event("gone"));
    (void)db.query(fmt::format("WITH u AS (UPDATE {{s}}.events SET txid = NULL, fanned_out = id = {} "
                               "WHERE id IN ({}, {}) RETURNING 1) SELECT count(*) FROM u",
                               gone, old, gone));
    const auto failed = db.enqueue(window_event("k"));  // parked below: "k" has a deliveries row
    const auto cursor = relay.take_cursor("", slot_of(db, "k"));
    REQUIRE(cursor);
    const std::string a = snapshot_now(*db.admin);
    const auto behind_failed = db.enqueue(window_event("k"));
    const auto behind_old = db.enqueue(window_event("old"));
    const auto after_gone = db.enqueue(window_event("gone"));
    const auto before_later = db.enqueue(window_event("later"));
    const auto free_key = db.enqueue(window_event("free"));
    const auto unkeyed = db.enqueue(window_event());
    const auto later = db.enqueue(window_event("later"));
    (void)db.query(fmt::format("UPDATE {{s}}.events SET txid = NULL WHERE id = {} RETURNING 1", later));
    REQUIRE(relay.park_window_events(std::vector<pg::store::window_park>{
                {.id = failed, .epoch = cursor->epoch, .owed = {owed("hooks", 1, "HTTP 503")}, .dead = {}}}) ==
            std::vector<std::int64_t>{failed});

    const auto w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, {});
    std::map<std::int64_t, bool> pending;
    for (const auto& e : w.events) pending[e.id] = e.key_pending;
    CHECK(pending == std::map<std::int64_t, bool>{{behind_failed, true},
                                                  {behind_old, true},
                                                  {after_gone, false},
                                                  {before_later, false},
                                                  {free_key, false},
                                                  {unkeyed, false}});
    // Once the key's deliveries are done, its next window event goes straight out.
    (void)db.query(fmt::format("DELETE FROM {{s}}.deliveries WHERE event_id = {} RETURNING 1", failed));
    for (const auto& e : relay.read_window(a, w.snap_b, 0, std::nullopt, 100, {}).events) {
        CAPTURE(e.id);
        CHECK(e.key_pending == (e.id == behind_old));
    }
}

TEST_CASE("windows: the read says whether deliveries to its destinations are due, and when the next one is") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    const std::string a = snapshot_now(*db.admin);
    const auto e = db.enqueue(window_event());
    const std::vector<std::string> hooks{"hooks"}, audit{"audit"}, both{"audit", "hooks"};
    auto w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, both);
    CHECK_FALSE(w.deliveries_due);
    CHECK_FALSE(w.next_due_ms);

    // One due now at hooks, one at audit in a minute.
    (void)db.query(fmt::format("WITH i AS (INSERT INTO {{s}}.deliveries (event_id, destination, available_at) "
                               "VALUES ({0}, 'hooks', now() - interval '1 second'), "
                               "({0}, 'audit', now() + interval '1 minute') RETURNING 1) SELECT count(*) FROM i",
                               e));
    w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, hooks);
    CHECK(w.deliveries_due);
    REQUIRE(w.next_due_ms);
    CHECK(*w.next_due_ms > 50'000);
    CHECK(*w.next_due_ms <= 60'000);
    // Another relay's destination is none of its business.
    w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, audit);
    CHECK_FALSE(w.deliveries_due);
    w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, {});
    CHECK_FALSE(w.deliveries_due);
    // The earliest one not due yet counts.
    (void)db.query(fmt::format("INSERT INTO {{s}}.deliveries (event_id, destination, available_at) VALUES "
                               "({}, 'other', now() + interval '5 seconds') RETURNING 1",
                               e));
    w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, both);
    CHECK(w.deliveries_due);
    REQUIRE(w.next_due_ms);
    CHECK(*w.next_due_ms > 0);
    CHECK(*w.next_due_ms <= 5'000);
    CHECK(w.events.size() == 1);
}

TEST_CASE("windows: the read returns the page's bodies: topic, payload, headers, created_at, a replayed event's "
          "destinations and its age") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    const std::string a = snapshot_now(*db.admin);
    pg::new_event plain = window_event("k");
    plain.topic = "orders.created";
    plain.payload = R"({"quote":"a \"b\" \\ c","list":[1,2],"nested":{"x":null}})";
    plain.headers = R"({"x-tenant":"acme, \"inc\""})";
    const auto first = db.enqueue(plain);
    const auto replayed = db.enqueue(window_event());
    (void)db.query(fmt::format("UPDATE {{s}}.events SET destinations = ARRAY['hooks', 'audit'], "
                               "created_at = now() - interval '1 hour' WHERE id = {} RETURNING 1",
                               replayed));
    const auto w = relay.read_window(a, std::nullopt, 0, std::nullopt, 100, {});
    REQUIRE(w.events.size() == 2);
    const auto& e = w.events[0];
    CHECK(e.id == first);
    CHECK(e.topic == "orders.created");
    CHECK(e.payload == db.query(fmt::format("SELECT payload::text FROM {{s}}.events WHERE id = {}", first)));
    CHECK(e.payload.find(R"("quote": "a \"b\" \\ c")") != std::string::npos);
    CHECK(e.headers == R"({"x-tenant": "acme, \"inc\""})");
    CHECK(std::to_string(e.created_at_us) ==
          db.query(fmt::format("SELECT (extract(epoch FROM created_at) * 1000000)::bigint FROM {{s}}.events "
                               "WHERE id = {}",
                               first)));
    CHECK(e.destinations.empty());
    CHECK(e.age_us >= 0);
    CHECK(e.age_us == w.now_us - e.created_at_us);
    const auto& r = w.events[1];
    CHECK(r.id == replayed);
    CHECK(r.topic == "t");
    CHECK(r.payload == R"({"n": 1})");
    CHECK(r.headers == "{}");
    CHECK(r.destinations == std::vector<std::string>{"hooks", "audit"});
    CHECK(r.age_us >= 3600LL * 1000 * 1000);
    CHECK(r.age_us < 3700LL * 1000 * 1000);
}

TEST_CASE("windows: the read's probe for an earlier event of the key from before windows does not walk the key's "
          "other rows") {
    installed db("win", "windows");
    // Already read (before A), not deleted by cleanup yet: 3,000 events of
    // "k" among 27,000 unkeyed ones. The window: 50 more of "k".
    (void)db.query("SELECT count({s}.enqueue('t', '{}', CASE WHEN g % 10 = 0 THEN 'k' END)) "
                   "FROM generate_series(1, 30000) g");
    const std::string a = snapshot_now(*db.admin);
    (void)db.query("SELECT count({s}.enqueue('t', '{}', 'k')) FROM generate_series(1, 50) g");
    {
        pqxx::nontransaction tx(*db.admin);
        tx.exec("ANALYZE " + db.schema.q() + ".events");
    }
    const auto sql = pg::query_book(db.schema.name()).sql<pg::q::read_window>();
    // As the store runs it: unprepared, so a custom plan.
    pqxx::nontransaction tx(*db.admin);
    const auto text = tx.exec_params("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, a, nullptr, 0, nullptr, 1000,
                                     "{hooks}")[0][0]
                          .as<std::string>();
    const auto plan = nlohmann::json::parse(text)[0]["Plan"];
    const auto buffers = plan.value("Shared Hit Blocks", 0.0) + plan.value("Shared Read Blocks", 0.0);
    CAPTURE(text);
    // A few per window event (its heap page, its body by ctid, the two
    // probes), not one per row of its key.
    CHECK(buffers < 600);
}

namespace {
// Executions of index scans on `index` anywhere in an EXPLAIN (ANALYZE, FORMAT JSON) plan.
double loops_on(const nlohmann::json& plan, const std::string& index) {
    double loops = plan.value("Index Name", std::string()) == index ? plan.value("Actual Loops", 0.0) : 0.0;
    if (plan.contains("Plans")) {
        for (const auto& child : plan["Plans"]) loops += loops_on(child, index);
    }
    return loops;
}
}  // namespace

TEST_CASE("windows: the read probes whether a key is pending once per key of its page, not once per keyed event") {
    installed db("win", "windows");
    const std::string a = snapshot_now(*db.admin);
    // A page of 2,000 events over 10 keys, and a delivery owed for key k3
    // (its events are pending, the others' not).
    (void)db.query("SELECT count({s}.enqueue('t', '{}', 'k' || g % 10)) FROM generate_series(1, 2000) g");
    (void)db.query("INSERT INTO {s}.deliveries (event_id, destination, ordering_key) "
                   "SELECT min(id), 'hooks', 'k3' FROM {s}.events RETURNING 1");
    {
        pqxx::nontransaction tx(*db.admin);
        tx.exec("ANALYZE " + db.schema.q() + ".events");
    }
    const auto sql = pg::query_book(db.schema.name()).sql<pg::q::read_window>();
    auto c = testing::connect();
    pqxx::nontransaction tx(*c);
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    // As the store runs it: unprepared, so a custom plan.
    const auto text = tx.exec_params("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, a, nullptr, 0, nullptr, 100000,
                                     "{hooks}")[0][0]
                          .as<std::string>();
    const auto plan = nlohmann::json::parse(text)[0]["Plan"];
    CAPTURE(text);
    CHECK(loops_on(plan, "deliveries_ordering_key_idx") <= 10);
    CHECK(loops_on(plan, "events_pre_window_key_idx") <= 10);

    const auto w = db.store("relay-a").read_window(a, std::nullopt, 0, std::nullopt, 100000, {});
    REQUIRE(w.events.size() == 2000);
    for (const auto& e : w.events) {
        CAPTURE(e.id);
        CHECK(e.key_pending == (e.ordering_key == "k3"));
    }
}

namespace {
// Rows the scans of `relation` returned, over all their executions.
double rows_from(const nlohmann::json& plan, const std::string& relation) {
    double rows = plan.value("Relation Name", std::string()) == relation
                      ? plan.value("Actual Rows", 0.0) * plan.value("Actual Loops", 1.0)
                      : 0.0;
    if (plan.contains("Plans")) {
        for (const auto& child : plan["Plans"]) rows += rows_from(child, relation);
    }
    return rows;
}
}  // namespace

TEST_CASE("windows: a later page of a large window reads about its own page, not the rest of the window; chunked "
          "reads by slot give the one read's ids") {
    installed db("win", "windows");
    auto reader = db.store("reader");
    const std::string a = snapshot_now(*db.admin);
    session late(db);
    late.exec("BEGIN");
    const auto e_late = late.enqueue();  // committed after B: not in the window, its id among the window's
    (void)db.query("SELECT count({s}.enqueue('t', '{}', CASE WHEN g % 2 = 0 THEN 'k' || g % 100 END)) "
                   "FROM generate_series(1, 20000) g");
    const std::string b = snapshot_now(*db.admin);
    late.exec("COMMIT");
    {
        pqxx::nontransaction tx(*db.admin);
        tx.exec("ANALYZE " + db.schema.q() + ".events");
    }
    const auto whole = reader.read_window(a, b, 0, std::nullopt, 1000000, {});
    REQUIRE(whole.events.size() == 20000);
    const auto from = whole.events[10000].id;

    const auto sql = pg::query_book(db.schema.name()).sql<pg::q::read_window>();
    // Rows of events the read returns from its scans, the most of: a custom
    // plan (an unnamed statement of a plain session), and the generic plan
    // the relay's claim session makes (store::plan_once_settings).
    const auto rows_read = [&](const std::string& from_a, const std::optional<std::string>& to_b, std::int64_t after,
                               std::int64_t limit) {
        double most = 0;
        for (const bool generic : {false, true}) {
            CAPTURE(generic);
            auto c = testing::connect();
            pqxx::nontransaction tx(*c);
            for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
            std::string text;
            if (generic) {
                for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
                tx.exec("PREPARE rw AS " + sql);
                text = tx.exec(fmt::format("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE rw({}, {}, {}, NULL, {}, '{{hooks}}')",
                                           tx.quote(from_a), to_b ? tx.quote(*to_b) : "NULL", after, limit))[0][0]
                           .as<std::string>();
            } else {
                text = tx.exec_params("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, from_a, to_b, after, nullptr, limit,
                                      "{hooks}")[0][0]
                           .as<std::string>();
            }
            const auto rows = rows_from(nlohmann::json::parse(text)[0]["Plan"], "events");
            if (rows > most) most = rows;
            if (rows > 4 * limit) MESSAGE(text);
        }
        return most;
    };
    // A page of 500 from the middle of the window.
    CHECK(rows_read(a, b, from, 500) <= 4 * 500);

    // The first page of the next window, 10 events behind these 20,001 (and
    // the transaction of `late`, running at b, is one of them): read from
    // txids, not by walking the table.
    (void)db.query("SELECT count({s}.enqueue('t', '{}', CASE WHEN g % 2 = 0 THEN 'k' || g % 100 END)) "
                   "FROM generate_series(1, 10) g");
    CHECK(rows_read(b, std::nullopt, 0, 8192) <= 4 * 11);

    // Two events of the window fanned out: left out, as from one read.
    (void)db.query(fmt::format("WITH u AS (UPDATE {{s}}.events SET fanned_out = true WHERE id IN ({}, {}) "
                               "RETURNING 1) SELECT count(*) FROM u",
                               whole.events[3].id, whole.events[15000].id));
    for (const auto& slots : {std::optional<std::vector<int>>{}, std::optional<std::vector<int>>{{1, 5, 9, 60}}}) {
        std::vector<std::int64_t> one;
        for (const auto& e : reader.read_window(a, b, 0, slots, 1000000, {}).events) one.push_back(e.id);
        CHECK(std::find(one.begin(), one.end(), e_late) == one.end());
        for (const std::size_t chunk : {7UL, 499UL, 5000UL}) {
            CAPTURE(chunk);
            CAPTURE(slots.has_value());
            std::vector<std::int64_t> chunked;
            std::int64_t next = 0;
            for (;;) {
                const auto w = reader.read_window(a, b, next, slots, chunk, {});
                for (const auto& e : w.events) chunked.push_back(e.id);
                if (w.events.size() < chunk) break;
                next = w.events.back().id + 1;
            }
            CHECK(chunked == one);
        }
    }
}

TEST_CASE("windows: the relay's prepared window read, planned on an empty outbox, reads only its window once the "
          "outbox holds 20,000 events") {
    installed db("win", "windows");
    const auto sql = pg::query_book(db.schema.name()).sql<pg::q::read_window>();
    // The claim session's settings; its generic plan is made at the first
    // call and kept (the store prepares read_window).
    auto c = testing::connect();
    pqxx::nontransaction tx(*c);
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    for (const auto& setting : pg::store::plan_once_settings()) tx.exec(setting);
    tx.exec("PREPARE rw(pg_snapshot, pg_snapshot, bigint, int[], bigint, text[]) AS " + sql);
    const auto execute = [&](const std::string& a, std::int64_t after, std::int64_t limit) {
        return fmt::format("EXECUTE rw({}, NULL, {}, NULL, {}, '{{hooks}}')", tx.quote(a), after, limit);
    };
    const std::string empty = snapshot_now(*db.admin);
    (void)tx.exec(execute(empty, 0, 8192));

    (void)db.query("SELECT count({s}.enqueue('t', '{}', CASE WHEN g % 2 = 0 THEN 'k' || g % 100 END)) "
                   "FROM generate_series(1, 20000) g");
    session late(db);
    late.exec("BEGIN");
    (void)late.enqueue();  // running at the next A, committed before the read: probed through xip(A)
    const std::string a2 = snapshot_now(*db.admin);
    late.exec("COMMIT");
    (void)db.query("SELECT count({s}.enqueue('t', '{}', 'k' || g % 100)) FROM generate_series(1, 10) g");
    for (const auto& [from_a, after, limit, most] :
         {std::tuple{a2, std::int64_t{0}, std::int64_t{8192}, 4.0 * 11},
          std::tuple{empty, std::int64_t{0}, std::int64_t{500}, 20031.0 + 500 * 4},
          std::tuple{empty, std::int64_t{10000}, std::int64_t{500}, 4.0 * 500}}) {
        CAPTURE(after);
        const auto text = tx.exec("EXPLAIN (ANALYZE, FORMAT JSON) " + execute(from_a, after, limit))[0][0]
                              .as<std::string>();
        CAPTURE(text);
        CHECK(rows_from(nlohmann::json::parse(text)[0]["Plan"], "events") <= most);
    }
}

TEST_CASE("windows: a relay session does not JIT-compile the read of a large window") {
    installed db("win", "windows");
    const std::string a = snapshot_now(*db.admin);
    (void)db.query("SELECT count({s}.enqueue('t', '{}', CASE WHEN g % 2 = 0 THEN 'k' || g % 100 END)) "
                   "FROM generate_series(1, 20000) g");
    const auto sql = pg::query_book(db.schema.name()).sql<pg::q::read_window>();
    auto c = testing::connect();
    pqxx::nontransaction tx(*c);
    tx.exec("ANALYZE " + db.schema.q() + ".events");
    for (const auto& setting : pg::store::relay_session_settings()) tx.exec(setting);
    // Unprepared, as the store runs it: a custom plan, whose estimated cost
    // grows with the page and passes jit_above_cost.
    const auto text = tx.exec_params("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, a, nullptr, 0, nullptr, 1000000,
                                     "{hooks}")[0][0]
                          .as<std::string>();
    const auto explained = nlohmann::json::parse(text)[0];
    CAPTURE(explained["Plan"].value("Total Cost", 0.0));
    CHECK_FALSE(explained.contains("JIT"));
}

TEST_CASE("windows: take_cursors takes all 64 slots of an empty install in one call, none from a live relay, all "
          "from a dead one") {
    installed db("win", "windows");
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    a.bind_leases_to_session();
    b.bind_leases_to_session();
    std::vector<int> all(64);
    for (int i = 0; i < 64; ++i) all[static_cast<std::size_t>(i)] = 63 - i;  // any order

    const auto mine = a.take_cursors(all);
    REQUIRE(mine.size() == 64);
    for (std::size_t i = 0; i < mine.size(); ++i) {
        CAPTURE(i);
        CHECK(mine[i].slot == static_cast<int>(i));
        CHECK(mine[i].epoch == 1);
        CHECK(mine[i].snap_a == "1:1:");
        CHECK_FALSE(mine[i].snap_b);
        CHECK(mine[i].done_below == 0);
    }
    CHECK(db.query("SELECT count(*) || ' ' || count(*) FILTER (WHERE owner = 'relay-a') FROM {s}.cursors "
                   "WHERE destination = ''") == "64 64");

    // Alive: tried, never taken.
    for (int i = 0; i < 3; ++i) CHECK(b.take_cursors(all).empty());
    // Ourselves again (a new session of ours): every epoch moves on.
    const std::vector<int> two{5, 9};
    const auto again = a.take_cursors(two);
    REQUIRE(again.size() == 2);
    CHECK(again[0].slot == 5);
    CHECK(again[0].epoch == 2);
    CHECK(again[1].slot == 9);
    CHECK(again[1].epoch == 2);

    // relay-a's session ends: relay-b takes all of them.
    a.disconnect();
    std::vector<pg::store::cursor_lease> taken;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (taken.size() < 64 && std::chrono::steady_clock::now() < deadline) {
        for (auto& t : b.take_cursors(all)) taken.push_back(t);
        if (taken.size() < 64) std::this_thread::sleep_for(10ms);
    }
    REQUIRE(taken.size() == 64);
    CHECK(db.query("SELECT count(*) FILTER (WHERE owner = 'relay-b') || ' ' || sum(epoch) FROM {s}.cursors "
                   "WHERE destination = ''") == fmt::format("64 {}", 62 * 2 + 2 * 3));
}

TEST_CASE("windows: checkpoint_cursors and release_cursors write only the cursors still ours at their epoch") {
    installed db("win", "windows");
    auto a = db.store("relay-a");
    auto b = db.store("relay-b");
    a.bind_leases_to_session();
    b.bind_leases_to_session();
    const std::vector<int> slots{3, 1, 2};
    const auto leases = a.take_cursors(slots);
    REQUIRE(leases.size() == 3);
    std::map<int, std::int64_t> epoch_of;
    for (const auto& l : leases) epoch_of[l.slot] = l.epoch;
    std::vector<std::int64_t> epochs;
    for (const int s : slots) epochs.push_back(epoch_of.at(s));

    const std::string a_snap = snapshot_now(*db.admin);
    (void)db.enqueue(window_event());
    const std::string b_snap = snapshot_now(*db.admin);
    CHECK(a.checkpoint_cursors(slots, epochs, a_snap, b_snap, 42) == 3);
    const auto positions = [&] {
        return db.query("SELECT string_agg(slot || ':' || snap_a || ':' || coalesce(snap_b::text, '-') || ':' || "
                        "done_below, ',' ORDER BY slot) FROM {s}.cursors WHERE destination = ''");
    };
    CHECK(positions() == fmt::format("1:{0}:{1}:42,2:{0}:{1}:42,3:{0}:{1}:42", a_snap, b_snap));

    // Slot 1 taken again (a new epoch): the old epochs write the other two only.
    const auto retaken = a.take_cursors(std::vector<int>{1});
    REQUIRE(retaken.size() == 1);
    CHECK(a.checkpoint_cursors(slots, epochs, b_snap, std::nullopt, 0) == 2);
    CHECK(positions() == fmt::format("1:{0}:{1}:42,2:{1}:-:0,3:{1}:-:0", a_snap, b_snap));
    // A stale epoch everywhere, or another relay with our epochs: nothing.
    const std::vector<std::int64_t> stale(3, 0);
    CHECK(a.checkpoint_cursors(slots, stale, b_snap, std::nullopt, 7) == 0);
    CHECK(b.checkpoint_cursors(slots, epochs, b_snap, std::nullopt, 7) == 0);
    CHECK(b.release_cursors(slots, epochs) == 0);
    CHECK(positions() == fmt::format("1:{0}:{1}:42,2:{1}:-:0,3:{1}:-:0", a_snap, b_snap));

    // Handed back (slot 1 at its new epoch, the others at theirs): relay-b
    // takes them at once, where they were checkpointed, and relay-a's
    // epochs write nothing more.
    epochs[1] = retaken[0].epoch;
    CHECK(a.release_cursors(slots, epochs) == 3);
    CHECK(db.query("SELECT count(owner) FROM {s}.cursors") == "0");
    const auto taken = b.take_cursors(slots);
    REQUIRE(taken.size() == 3);
    CHECK(taken[0].slot == 1);
    CHECK(taken[0].snap_a == a_snap);
    CHECK(taken[0].snap_b == b_snap);
    CHECK(taken[0].done_below == 42);
    CHECK(taken[0].epoch == retaken[0].epoch + 1);
    CHECK(taken[1].snap_a == b_snap);
    CHECK(a.checkpoint_cursors(slots, epochs, b_snap, std::nullopt, 0) == 0);
    CHECK(a.release_cursors(slots, epochs) == 0);
    CHECK(db.query("SELECT count(*) FROM {s}.cursors WHERE owner = 'relay-b'") == "3");
    // The spans must pair up.
    CHECK_THROWS_AS((void)b.release_cursors(slots, std::vector<std::int64_t>{1}), std::invalid_argument);
}

TEST_CASE("windows: a parked delivery does not wait for an earlier window event of its key that is only "
          "waiting for cleanup (relay.consume = \"windows\"); a claims relay still does") {
    installed db("win", "windows");
    auto relay = db.store("relay-a");
    relay.bind_leases_to_session();
    const auto slot = slot_of(db, "k");
    const auto cursor = relay.take_cursor("", slot);
    REQUIRE(cursor);
    (void)db.enqueue(window_event("k"));  // delivered from its window; still in events until cleanup
    const auto parked = db.enqueue(window_event("k"));
    REQUIRE(relay.park_window_events(std::vector<pg::store::window_park>{
                {.id = parked, .epoch = cursor->epoch, .owed = {owed("hooks")}, .dead = {}}}) ==
            std::vector<std::int64_t>{parked});
    const std::vector<std::string> hooks = {"hooks"};
    CHECK(relay.claim_deliveries(4, std::chrono::milliseconds(30000), hooks).empty());
    relay.set_consume_windows(true);
    const auto got = relay.claim_deliveries(4, std::chrono::milliseconds(30000), hooks);
    REQUIRE(got.size() == 1);
    CHECK(got[0].id == parked);
}

TEST_CASE("windows: events written before windows are parked with their schedule, attempts and error; a running "
          "lease, a key's live hold and window events are left as they are") {
    installed db("win");  // claims: events written now record no txid
    // A statement that returns no rows, run for its effect.
    const auto run = [&](const std::string& sql) {
        (void)db.query("WITH done AS (" + sql + " RETURNING 1) SELECT count(*) FROM done");
    };
    const auto plain = db.enqueue(window_event());
    const auto k1 = db.enqueue(window_event("k"));
    const auto k2 = db.enqueue(window_event("k"));
    const auto retrying = db.enqueue(window_event());
    const auto leased = db.enqueue(window_event("l"));
    const auto follower = db.enqueue(window_event("h"));  // a run's follower: no lease, its key's hold
    const auto expired = db.enqueue(window_event("x"));
    run(fmt::format("UPDATE {{s}}.events SET attempts = 2, last_error = 'HTTP 503', "
                               "available_at = now() + interval '1 hour' WHERE id = {}", retrying));
    run(fmt::format("UPDATE {{s}}.events SET attempts = 1, lease_owner = 'claimer', "
                               "leased_until = now() + interval '1 minute' WHERE id = {}", leased));
    run(fmt::format("UPDATE {{s}}.events SET attempts = 1, lease_owner = 'claimer', "
                               "leased_until = now() - interval '1 second' WHERE id = {}", expired));
    run(fmt::format("INSERT INTO {{s}}.key_holds (ordering_key, destination, event_id, until, lease_owner) "
                               "VALUES ('h', '', {}, now() + interval '1 minute', 'claimer')", follower));
    testing::set_up_consume(*db.admin, db.schema.name(), "windows");
    const auto windowed = db.enqueue(window_event("k"));
    auto relay = db.store("relay-a");

    const auto page = relay.pre_window_page(0, 100);
    std::vector<std::int64_t> ids;
    for (const auto& e : page) ids.push_back(e.id);
    CHECK(ids == std::vector<std::int64_t>{plain, k1, k2, retrying, leased, follower, expired});
    REQUIRE(page.size() == 7);
    CHECK(page[3].attempts == 2);
    CHECK(page[3].last_error == "HTTP 503");
    CHECK(page[0].topic == "t");
    CHECK(relay.pre_window_page(k2, 2).front().id == retrying);  // pages after an id, in id order

    const auto park = [&](std::int64_t id, int attempts, std::optional<std::string> error = std::nullopt) {
        return pg::store::window_park{.id = id, .epoch = 0, .owed = {owed("hooks", attempts, std::move(error))}, .dead = {}};
    };
    const std::vector<pg::store::window_park> parks{park(plain, 0),  park(k1, 0),       park(k2, 0),
                                                    park(retrying, 2, "HTTP 503"), park(leased, 1),
                                                    park(follower, 0), park(expired, 1), park(windowed, 0)};
    CHECK(relay.park_pre_window_events(parks) == std::vector<std::int64_t>{plain, k1, k2, retrying, expired});
    CHECK(relay.pre_window_events() == 2);  // the running lease and the held follower
    CHECK(db.query("SELECT string_agg(id::text, ',' ORDER BY id) FROM {s}.events WHERE NOT fanned_out") ==
          fmt::format("{},{},{}", leased, follower, windowed));
    // Each parked event is owed at its destination on its own schedule, with what it had been through.
    CHECK(db.query(fmt::format("SELECT d.attempts || ' ' || d.last_error || ' ' || (d.available_at > now() + "
                               "interval '59 minutes') FROM {{s}}.deliveries d WHERE d.event_id = {}",
                               retrying)) == "2 HTTP 503 true");
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries WHERE available_at <= now()") == "4");
    CHECK(db.query(fmt::format("SELECT lease_owner IS NULL AND leased_until IS NULL FROM {{s}}.events WHERE id = {}",
                               expired)) == "t");
    // Written again (its answer lost): nothing more.
    CHECK(relay.park_pre_window_events(parks).empty());

    // The lease and the hold end: those two move too, and nothing is left before windows.
    run(fmt::format("UPDATE {{s}}.events SET leased_until = now() - interval '1 second' WHERE id = {}",
                               leased));
    run("DELETE FROM {s}.key_holds");
    CHECK(relay.park_pre_window_events(parks) == std::vector<std::int64_t>{leased, follower});
    CHECK(relay.pre_window_events() == 0);
    CHECK(relay.pre_window_page(0, 100).empty());
    CHECK(db.query("SELECT count(*) FROM {s}.deliveries") == "7");
    // A key's window event queues behind its parked earlier events (it is key-pending when read).
    const auto w = relay.read_window("1:1:", std::nullopt, 0, std::nullopt, 100, {});
    REQUIRE(w.events.size() == 1);
    CHECK(w.events[0].id == windowed);
    CHECK(w.events[0].key_pending);
}

TEST_CASE("windows: relays alive share the 64 cursors: the first takes them all, a second takes what the "
          "first hands back, and a dead relay does not count") {
    installed db("win", "windows");
    auto a = db.store("relay-a");
    a.bind_leases_to_session();
    const auto first = a.take_free_cursors({});
    CHECK(first.taken.size() == 64);
    CHECK(first.share == 64);
    auto b = db.store("relay-b");
    b.bind_leases_to_session();
    // Two alive: a share of 32 each, but a holds all 64 and b gets none.
    const auto second = b.take_free_cursors({});
    CHECK(second.taken.empty());
    CHECK(second.share == 32);
    // a hands its surplus back (checkpoint and release), b takes it.
    cursor_checkpoint surplus;
    for (const auto& c : first.taken) {
        if (c.slot < 32) continue;
        surplus.slots.push_back(c.slot);
        surplus.epochs.push_back(c.epoch);
    }
    surplus.snap_a = first.taken.front().snap_a;
    CHECK(a.checkpoint_cursors(surplus) == 32);
    CHECK(a.release_cursors(surplus) == 32);
    const auto third = b.take_free_cursors({});
    CHECK(third.taken.size() == 32);
    CHECK(third.taken.front().slot == 32);
    // A relay that registered and died (its session gone, its row left for
    // the takeover) does not shrink the share of those alive.
    {
        auto c = db.store("relay-c");
        c.bind_leases_to_session();
    }
    std::vector<int> held;
    for (int s = 32; s < 64; ++s) held.push_back(s);
    CHECK(b.take_free_cursors(held).share == 32);
}
