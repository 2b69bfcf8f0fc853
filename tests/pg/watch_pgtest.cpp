// What an `auto` relay watches after it declared itself idle (and a `wal`
// relay after its stream came up): the transactions in progress that may
// have written an event it has not seen, each with how far back the claim
// after its end must reach (transactions_in_progress in src/pg/queries.sql,
// core/wake_policy.hpp). Against a real PostgreSQL, with real transactions
// held open.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/sql_ident.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using outboxd::testing::installed;

namespace {

const xact_in_progress* find(const std::vector<xact_in_progress>& xacts, const std::string& xid) {
    for (const auto& x : xacts) {
        if (x.xid == xid) return &x;
    }
    return nullptr;
}

// How `s` lists `xid` (the test fails when it does not).
xact_in_progress listed(pg::store& s, const std::string& xid) {
    const auto all = s.transactions_in_progress();
    const auto* x = find(all, xid);
    REQUIRE_MESSAGE(x != nullptr, "transaction ", xid, " is not listed");
    return *x;
}

std::string xid_of(pqxx::transaction_base& tx) {
    return tx.exec1("SELECT pg_current_xact_id()::text")[0].as<std::string>();
}

// The transaction's start less 50 ms, as the database's clock has it.
database_time start_less_50ms(pqxx::transaction_base& tx) {
    return database_time(std::chrono::microseconds(
        tx.exec1("SELECT (extract(epoch FROM now() - interval '50 milliseconds') * 1000000)::bigint")[0]
            .as<std::int64_t>()));
}

}  // namespace

TEST_CASE("watch: a writer of events is listed with its start less 50 ms, also one whose id came after every "
          "completed transaction") {
    // A snapshot's xip lists only ids below its xmax (the last completed id
    // plus one): a producer whose id came after every completed transaction
    // is in progress but not in xip. Missing it, the relay would not watch a
    // producer that read "busy" (auto) or a commit behind the slot (wal).
    installed db;
    auto s = db.store("a");
    (void)s.transactions_in_progress();  // connected before the producer begins
    auto producer_conn = testing::connect();
    pqxx::work producer(*producer_conn);
    producer.exec(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()));
    const auto xid = xid_of(producer);
    const auto since = start_less_50ms(producer);
    const auto x = listed(s, xid);
    CHECK(x.writes_events);
    REQUIRE(x.written_since);
    CHECK(*x.written_since == since);
    CHECK(s.still_in_progress(xid) == xid);
    producer.abort();
    CHECK(s.still_in_progress(xid).empty());
}

TEST_CASE("watch: a transaction that writes no outbox table is not listed (it cannot have read \"busy\"); one that "
          "writes only deliveries is, with nothing to reach back for") {
    // A transaction held open elsewhere (a report, an idle session) would
    // otherwise be watched for as long as it lasts, and the claim at its end
    // would reach back over everything since it began.
    installed db;
    auto s = db.store("a");
    auto other_conn = testing::connect();
    pqxx::work other(*other_conn);
    other.exec("CREATE TEMP TABLE elsewhere (n int); INSERT INTO elsewhere VALUES (1)");
    const auto other_xid = xid_of(other);
    auto fan_conn = testing::connect();
    pqxx::work fan(*fan_conn);
    fan.exec(fmt::format("INSERT INTO {}.deliveries (event_id, destination) VALUES (1, 'd')", db.schema.q()));
    const auto fan_xid = xid_of(fan);
    const auto all = s.transactions_in_progress();
    CHECK(find(all, other_xid) == nullptr);
    const auto* x = find(all, fan_xid);
    REQUIRE(x != nullptr);
    CHECK_FALSE(x->writes_events);
    CHECK_FALSE(x->written_since);
}

TEST_CASE("watch: a writer whose start cannot be seen is listed with none (the claim at its end is from the start)") {
    installed db;
    auto s = db.store("a");
    SUBCASE("a prepared transaction") {
        const auto gid = "outboxd-watch-" + db.schema.name();
        std::string xid;
        {
            auto producer_conn = testing::connect();
            pqxx::nontransaction producer(*producer_conn);
            producer.exec("BEGIN");
            producer.exec(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()));
            xid = xid_of(producer);
            producer.exec("PREPARE TRANSACTION " + quote_literal(gid));
        }
        const auto all = s.transactions_in_progress();
        auto conn = testing::connect();
        pqxx::nontransaction(*conn).exec("ROLLBACK PREPARED " + quote_literal(gid));
        const auto* x = find(all, xid);
        REQUIRE(x != nullptr);
        CHECK(x->writes_events);
        CHECK_FALSE(x->written_since);
    }
    SUBCASE("another role's session, to a relay role without pg_read_all_stats") {
        const testing::unprivileged_relay_role role(db);
        auto unprivileged = role.store("b");
        auto producer_conn = testing::connect();
        pqxx::work producer(*producer_conn);
        producer.exec(fmt::format("SELECT {}.enqueue('t', '{{}}')", db.schema.q()));
        const auto xid = xid_of(producer);
        const auto x = listed(unprivileged, xid);
        CHECK(x.writes_events);
        CHECK_FALSE(x.written_since);
        // The same writer, seen by a relay that may see its session.
        CHECK(listed(s, xid).written_since);
    }
}
