// pg::migrate and the SQL of sql/ against a real PostgreSQL.
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/embedded_sql.hpp"
#include "core/migration_set.hpp"
#include "pg/migrator.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using outboxd::testing::scalar;

namespace {
const int latest = embedded::migrations().back().version;

std::string bootstrap_sql() {
    for (const auto& q : embedded::queries()) {
        if (q.name == "bootstrap") return std::string(q.sql);
    }
    return {};
}
}  // namespace

TEST_CASE("fresh install creates the outbox and records every migration") {
    testing::scratch_schema s;
    auto c = testing::connect();
    CHECK(pg::read_schema_version(*c, s.name()) == std::nullopt);
    const auto r = pg::migrate(*c, s.name());
    CHECK(r.version == latest);
    CHECK(r.applied.size() == static_cast<std::size_t>(latest));
    CHECK(pg::read_schema_version(*c, s.name()) == latest);
    CHECK(scalar(*c, fmt::format("SELECT count(*) FROM {}.schema_migrations", s.q())) == std::to_string(latest));
    for (const auto* table : {"events", "dead_letters", "idempotency_keys"}) {
        CHECK(scalar(*c, fmt::format("SELECT to_regclass('{}.{}') IS NOT NULL", s.q(), table)) == "t");
    }
    CHECK(scalar(*c, fmt::format("SELECT count(*) FROM pg_trigger WHERE tgname = 'events_notify' "
                                 "AND tgrelid = '{}.events'::regclass",
                                 s.q())) == "1");
}

TEST_CASE("re-running migrate is a no-op") {
    testing::scratch_schema s;
    auto c = testing::connect();
    (void)pg::migrate(*c, s.name());
    const auto before = scalar(*c, fmt::format("SELECT max(applied_at)::text FROM {}.schema_migrations", s.q()));
    const auto again = pg::migrate(*c, s.name());
    CHECK(again.applied.empty());
    CHECK(again.version == latest);
    CHECK(scalar(*c, fmt::format("SELECT max(applied_at)::text FROM {}.schema_migrations", s.q())) == before);
}

TEST_CASE("two concurrent migrators: one applies, the other finds nothing to do") {
    // Several rounds of racing pairs, each on a fresh schema, to make an
    // unlocked race likely to show.
    for (int round = 0; round < 5; ++round) {
        testing::scratch_schema race;
        auto go = [&] {
            auto c = testing::connect();
            return pg::migrate(*c, race.name());
        };
        auto a = std::async(std::launch::async, go);
        auto b = std::async(std::launch::async, go);
        const auto ra = a.get();
        const auto rb = b.get();
        CHECK(ra.applied.size() + rb.applied.size() == static_cast<std::size_t>(latest));
        CHECK(ra.version == latest);
        CHECK(rb.version == latest);
    }
}

TEST_CASE("a schema newer than the binary is refused") {
    testing::scratch_schema s;
    auto c = testing::connect();
    (void)pg::migrate(*c, s.name());
    {
        pqxx::work tx(*c);
        tx.exec(fmt::format("INSERT INTO {}.schema_migrations (version, name) VALUES ({}, 'from_the_future')", s.q(),
                            latest + 1));
        tx.commit();
    }
    CHECK_THROWS_AS((void)pg::migrate(*c, s.name()), pg::schema_too_new);
}

TEST_CASE("a hostile schema name is quoted everywhere and harms nothing") {
    testing::scratch_schema canary("canary");
    auto c = testing::connect();
    {
        pqxx::work tx(*c);
        tx.exec("CREATE SCHEMA " + canary.q());
        tx.exec("CREATE TABLE " + canary.q() + ".precious (x int)");
        tx.commit();
    }
    const std::string hostile = fmt::format("x\"; DROP SCHEMA {} CASCADE; --", canary.name());
    struct dropper {
        std::string name;
        ~dropper() {
            try {
                auto c = testing::connect();
                pqxx::nontransaction tx(*c);
                tx.exec("DROP SCHEMA IF EXISTS " + tx.quote_name(name) + " CASCADE");
            } catch (...) {
            }
        }
    } cleanup{hostile};
    const auto r = pg::migrate(*c, hostile);
    CHECK(r.version == latest);
    CHECK(scalar(*c, fmt::format("SELECT to_regclass('{}.precious') IS NOT NULL", canary.q())) == "t");
    pqxx::work tx(*c);
    const auto id = tx.exec1(fmt::format("SELECT {}.enqueue('t', '{{}}')", tx.quote_name(hostile)))[0].as<long>();
    CHECK(id == 1);
}

TEST_CASE("the script of `outboxd sql` installs a working outbox that migrate accepts") {
    testing::scratch_schema s;
    auto c = testing::connect();
    {
        pqxx::nontransaction tx(*c);
        tx.exec(migration_script(s.name(), bootstrap_sql(), embedded::migrations()));
    }
    CHECK(pg::read_schema_version(*c, s.name()) == latest);
    CHECK(pg::migrate(*c, s.name()).applied.empty());
    pqxx::work tx(*c);
    CHECK(tx.exec1(fmt::format("SELECT {}.enqueue('t', '{{\"a\":1}}')", s.q()))[0].as<long>() == 1);
}
