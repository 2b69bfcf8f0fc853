#pragma once
// One claim as the statements it runs: which of the two claim statements
// (deliveries of fanned-out events, and events), in which order, from where
// in the index, and what the next claim starts from. Pure logic over a
// two-method port, so it runs on the claim thread against the store and in
// tests against a script.
//
// Claim order and where a claim starts (see the claim in queries.sql):
//   - deliveries first while a backlog drains, when the last claim saw some
//     due (retries at a failed destination are older than the new events
//     that would fill every claim until the drain ends);
//   - events from the drain watermark while a backlog drains (behind the
//     last row of the previous full claim), else from the low mark (where
//     the last claim that took everything due began), else from the start;
//   - when a drain ends (a claim from the watermark comes back less than
//     full), once more from the low mark for what committed late behind the
//     watermark: its NOTIFY came and went while we were draining;
//   - deliveries after events when the event claim says some are due
//     (also after deliveries went first: some may have fallen due between
//     the two statements, and the event claim's next_due counts only what
//     is not due at its own now());
//   - deliveries in one statement for the destinations with at least as
//     many free connections as wanted, one statement each for the others;
//   - events by the claim without the per-key part while no recent claim
//     picked a keyed event (the request's unkeyed_first): a small claim's
//     cost is mostly the start-up of its plan, and that claim's plan is a
//     fraction of the full one's. When it picked keyed events (it leaves
//     them as they were), the full claim follows at once, from the same
//     place, for the rest of the size.
// Everything the next claim needs travels in the request and the outcome:
// the claim thread keeps no state of its own.

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "core/event.hpp"
#include "core/outbox_rows.hpp"
#include "core/window_reader.hpp"

namespace outboxd {

// What a window read found (relay.consume = "windows").
struct window_read_result {
    window_page page;
    bool deliveries_due = false;  // some delivery to our destinations is due now
    std::optional<std::chrono::milliseconds> next_due;  // the earliest one that is not
};

// The two claim statements (pg::store implements them over a connection).
class claim_port {
public:
    virtual ~claim_port() = default;
    // Up to `size` due events leased for `lease`; `after`: behind that
    // watermark only; else `low_mark`: at or after it only. `unkeyed`: the
    // claim without its per-key part, which leases only events without an
    // ordering key and leaves the keyed ones it picked as they were
    // (claim_result::picked_keyed).
    [[nodiscard]] virtual claim_result claim_events(std::size_t size, std::chrono::milliseconds lease,
                                                    const std::optional<claim_watermark>& after,
                                                    const std::optional<std::string>& low_mark, bool unkeyed) = 0;
    // Up to `size` due deliveries to these destinations, leased for `lease`.
    [[nodiscard]] virtual std::vector<event> claim_deliveries(std::size_t size, std::chrono::milliseconds lease,
                                                              std::span<const std::string> destinations) = 0;
    // Hands back every lease of ours but those in `keep`; returns how many.
    virtual std::size_t release_untracked(const held_leases& keep) = 0;
    // A page of a commit-ordered window (relay.consume = "windows").
    [[nodiscard]] virtual window_read_result read_window(const window_read_request& request) = 0;
};

// A destination that can take requests now, and how many.
struct open_destination {
    std::string name;
    std::size_t free = 0;  // connections free (1 while its circuit probes)
};

struct claim_request {
    std::size_t wanted = 0;  // free slots: claim at most this many
    std::chrono::milliseconds lease{0};
    // Only their deliveries are claimed, and for each at most as many as it
    // has free connections: a delivery never waits here for a connection
    // while holding a delivery slot (and its lease).
    std::vector<open_destination> open_destinations;
    bool deliveries_due = true;  // the last claim saw deliveries due
    std::optional<claim_watermark> drain_watermark;
    std::optional<std::string> low_mark;
    // A claim failed, maybe after it committed (its answer lost): first hand
    // back every lease of ours but these, the ones the relay holds.
    std::optional<held_leases> release_all_but;
    // relay.consume = "windows": events come from windows, not from the
    // event claim; `window` is the page to read, if one may be read now.
    bool windows = false;
    std::optional<window_read_request> window;
    // Events by the claim without the per-key part first (see above).
    bool unkeyed_first = false;
};

struct claim_outcome {
    std::vector<event> events;
    // Whether a statement came back full (more may be due now).
    bool full = false;
    std::optional<std::chrono::milliseconds> next_due;
    // For the next claim.
    bool deliveries_due = false;
    std::optional<claim_watermark> drain_watermark;
    std::optional<std::string> low_mark;
    // Leases handed back by request.release_all_but.
    std::size_t released = 0;
    // The page read, when the request asked for one.
    std::optional<window_page> window;
    // Whether an event claim picked events with an ordering key.
    bool picked_keyed = false;
    // When the statements began (by the relay's steady clock): leases run
    // from about then.
    std::chrono::steady_clock::time_point started{};
    std::chrono::steady_clock::time_point done{};
};

// The low mark a claim from the start of the index passes (a sweep, a key
// unblocked, an `auto` relay's claims after its idle declaration): the
// start of the index as its first field, and the check of the writers in
// progress that `low_mark` carried ("low mark|checked at|floor", see the
// claim in src/pg/queries.sql), so that the claim after it does not walk 5
// seconds back for want of one. nullopt (the claim statement from the
// start) when there is no check to keep.
[[nodiscard]] std::optional<std::string> low_mark_from_start(const std::optional<std::string>& low_mark);

// The low mark of a claim that also reaches back to `since` (events of a
// watched transaction that began then: core/wake_policy.hpp), whatever its
// low mark says: "low mark|checked at|floor|since", since in microseconds
// from the epoch, the earlier one kept when there is one already. A claim
// from the start (nullopt, or an empty first field) reaches back already.
[[nodiscard]] std::optional<std::string> low_mark_reaching(const std::optional<std::string>& low_mark,
                                                           database_time since);

// Runs one claim through `db`. Exceptions from the port propagate (the
// claim failed; the request's marks are still valid for the next one).
[[nodiscard]] claim_outcome run_claim(claim_port& db, const claim_request& request);

}  // namespace outboxd
