#pragma once
// Shared setup of the PostgreSQL tests: the throwaway cluster's URL (from
// OUTBOXD_TEST_DATABASE_URL, set by scripts/test.sh) and a fresh schema per
// test, dropped afterwards.

#include <memory>
#include <string>

#include <pqxx/connection>

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

}  // namespace outboxd::testing
