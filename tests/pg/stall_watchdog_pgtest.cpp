// Deadlines on libpq calls (pg::stall_watchdog, the relay sessions'
// statement_timeout) against a real PostgreSQL.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "pg/stall_watchdog.hpp"
#include "pg/store.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

TEST_CASE("with_deadline: a call still unanswered at its deadline fails as a broken connection that says why") {
    auto c = testing::connect();
    const auto started = clock_type::now();
    std::string error;
    try {
        pg::with_deadline(*c, 300ms, [](pqxx::connection& conn) {
            pqxx::nontransaction tx(conn);
            tx.exec("SELECT pg_sleep(30)");
        });
    } catch (const pqxx::broken_connection& e) {
        error = e.what();
    }
    const auto took = clock_type::now() - started;
    CHECK(error.find("no answer from the database within 300 ms") != std::string::npos);
    CHECK(took >= 300ms);
    CHECK(took < 5s);
    CHECK_FALSE(c->is_open());
}

TEST_CASE("with_deadline: a call answered in time is untouched, and so is the connection afterwards") {
    auto c = testing::connect();
    pg::with_deadline(*c, 2s, [](pqxx::connection& conn) {
        pqxx::nontransaction tx(conn);
        tx.exec("SELECT pg_sleep(0.05)");
    });
    CHECK(testing::scalar(*c, "SELECT pg_sleep(2.5)::text || 'alive'") == "alive");
}

TEST_CASE("store: a relay session's statement that outlasts statement_timeout is cancelled by the server; "
          "the connection stays usable") {
    testing::installed db;
    auto& admin = db.admin;
    auto& schema = db.schema;
    pg::store s(testing::database_url(), schema.name(), "a", /*relay_session=*/true, /*plan_once=*/true, 500ms);
    s.connect();
    {
        // Another session holds the table: the claim waits on its lock.
        pqxx::work blocker(*admin);
        blocker.exec(fmt::format("LOCK TABLE {}.events IN ACCESS EXCLUSIVE MODE", schema.q()));
        const auto started = clock_type::now();
        std::string error;
        try {
            (void)s.claim(1, 30s);
        } catch (const pqxx::sql_error& e) {
            error = e.what();
        }
        CHECK(error.find("statement timeout") != std::string::npos);
        CHECK(clock_type::now() - started < 5s);
        blocker.abort();
    }
    CHECK(s.connected());
    CHECK(s.claim(1, 30s).events.empty());
}
