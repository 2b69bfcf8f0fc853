#pragma once
// The outbox's state for operators (`outboxd status`). A plain blocking call
// on one connection.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/connection>

#include "core/windows_report.hpp"

namespace outboxd::pg {

// Work in the outbox of one topic at one destination, each piece in exactly
// one state (see the status query in queries.sql): an event, or one
// destination's delivery of a fanned-out event.
struct work_status {
    std::string topic;
    // nullopt: events not fanned out, owed to every destination their topic
    // routes to; else a fanned-out event's delivery to this destination.
    std::optional<std::string> destination;
    std::int64_t pending = 0;         // never attempted, due now
    std::int64_t waiting_on_key = 0;  // never attempted, due, behind an earlier event of its key
    std::int64_t scheduled = 0;       // never attempted, not due yet
    std::int64_t in_flight = 0;       // leased by a relay, or read by the windows relay of its slot
    std::int64_t retrying = 0;        // attempted before, waiting for the next attempt
    std::int64_t dead = 0;            // dead letters (destination nullopt: the whole event died)
    double oldest_pending_seconds = 0;  // how long the oldest due work has been due
    // The newest error among the group's waiting work, e.g. that no route
    // matches the topic.
    std::optional<std::string> last_error;
};

[[nodiscard]] std::vector<work_status> outbox_status(pqxx::connection& conn, const std::string& schema);

// What the live relays report of one destination's circuit (sql/0007).
struct circuit_report {
    std::string destination;
    std::int64_t open = 0;  // live relays whose circuit for it is open
};
struct circuit_reports {
    std::int64_t live_relays = 0;
    std::int64_t claiming = 0;  // of them, registered with relay.consume = "claims" (sql/0015)
    std::int64_t windows = 0;   // and with "windows"; older relays are in neither
    std::vector<circuit_report> destinations;  // those some relay has reported on
};

[[nodiscard]] circuit_reports published_circuits(pqxx::connection& conn, const std::string& schema);

// Whether the outbox is set up for windows (migrate since sql/0016, or
// `consume-setup windows`): the txid default and the window read's index.
[[nodiscard]] bool outbox_windows_set_up(pqxx::connection& conn, const std::string& schema);

// Commit-ordered windows (core/windows_report.hpp): nullopt when the outbox
// has no relay cursors. The transactions holding the cursors back are read
// only when the cursors belong to this server (their xids mean nothing
// elsewhere).
[[nodiscard]] std::optional<windows_report> windows_status(pqxx::connection& conn, const std::string& schema);

}  // namespace outboxd::pg
