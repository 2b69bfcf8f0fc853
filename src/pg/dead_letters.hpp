#pragma once
// Operator access to dead letters (the `outboxd dead` commands). Plain
// blocking calls on one connection; `outboxd status` is in pg/status.hpp.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/connection>

namespace outboxd::pg {

struct dead_filter {
    std::optional<std::int64_t> id;  // replay only
    // A topic pattern as a PostgreSQL regular expression (topic_pattern::to_regex).
    std::optional<std::string> topic;
    std::optional<std::chrono::milliseconds> older_than;  // died at least this long ago
};

struct dead_letter {
    std::int64_t id = 0;
    std::string topic;
    std::optional<std::string> ordering_key;
    int attempts = 0;
    std::optional<int> last_status;
    std::string last_error;
    std::string response_excerpt;
    std::string created_at;  // ISO 8601, as PostgreSQL prints it
    std::string died_at;
    std::string payload;     // JSON text
    // The destination that gave up on the event; nullopt for a whole event
    // (it could not be sent at all, or no route matched its topic).
    std::optional<std::string> destination;
    std::string message_id;  // its webhook-id (sql/0005), the same after a replay
};

[[nodiscard]] std::vector<dead_letter> list_dead(pqxx::connection& conn, const std::string& schema,
                                                 const dead_filter& filter, std::size_t limit);

// Dead letters that still match `filter`: after replay_dead, those it left
// because their event is back in the outbox (they replay once it has left),
// and any that died since.
[[nodiscard]] std::size_t count_dead(pqxx::connection& conn, const std::string& schema, const dead_filter& filter);

// Returns the ids put back into the outbox (due now, attempts reset). One
// replay at a time per outbox.
[[nodiscard]] std::vector<std::int64_t> replay_dead(pqxx::connection& conn, const std::string& schema,
                                                    const dead_filter& filter);

// Deletes dead letters that died more than `older_than` ago. Returns how many.
// dry_run: counts what would be deleted and deletes nothing.
[[nodiscard]] std::size_t purge_dead(pqxx::connection& conn, const std::string& schema,
                                     std::chrono::milliseconds older_than, const std::optional<std::string>& topic,
                                     bool dry_run = false);


}  // namespace outboxd::pg
