#pragma once
// The outbox's state for operators (`outboxd status`). A plain blocking call
// on one connection.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/connection>

namespace outboxd::pg {

// Work in the outbox per topic, each piece in exactly one state (see the
// status query in queries.sql): an event, or one destination's delivery of
// a fanned-out event.
struct topic_status {
    std::string topic;
    std::int64_t pending = 0;         // never attempted, due now
    std::int64_t waiting_on_key = 0;  // never attempted, due, behind an earlier event of its key
    std::int64_t scheduled = 0;       // never attempted, not due yet
    std::int64_t in_flight = 0;       // leased by a relay
    std::int64_t retrying = 0;        // attempted before, waiting for the next attempt
    std::int64_t dead = 0;
    double oldest_pending_seconds = 0;  // how long the oldest due work has been due
    // The newest error among the topic's waiting events (for a destination's
    // delivery: "destination: error"), e.g. that no route matches the topic.
    std::optional<std::string> last_error;
};

[[nodiscard]] std::vector<topic_status> outbox_status(pqxx::connection& conn, const std::string& schema);

}  // namespace outboxd::pg
