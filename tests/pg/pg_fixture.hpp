#pragma once
// Shared setup of the PostgreSQL tests: the throwaway cluster's URL (from
// OUTBOXD_TEST_DATABASE_URL, set by scripts/test.sh) and a fresh schema per
// test, dropped afterwards; `installed` is the outbox in such a schema.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <pqxx/connection>

#include "pg/producer.hpp"
#include "pg/store.hpp"

namespace outboxd::testing {

// Throws when OUTBOXD_TEST_DATABASE_URL is not set: these tests never skip
// silently.
[[nodiscard]] std::string database_url();

[[nodiscard]] std::unique_ptr<pqxx::connection> connect();

// A unique schema name; the schema (if created) is dropped with CASCADE when
// this goes out of scope.
class scratch_schema {
public:
    explicit scratch_schema(std::string prefix = "pgt");
    ~scratch_schema();
    scratch_schema(const scratch_schema&) = delete;
    scratch_schema& operator=(const scratch_schema&) = delete;

    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    // The schema name quoted for SQL text.
    [[nodiscard]] std::string q() const;

private:
    std::string name_;
};

// Runs one statement and returns the first column of the first row as text.
[[nodiscard]] std::string scalar(pqxx::connection& c, const std::string& sql);

// Runs `outboxd consume-setup CONSUME`'s statements on `schema`.
void set_up_consume(pqxx::connection& c, const std::string& schema, std::string_view consume);

// The outbox, migrated into a fresh schema (dropped afterwards), and an
// admin connection to look at it with. The one way tests install it.
// consume: the state `outboxd consume-setup` puts the events table in
// ("claims", or "windows" as migrate leaves it since sql/0016).
struct installed {
    explicit installed(std::string prefix = "pgt", std::string_view consume = "claims");

    scratch_schema schema;
    std::unique_ptr<pqxx::connection> admin;

    // A relay's store with default settings, leasing as `owner`.
    [[nodiscard]] pg::store store(const std::string& owner) const;
    // A producer of its own (one per thread).
    [[nodiscard]] pg::producer producer() const;
    // Commits an event through a producer (as `outboxd enqueue` does).
    std::int64_t enqueue(const pg::new_event& e);
    // The lease of event `id` at `attempt`, where its row version is now (its ctid).
    [[nodiscard]] pg::lease_ref lease(std::int64_t id, std::int32_t attempt);
    // scalar() on the admin connection; {s} in the text is the quoted schema.
    std::string query(const std::string& sql_with_schema);

private:
    std::unique_ptr<pg::producer> producer_;
};

// A relay role of its own for `db`'s outbox, dropped afterwards: the
// privileges config/grants.sql gives a relay, and not pg_read_all_stats,
// so the producers' sessions (of the admin role) show it no transaction
// start.
class unprivileged_relay_role {
public:
    explicit unprivileged_relay_role(installed& db);
    ~unprivileged_relay_role();
    unprivileged_relay_role(const unprivileged_relay_role&) = delete;
    unprivileged_relay_role& operator=(const unprivileged_relay_role&) = delete;

    // A relay's store logged in as this role, leasing as `owner`.
    [[nodiscard]] pg::store store(const std::string& owner) const;

private:
    installed& db_;
    std::string role_;
};

}  // namespace outboxd::testing
