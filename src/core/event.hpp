#pragma once
// One claimed outbox event, as the relay holds it between claim and outcome.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace outboxd {

using header_list = std::vector<std::pair<std::string, std::string>>;

struct event {
    std::int64_t id = 0;
    std::string topic;
    std::optional<std::string> ordering_key;
    std::string payload;  // JSON text, sent as the request body unchanged
    header_list headers;  // from the row's headers jsonb object
    // attempts after this claim; also the fencing token: an outcome is only
    // recorded while the row still carries this value and our lease.
    std::int32_t attempt = 0;
    // Set when this claim is one destination's delivery of a fanned-out event
    // (sql/0002): it goes to that destination only, and `attempt` counts the
    // attempts there. Unset: the event goes to every destination its topic
    // routes to.
    std::optional<std::string> destination;
    // Set on a replayed event that died at these destinations only: it goes
    // to them (by name), not to every destination its topic routes to.
    std::vector<std::string> only_to;
    // The event's key still has deliveries waiting at some destination: it
    // must queue behind them (be fanned out), not be sent straight away.
    bool key_pending = false;
    // Set when the claimed row could not be decoded (e.g. header bytes that
    // are not UTF-8, which a SQL_ASCII database stores): the reason. Such an
    // event can never be sent; the relay moves it to dead letters.
    std::optional<std::string> undecodable;
    // How long before the claim's statement began the event was written
    // (now() - created_at, both read by the database: no clock skew between
    // hosts); unset when the claim did not say.
    std::optional<std::chrono::microseconds> age_at_claim;
    // Where the claim left the leased row (ctid, as text); see lease_ref.
    std::string tid;
    // Set on a run's follower (see the claim in queries.sql): the id of the
    // run's first event, which this one is sent after, once the events
    // between them are delivered.
    std::optional<std::int64_t> run_head;
    // Set on a run's follower, which the claim did not lease: the `until` of
    // the key hold it is sent under, as text; its outcome is fenced on that
    // hold (see `complete` in queries.sql). Empty: the row is leased.
    std::string hold;
    // Set when the event was read from a commit-ordered window (not leased):
    // the slot whose cursor fences what is written about it.
    std::optional<int> window_slot;
};

}  // namespace outboxd
