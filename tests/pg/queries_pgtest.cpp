// The descriptors tools/embed_sql.py generates (pg/queries.hpp) against what
// PostgreSQL itself says of each statement: as many parameters, the same
// result columns under the same names. The build already checks the code
// against the descriptors; this checks the descriptors against the server.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <libpq-fe.h>

#include "pg/queries.hpp"
#include "pg_fixture.hpp"

using namespace outboxd;
using outboxd::testing::installed;

namespace {

// Q's text for the schema, with placeholders filled as the store fills them.
template <typename Q>
std::string statement(const std::string& schema) {
    if constexpr (std::is_same_v<Q, pg::q::claim_deliveries>) {
        return Q::text(schema, {.claim_size = "16"});
    } else if constexpr (requires { typename Q::fills; }) {
        return Q::text(schema, {.claim_size = "16", .known_destination = "destination = ANY ('{a}'::text[])"});
    } else {
        return Q::text(schema);
    }
}

struct described {
    std::string error;
    int params = 0;
    std::vector<std::string> columns;
};

described describe(PGconn* c, const std::string& name, const std::string& sql) {
    described out;
    PGresult* prepared = PQprepare(c, name.c_str(), sql.c_str(), 0, nullptr);
    if (PQresultStatus(prepared) != PGRES_COMMAND_OK) out.error = PQresultErrorMessage(prepared);
    PQclear(prepared);
    if (!out.error.empty()) return out;
    PGresult* d = PQdescribePrepared(c, name.c_str());
    out.params = PQnparams(d);
    for (int i = 0; i < PQnfields(d); ++i) out.columns.emplace_back(PQfname(d, i));
    PQclear(d);
    return out;
}

template <typename Q>
void check(PGconn* c, const std::string& schema) {
    if (std::string_view(Q::name) == "bootstrap") return;  // several statements: not preparable
    CAPTURE(Q::name);
    const auto got = describe(c, std::string(Q::name), statement<Q>(schema));
    REQUIRE(got.error == "");
    CHECK(got.params == static_cast<int>(Q::params.size()));
    CHECK(fmt::format("{}", fmt::join(got.columns, ", ")) == fmt::format("{}", fmt::join(Q::columns, ", ")));
}

}  // namespace

TEST_CASE("every query's generated parameters and columns are what PostgreSQL makes of its SQL") {
    installed db{"queries"};
    PGconn* c = PQconnectdb(testing::database_url().c_str());
    REQUIRE(PQstatus(c) == CONNECTION_OK);
    std::apply([&](auto... q) { (check<decltype(q)>(c, db.schema.name()), ...); }, pg::q::all{});
    PQfinish(c);
}
