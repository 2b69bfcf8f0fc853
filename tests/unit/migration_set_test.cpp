#include "core/migration_set.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/embedded_sql.hpp"
#include "core/sql_ident.hpp"

using outboxd::migration_plan;
using outboxd::migration_script;
using outboxd::plan_migrations;
using outboxd::render_sql;
using outboxd::embedded::migration_source;

namespace {

constexpr std::string_view placeholder = ":\"schema\"";

constexpr std::array<migration_source, 3> known{{
    {1, "outbox", "CREATE TABLE :\"schema\".a (id int);"},
    {2, "add_b", "CREATE TABLE :\"schema\".b (id int REFERENCES :\"schema\".a);"},
    {3, "o'brien", "ALTER TABLE :\"schema\".a ADD c int;"},
}};

constexpr std::string_view bootstrap =
    "CREATE SCHEMA IF NOT EXISTS :\"schema\";\n"
    "CREATE TABLE IF NOT EXISTS :\"schema\".schema_migrations (version int PRIMARY KEY, name text);\n";

std::size_t count(std::string_view haystack, std::string_view needle) {
    std::size_t n = 0;
    for (auto pos = haystack.find(needle); pos != std::string_view::npos; pos = haystack.find(needle, pos + 1)) ++n;
    return n;
}

std::vector<int> versions_of(const migration_plan& plan) {
    std::vector<int> out;
    for (const auto& m : plan.pending) out.push_back(m.version);
    return out;
}

}  // namespace

// ---- plan_migrations --------------------------------------------------------

TEST_CASE("migration_set: a fresh install has every migration pending, in order") {
    const migration_plan plan = plan_migrations(std::nullopt, known);
    CHECK(versions_of(plan) == std::vector<int>{1, 2, 3});
    CHECK_FALSE(plan.database_is_newer);
    CHECK(plan.database_version == 0);
    CHECK(plan.binary_version == 3);
    REQUIRE(plan.pending.size() == 3);
    CHECK(plan.pending[0].name == "outbox");
    CHECK(plan.pending[1].name == "add_b");
    CHECK(plan.pending[2].sql == known[2].sql);
}

TEST_CASE("migration_set: installed at version 0 is the same as never installed") {
    const migration_plan plan = plan_migrations(0, known);
    CHECK(versions_of(plan) == std::vector<int>{1, 2, 3});
    CHECK_FALSE(plan.database_is_newer);
    CHECK(plan.database_version == 0);
}

TEST_CASE("migration_set: a partly applied schema gets the rest") {
    const migration_plan one = plan_migrations(1, known);
    CHECK(versions_of(one) == std::vector<int>{2, 3});
    CHECK(one.database_version == 1);
    CHECK(one.binary_version == 3);
    CHECK_FALSE(one.database_is_newer);

    const migration_plan two = plan_migrations(2, known);
    CHECK(versions_of(two) == std::vector<int>{3});
    CHECK(two.database_version == 2);
}

TEST_CASE("migration_set: an up-to-date schema has nothing pending") {
    const migration_plan plan = plan_migrations(3, known);
    CHECK(plan.pending.empty());
    CHECK_FALSE(plan.database_is_newer);
    CHECK(plan.database_version == 3);
    CHECK(plan.binary_version == 3);
}

TEST_CASE("migration_set: a database newer than the binary is reported, nothing is planned") {
    const migration_plan plan = plan_migrations(4, known);
    CHECK(plan.database_is_newer);
    CHECK(plan.pending.empty());
    CHECK(plan.database_version == 4);
    CHECK(plan.binary_version == 3);

    const migration_plan far = plan_migrations(1000, std::span(known).first(1));
    CHECK(far.database_is_newer);
    CHECK(far.binary_version == 1);
}

TEST_CASE("migration_set: a binary without migrations") {
    const std::span<const migration_source> none;
    const migration_plan fresh = plan_migrations(std::nullopt, none);
    CHECK(fresh.pending.empty());
    CHECK_FALSE(fresh.database_is_newer);
    CHECK(fresh.binary_version == 0);

    CHECK(plan_migrations(1, none).database_is_newer);
}

// ---- migration_script -------------------------------------------------------

TEST_CASE("migration_script: exact text for one migration") {
    const std::string script = migration_script("outbox", "CREATE SCHEMA :\"schema\";\n", std::span(known).first(1));
    CHECK(script ==
          "-- outboxd migrations for schema \"outbox\"\n"
          "-- Apply in order; each migration runs in its own transaction and records itself\n"
          "-- in schema_migrations, so `outboxd run` and `outboxd migrate` see the version.\n"
          "\n"
          "BEGIN;\n"
          "CREATE SCHEMA \"outbox\";\n"
          "COMMIT;\n"
          "\n"
          "-- migration 0001_outbox\n"
          "BEGIN;\n"
          "INSERT INTO \"outbox\".schema_migrations (version, name) VALUES (1, 'outbox');\n"
          "CREATE TABLE \"outbox\".a (id int);\n"
          "COMMIT;\n");
}

TEST_CASE("migration_script: every migration in order, each in its own transaction with its record") {
    const std::string schema = "my \"odd\" schema";
    const std::string quoted = "\"my \"\"odd\"\" schema\"";
    const std::string script = migration_script(schema, bootstrap, known);

    CHECK(script.find(placeholder) == std::string::npos);

    // bootstrap first, rendered, in a transaction of its own
    const std::string boot = "BEGIN;\n" + render_sql(bootstrap, schema) + "COMMIT;\n";
    const auto boot_at = script.find(boot);
    REQUIRE(boot_at != std::string::npos);
    CHECK(script.find("CREATE SCHEMA IF NOT EXISTS " + quoted + ";") != std::string::npos);

    // then each migration, rendered, after the row that records it (first,
    // as `outboxd migrate` does)
    const std::array<std::string, 3> blocks{
        "-- migration 0001_outbox\nBEGIN;\n"
        "INSERT INTO " + quoted + ".schema_migrations (version, name) VALUES (1, 'outbox');\n"
        "CREATE TABLE " + quoted + ".a (id int);\nCOMMIT;\n",
        "-- migration 0002_add_b\nBEGIN;\n"
        "INSERT INTO " + quoted + ".schema_migrations (version, name) VALUES (2, 'add_b');\n"
        "CREATE TABLE " + quoted + ".b (id int REFERENCES " + quoted + ".a);\nCOMMIT;\n",
        "-- migration 0003_o'brien\nBEGIN;\n"
        "INSERT INTO " + quoted + ".schema_migrations (version, name) VALUES (3, 'o''brien');\n"
        "ALTER TABLE " + quoted + ".a ADD c int;\nCOMMIT;\n",
    };
    std::size_t previous = boot_at;
    for (const auto& block : blocks) {
        CAPTURE(block);
        const auto at = script.find(block);
        REQUIRE(at != std::string::npos);
        CHECK(at > previous);
        previous = at;
    }
    // and nothing after the last one
    CHECK(previous + blocks.back().size() == script.size());

    CHECK(count(script, "BEGIN;\n") == 4);
    CHECK(count(script, "COMMIT;\n") == 4);
    CHECK(count(script, "INSERT INTO " + quoted + ".schema_migrations") == 3);
}

TEST_CASE("migration_script: no migrations gives just the bootstrap") {
    const std::string script = migration_script("s", bootstrap, {});
    CHECK(count(script, "BEGIN;") == 1);
    CHECK(count(script, "COMMIT;") == 1);
    CHECK(script.find("schema_migrations (version, name) VALUES") == std::string::npos);
    CHECK(script.find(placeholder) == std::string::npos);
}

// ---- the migrations compiled into this binary -------------------------------

TEST_CASE("migration_set: the embedded migrations run 1..N and render completely") {
    const auto migrations = outboxd::embedded::migrations();
    REQUIRE_FALSE(migrations.empty());
    int expected = 1;
    for (const auto& m : migrations) {
        CAPTURE(m.version);
        CHECK(m.version == expected);
        ++expected;
        CHECK_FALSE(m.name.empty());
        CHECK_FALSE(m.sql.empty());
        CHECK(m.sql.find(placeholder) != std::string_view::npos);  // it does create things in the schema
        for (const std::string_view schema : {"outbox", "my \"odd\" schema"}) {
            const std::string rendered = render_sql(m.sql, schema);
            CHECK(rendered.find(placeholder) == std::string::npos);
            CHECK(rendered.find(outboxd::quote_ident(schema)) != std::string::npos);
        }
    }

    const migration_plan fresh = plan_migrations(std::nullopt, migrations);
    CHECK(fresh.pending.size() == migrations.size());
    CHECK(fresh.binary_version == static_cast<int>(migrations.size()));
    CHECK(plan_migrations(fresh.binary_version, migrations).pending.empty());
    CHECK(plan_migrations(fresh.binary_version + 1, migrations).database_is_newer);
}

TEST_CASE("migration_set: embedded function bodies never use the placeholder") {
    // psql does not substitute variables inside dollar quotes, so a body that
    // used :"schema" would behave differently under `psql -f` and `outboxd migrate`.
    for (const auto& m : outboxd::embedded::migrations()) {
        CAPTURE(m.version);
        const std::string_view sql = m.sql;
        REQUIRE(count(sql, "$$") % 2 == 0);
        for (auto open = sql.find("$$"); open != std::string_view::npos;) {
            const auto close = sql.find("$$", open + 2);
            REQUIRE(close != std::string_view::npos);
            CHECK(sql.substr(open, close - open).find(placeholder) == std::string_view::npos);
            open = sql.find("$$", close + 2);
        }
    }
}

TEST_CASE("migration_set: the script from the embedded SQL has no placeholder left") {
    std::string_view boot;
    for (const auto& q : outboxd::embedded::queries()) {
        if (q.name == "bootstrap") boot = q.sql;
    }
    REQUIRE_FALSE(boot.empty());
    const auto migrations = outboxd::embedded::migrations();
    const std::string script = migration_script("outbox", boot, migrations);
    CHECK(script.find(placeholder) == std::string::npos);
    CHECK(count(script, "\nBEGIN;\n") == migrations.size() + 1);
    // Each recorded by the script, first; from 0004 on also by the migration
    // itself, last, which then does nothing (ON CONFLICT); 0004 records
    // 0001-0003 too, which predate that rule.
    const auto self_recording = static_cast<std::size_t>(
        std::count_if(migrations.begin(), migrations.end(), [](const auto& m) { return m.version >= 4; }));
    CHECK(count(script, "INSERT INTO \"outbox\".schema_migrations (version, name) VALUES (") ==
          migrations.size() + self_recording);
    CHECK(count(script, "ON CONFLICT (version) DO NOTHING;") == self_recording + 1);
}
