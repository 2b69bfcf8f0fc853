// The claim's low mark (see claim_from in src/pg/queries.sql): how far back
// an event not yet committed can be due, read from the writers in progress
// (pg_locks) by a check that a claim makes at most once a second and hands
// on in its low mark ("low mark|checked at|floor"). Against a real
// PostgreSQL, with real producer transactions held open across claims.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/sql_ident.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using outboxd::testing::installed;

namespace {

// Field n (1: the low mark, 2: when the check was made, 3: its floor).
std::string part(const std::string& mark, int n) {
    std::size_t begin = 0;
    for (int i = 1; i < n; ++i) begin = mark.find('|', begin) + 1;
    const auto end = mark.find('|', begin);
    return mark.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// Whether `condition` holds of the timestamp `at` ({} in the text), by the
// database's clock.
bool holds(installed& db, const std::string& at, const std::string& condition) {
    return db.query("SELECT " + fmt::format(fmt::runtime(condition), quote_literal(at) + "::timestamptz")) == "t";
}

// A check is made by a claim whose low mark's check is more than a second old.
constexpr auto check_age = 1100ms;

}  // namespace

TEST_CASE("low mark: a claim from it checks the writers in progress at most once a second and hands the check on; "
          "with none, the next low mark is the check's time less 50 ms") {
    installed db;
    auto s = db.store("a");
    // From the beginning: 5 s back, no check.
    const auto first = s.claim(10, 30s).low_mark;
    CHECK(holds(db, part(first, 1), "{} BETWEEN now() - interval '6 seconds' AND now() - interval '4 seconds'"));
    CHECK(part(first, 2).empty());
    CHECK(part(first, 3).empty());

    // The first claim from it checks; its own low mark cannot rest on its
    // own check (made after its snapshot was taken): still 5 s back.
    const auto checked = s.claim(10, 30s, std::nullopt, first).low_mark;
    REQUIRE_FALSE(part(checked, 2).empty());
    CHECK(holds(db, part(checked, 1), "{} < now() - interval '4 seconds'"));
    CHECK(holds(db, part(checked, 2), "{} BETWEEN now() - interval '1 second' AND now()"));
    // No writer in progress but the claim itself: 50 ms before the check.
    CHECK(db.query(fmt::format("SELECT {}::timestamptz - {}::timestamptz BETWEEN interval '50 ms' AND interval '60 ms'",
                               quote_literal(part(checked, 2)), quote_literal(part(checked, 3)))) == "t");

    // The next rests on it, and does not check again within the second.
    const auto next = s.claim(10, 30s, std::nullopt, checked).low_mark;
    CHECK(holds(db, part(next, 1), "{} = " + quote_literal(part(checked, 3)) + "::timestamptz"));
    CHECK(part(next, 2) == part(checked, 2));
    CHECK(part(next, 3) == part(checked, 3));

    // A second on, it checks again.
    std::this_thread::sleep_for(check_age);
    const auto later = s.claim(10, 30s, std::nullopt, next).low_mark;
    CHECK(holds(db, part(later, 2), "{} > " + quote_literal(part(next, 2)) + "::timestamptz + interval '1 second'"));
}

TEST_CASE("low mark: a writer in progress at the check keeps it behind the writer's start; its event, committed "
          "after later claims, is claimed from it") {
    installed db;
    auto s = db.store("a");
    const auto first = s.claim(10, 30s).low_mark;
    auto producer_conn = testing::connect();
    pqxx::work producer(*producer_conn);
    // Written now: the producer holds its lock on `events` from here on.
    const auto id = producer.exec1(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()))[0].as<std::int64_t>();
    std::this_thread::sleep_for(check_age);

    const auto checked = s.claim(10, 30s, std::nullopt, first);
    CHECK(checked.events.empty());
    // The floor: the producer's start less 50 ms, more than a second back.
    CHECK(holds(db, part(checked.low_mark, 3), "{} < now() - interval '1 second'"));
    const auto behind = s.claim(10, 30s, std::nullopt, checked.low_mark);
    CHECK(behind.events.empty());
    CHECK(holds(db, part(behind.low_mark, 1), "{} < now() - interval '1 second'"));

    producer.commit();
    // Without the writer's start the low mark would be 50 ms before the
    // check, after this event's available_at: it would wait for a sweep.
    const auto late = s.claim(10, 30s, std::nullopt, behind.low_mark);
    REQUIRE(late.events.size() == 1);
    CHECK(late.events[0].id == id);
}

TEST_CASE("low mark: an event written after the check by a transaction that began before it is due from the time "
          "it was written, through enqueue and through the column's default") {
    installed db;
    auto s = db.store("a");
    const auto first = s.claim(10, 30s).low_mark;
    auto producer_conn = testing::connect();
    pqxx::work producer(*producer_conn);
    producer.exec("SELECT 1");  // begun; no lock on `events` yet
    std::this_thread::sleep_for(check_age);

    // Checks while the producer holds nothing on `events`.
    const auto checked = s.claim(10, 30s, std::nullopt, first);
    CHECK(holds(db, part(checked.low_mark, 3), "{} > now() - interval '1 second'"));
    const auto via_enqueue =
        producer.exec1(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()))[0].as<std::int64_t>();
    const auto via_insert =
        producer.exec1(fmt::format("INSERT INTO {}.events (topic, payload) VALUES ('t', '{{}}') RETURNING id",
                                   db.schema.q()))[0]
            .as<std::int64_t>();
    // Its low mark: the check's floor, after the producer's start.
    const auto past = s.claim(10, 30s, std::nullopt, checked.low_mark);
    CHECK(past.events.empty());
    CHECK(holds(db, part(past.low_mark, 1), "{} > now() - interval '1 second'"));

    producer.commit();
    // Due from when they were written (after the check), not from the
    // producer's start (sql/0013): claimed from that low mark.
    const auto late = s.claim(10, 30s, std::nullopt, past.low_mark);
    std::vector<std::int64_t> ids;
    for (const auto& e : late.events) ids.push_back(e.id);
    std::sort(ids.begin(), ids.end());
    CHECK(ids == std::vector<std::int64_t>{via_enqueue, via_insert});
}

TEST_CASE("low mark: a writer whose start the check cannot see (a prepared transaction) leaves it 5 s back") {
    installed db;
    auto s = db.store("a");
    const auto first = s.claim(10, 30s).low_mark;
    const auto gid = "outboxd-low-mark-" + db.schema.name();
    {
        auto producer_conn = testing::connect();
        pqxx::nontransaction producer(*producer_conn);
        producer.exec("BEGIN");
        producer.exec(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()));
        // Its lock stays, held by no backend.
        producer.exec("PREPARE TRANSACTION " + quote_literal(gid));
    }
    const auto checked = s.claim(10, 30s, std::nullopt, first).low_mark;
    CHECK(part(checked, 3) == "-infinity");
    const auto next = s.claim(10, 30s, std::nullopt, checked).low_mark;
    CHECK(holds(db, part(next, 1), "{} BETWEEN now() - interval '6 seconds' AND now() - interval '4 seconds'"));

    auto conn = testing::connect();
    pqxx::nontransaction(*conn).exec("COMMIT PREPARED " + quote_literal(gid));
    // Committed now, due since it was written: from 5 s back, claimed.
    CHECK(s.claim(10, 30s, std::nullopt, next).events.size() == 1);
}

TEST_CASE("low mark: a relay whose role may not see a writer's session (no pg_read_all_stats) looks back 5 s while "
          "that writer is in progress") {
    installed db;
    const testing::unprivileged_relay_role role(db);
    auto s = role.store("a");
    const auto first = s.claim(10, 30s).low_mark;
    auto producer_conn = testing::connect();
    pqxx::work producer(*producer_conn);
    producer.exec(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()));
    CHECK(part(s.claim(10, 30s, std::nullopt, first).low_mark, 3) == "-infinity");
    producer.commit();
    // With no writer but itself, whose session it sees: a floor again.
    std::this_thread::sleep_for(check_age);
    const auto checked = s.claim(10, 30s, std::nullopt, first).low_mark;
    CHECK(holds(db, part(checked, 3), "{} > now() - interval '1 second'"));
}

TEST_CASE("low mark: one whose first field is empty claims from the start of the index and hands its check on") {
    installed db;
    auto s = db.store("a");
    const auto first = s.claim(10, 30s).low_mark;
    const auto checked = s.claim(10, 30s, std::nullopt, first).low_mark;
    REQUIRE_FALSE(part(checked, 2).empty());
    // Due an hour ago, committed now: behind any low mark but the start.
    pg::new_event e;
    e.topic = "t";
    e.payload = R"({"n":1})";
    const auto old = db.enqueue(e);
    db.query(fmt::format("UPDATE {{s}}.events SET available_at = now() - interval '1 hour' WHERE id = {} RETURNING 1",
                         old));
    CHECK(s.claim(10, 30s, std::nullopt, checked).events.empty());
    const auto from_start = "|" + part(checked, 2) + "|" + part(checked, 3);
    const auto swept = s.claim(10, 30s, std::nullopt, from_start);
    REQUIRE(swept.events.size() == 1);
    CHECK(swept.events[0].id == old);
    // It rests on the check it was given, and hands it on.
    CHECK(holds(db, part(swept.low_mark, 1), "{} = " + quote_literal(part(checked, 3)) + "::timestamptz"));
    CHECK(part(swept.low_mark, 2) == part(checked, 2));
}

TEST_CASE("low mark: a fourth field reaches back to that time (a watched transaction's start), and is not handed on") {
    installed db;
    auto s = db.store("a");
    const auto first = s.claim(10, 30s).low_mark;
    const auto checked = s.claim(10, 30s, std::nullopt, first).low_mark;
    // Written 10 minutes ago by a transaction that has just committed.
    pg::new_event e;
    e.topic = "t";
    e.payload = R"({"n":1})";
    const auto old = db.enqueue(e);
    db.query(fmt::format(
        "UPDATE {{s}}.events SET available_at = now() - interval '10 minutes' WHERE id = {} RETURNING 1", old));
    const auto micros = [&](const char* ago) {
        return db.query(fmt::format("SELECT (extract(epoch FROM now() - interval '{}') * 1000000)::bigint", ago));
    };
    CHECK(s.claim(10, 30s, std::nullopt, checked + "|" + micros("9 minutes")).events.empty());
    const auto reached = s.claim(10, 30s, std::nullopt, checked + "|" + micros("11 minutes"));
    REQUIRE(reached.events.size() == 1);
    CHECK(reached.events[0].id == old);
    CHECK(std::count(reached.low_mark.begin(), reached.low_mark.end(), '|') == 2);
}
