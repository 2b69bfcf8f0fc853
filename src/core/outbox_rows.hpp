#pragma once
// What the relay and the database exchange about claimed rows: the fencing
// tokens of a claim, the outcomes written back, and what a claim returns.
// Plain data, shared by the relay engine (core) and the store (pg), so the
// engine never needs the database's headers.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/event.hpp"

namespace outboxd {

// Which claim of an event an outcome belongs to (the fencing token).
struct lease_ref {
    lease_ref() = default;
    lease_ref(std::int64_t event_id, std::int32_t attempt_number, std::string row_tid = {}, std::string key_hold = {})
        : id(event_id), attempt(attempt_number), tid(std::move(row_tid)), hold(std::move(key_hold)) {}

    std::int64_t id = 0;
    std::int32_t attempt = 0;
    // Where the claim left the leased row (its ctid, as text): `complete`
    // finds it there. Empty: not known (the row is then looked up by id).
    std::string tid;
    // A run's follower carries no lease: the hold it was sent under (see
    // event::hold). Empty for a leased row.
    std::string hold;
};

// One destination's delivery of a fanned-out event, as claimed.
struct delivery_ref {
    std::int64_t id = 0;
    std::string destination;
    std::int32_t attempt = 0;
};

// An event written before `outboxd consume-setup windows` (txid NULL), as a
// windows relay reads it to park it (core/pre_window_park.hpp).
struct pre_window_event {
    std::int64_t id = 0;
    std::string topic;
    std::vector<std::string> only_to;  // events.destinations; empty: by route
    std::int32_t attempts = 0;         // made so far, at every destination
    std::optional<std::string> last_error;
};

// A destination that still owes an event after a fan-out.
struct owed_delivery {
    std::string destination;
    std::chrono::milliseconds due_in{0};
    std::int32_t attempts = 0;          // made there so far
    std::optional<std::string> error;   // the last one there, if any
};

// A destination that gave up on an event for good.
struct dead_delivery {
    std::string destination;
    std::int32_t attempts = 0;
    std::string error;
    std::optional<int> status;
    std::string response_excerpt;
};

struct delivery_retry {
    delivery_ref ref;
    std::chrono::milliseconds delay{0};
    std::string error;
};

struct delivery_burial {
    delivery_ref ref;
    std::string error;
    std::optional<int> status;
    std::string response_excerpt;
};

// Outcomes of claimed deliveries, recorded together in one transaction.
struct delivery_outcomes {
    std::vector<delivery_ref> delivered;
    std::vector<delivery_retry> retries;
    std::vector<delivery_burial> dead;
    [[nodiscard]] bool empty() const noexcept { return delivered.empty() && retries.empty() && dead.empty(); }
};

// The leases a relay holds: claimed, their outcome not yet recorded.
struct held_leases {
    std::vector<std::int64_t> events;
    std::vector<std::int64_t> delivery_ids;  // parallel to delivery_destinations
    std::vector<std::string> delivery_destinations;
};

// Where the last full claim of events stopped, in claim order
// (available_at, id): the next claim of a draining backlog starts behind it.
struct claim_watermark {
    std::string available_at;  // timestamptz as PostgreSQL prints it (exact)
    std::int64_t id = 0;
    // The drain it belongs to (set by run_claim): the low mark its first
    // claim started from, and the low mark that claim returned.
    std::optional<std::string> drain_began_at = {};
    std::optional<std::string> drain_low_mark = {};
};

struct claim_result {
    std::vector<event> events;
    // Time until the earliest event or delivery that is not due yet (a
    // retry, a delayed event, a lease expiring), by the database's clock;
    // nullopt if none.
    std::optional<std::chrono::milliseconds> next_due;
    // Deliveries are due (claim them with claim_deliveries).
    bool deliveries_due = false;
    // The last event picked, in claim order, or the last row examined if
    // the claim examined its bound of rows (nullopt if none).
    std::optional<claim_watermark> last;
    // Where the next claim outside a drain may start, if this one came back
    // less than full (see the claim in queries.sql).
    std::string low_mark;
    // Due events the claim picked, including those it could not lease
    // because another claim holds their key: whether it came back full. The
    // claim's size when it examined its bound of rows without filling up
    // (rows of blocked keys): full too, more may be due behind them.
    std::size_t picked = 0;
    // Whether it picked events with an ordering key. The claim without the
    // per-key part (claim_events' `unkeyed`) leaves those as they were.
    bool picked_keyed = false;
};

// Claims come in sizes 1, 2, 4, ... 1024, one prepared statement each (see
// the claim in queries.sql). The largest of them not above `wanted`; 0 for 0.
[[nodiscard]] constexpr std::size_t claim_size(std::size_t wanted) noexcept;
inline constexpr std::size_t largest_claim = 1024;

constexpr std::size_t claim_size(std::size_t wanted) noexcept {
    if (wanted == 0) return 0;
    std::size_t size = 1;
    while (size * 2 <= wanted && size * 2 <= largest_claim) size *= 2;
    return size;
}

}  // namespace outboxd
