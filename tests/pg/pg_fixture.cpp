#include "pg_fixture.hpp"

#include <cstdlib>
#include <random>
#include <stdexcept>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/log.hpp"
#include "core/sql_ident.hpp"
#include "pg/consume_setup.hpp"
#include "pg/migrator.hpp"

namespace outboxd::testing {
namespace {
// Migration progress lines would drown the test report.
const bool quiet = [] {
    log::set_level(log::level::warn);
    return true;
}();
}  // namespace

std::string database_url() {
    const char* url = std::getenv("OUTBOXD_TEST_DATABASE_URL");
    if (url == nullptr || *url == '\0') {
        throw std::runtime_error("OUTBOXD_TEST_DATABASE_URL is not set; run the tests with scripts/test.sh");
    }
    return url;
}

std::unique_ptr<pqxx::connection> connect() { return std::make_unique<pqxx::connection>(database_url()); }

scratch_schema::scratch_schema(std::string prefix) {
    std::random_device rd;
    name_ = fmt::format("{}_{:08x}", prefix, rd());
}

scratch_schema::~scratch_schema() {
    try {
        auto c = connect();
        pqxx::nontransaction tx(*c);
        tx.exec("DROP SCHEMA IF EXISTS " + q() + " CASCADE");
    } catch (...) {
    }
}

std::string scratch_schema::q() const { return quote_ident(name_); }

std::string scalar(pqxx::connection& c, const std::string& sql) {
    pqxx::nontransaction tx(c);
    const auto r = tx.exec1(sql);
    return r[0].is_null() ? std::string("NULL") : std::string(r[0].c_str());
}

installed::installed(std::string prefix, std::string_view consume) : schema(std::move(prefix)), admin(connect()) {
    (void)pg::migrate(*admin, schema.name());
    // Migrations leave an outbox set up for windows (sql/0016); a claims
    // fixture takes that away, as `outboxd consume-setup claims` does.
    set_up_consume(*admin, schema.name(), consume);
}

void set_up_consume(pqxx::connection& c, const std::string& schema, std::string_view consume) {
    pqxx::work tx(c);
    for (const auto& statement : pg::consume_setup_statements(schema, consume)) tx.exec(statement);
    tx.commit();
}

pg::store installed::store(const std::string& owner) const {
    return pg::store(database_url(), schema.name(), owner);
}

unprivileged_relay_role::unprivileged_relay_role(installed& db) : db_(db), role_(db.schema.name() + "_relay") {
    db_.query(fmt::format("CREATE ROLE {0} LOGIN; GRANT USAGE ON SCHEMA {{s}} TO {0}; "
                          "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {{s}} TO {0}; "
                          "GRANT USAGE ON ALL SEQUENCES IN SCHEMA {{s}} TO {0}; SELECT 1",
                          quote_ident(role_)));
}

unprivileged_relay_role::~unprivileged_relay_role() {
    try {
        db_.query(fmt::format("DROP OWNED BY {0}; DROP ROLE {0}; SELECT 1", quote_ident(role_)));
    } catch (const std::exception&) {
        // A session of the role still open: the scratch schema goes anyway.
    }
}

pg::store unprivileged_relay_role::store(const std::string& owner) const {
    const auto url = database_url();
    return pg::store(url + (url.find('?') == std::string::npos ? "?" : "&") + "user=" + role_, db_.schema.name(),
                     owner);
}

pg::producer installed::producer() const { return pg::producer(database_url(), schema.name()); }

std::int64_t installed::enqueue(const pg::new_event& e) {
    if (!producer_) producer_ = std::make_unique<pg::producer>(database_url(), schema.name());
    return producer_->enqueue(e);
}

pg::lease_ref installed::lease(std::int64_t id, std::int32_t attempt) {
    return {id, attempt, query(fmt::format("SELECT ctid::text FROM {{s}}.events WHERE id = {}", id))};
}

std::string installed::query(const std::string& sql_with_schema) {
    return scalar(*admin, fmt::format(fmt::runtime(sql_with_schema), fmt::arg("s", schema.q())));
}

}  // namespace outboxd::testing
