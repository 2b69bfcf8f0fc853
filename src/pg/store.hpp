#pragma once
// The relay's database work on one connection: claim, record outcomes,
// release, housekeeping. Every call is one short autocommit statement (or a
// short transaction of a few); none is ever held open across a delivery.
// Blocking (libpqxx): call from a thread that may block. Not thread-safe.
// Producers enqueue through pg/producer.hpp; operators' commands are in
// pg/dead_letters.hpp, pg/status.hpp and pg/migrator.hpp.
//
// Errors: pqxx::broken_connection when the connection is lost or a call
// outlived its deadline (the store drops it and reconnects on the next call); pqxx::sql_error and others for
// the rest. Both are safe to retry: every statement is fenced by lease owner
// and attempt, so repeating one changes nothing twice.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/claim_sequence.hpp"
#include "core/event.hpp"
#include "core/outbox_rows.hpp"
#include "core/outcome_batch.hpp"
#include "core/wake_policy.hpp"
#include "core/window_safety.hpp"
#include "pg/named_queries.hpp"
#include "pg/session.hpp"

namespace outboxd::pg {

// The row types the relay exchanges with the store (core/outbox_rows.hpp).
using outboxd::claim_result;
using outboxd::claim_watermark;
using outboxd::dead_delivery;
using outboxd::delivery_burial;
using outboxd::delivery_outcomes;
using outboxd::delivery_ref;
using outboxd::delivery_retry;
using outboxd::lease_ref;
using outboxd::owed_delivery;

// Where a claim of events starts, in claim order.
enum class claim_from {
    beginning,
    low_mark,         // available_at at or after a low mark
    drain_watermark,  // behind the last row of the previous full claim
};

using outboxd::claim_size;
using outboxd::largest_claim;

// The server as window_safety reads it (core/window_safety.hpp), in `tx`.
[[nodiscard]] server_position read_server_position(pqxx::transaction_base& tx, const query_book& queries);

// Stored error texts are bounded: a huge error page must not bloat the row.
inline constexpr std::size_t max_error_bytes = 2048;

class store {
public:
    // relay_session: the relay's bookkeeping (claims, outcomes, releases)
    // commits with synchronous_commit = off. Safe for at-least-once: if a
    // server crash loses the last few hundred milliseconds of such commits,
    // a claim or a "delivered" mark is undone and the event is delivered
    // again; no committed event is ever lost, because the producers' own
    // commits stay durable. It takes a WAL flush (often the largest part of
    // commit-to-delivery latency) off the delivery path. Never for enqueue.
    // The session also turns JIT off (store.cpp says why).
    // plan_once: the session uses generic plans only (plan_cache_mode =
    // force_generic_plan), for the connection that claims: both claims have
    // a literal LIMIT per prepared size, so their generic plans are the good
    // ones, and PostgreSQL would otherwise re-plan the drain-mode claim at
    // every call (its custom plans look cheaper as the watermark advances).
    // (bench/NOTES.md, "Database"). The session also turns off seq scans and
    // bitmap scans (plan_once_settings()), so a plan made while the outbox is
    // empty or small still reads its index in claim order.
    // destinations: the relay's configured destinations; its claims report
    // only their deliveries as due (nullopt: any destination's).
    // statement_timeout (0: none): the session's statement_timeout and
    // idle_in_transaction_session_timeout, and the deadline of every call
    // (see session.hpp).
    store(std::string dsn, std::string schema, std::string lease_owner, bool relay_session = false,
          bool plan_once = false, std::chrono::milliseconds statement_timeout = std::chrono::milliseconds(0),
          std::optional<std::vector<std::string>> destinations = std::nullopt);
    static constexpr std::chrono::milliseconds answer_margin = session::answer_margin;
    ~store();
    store(const store&) = delete;
    store& operator=(const store&) = delete;

    // Connects now (otherwise the first call does). Throws on failure.
    // The new session's setup is given up like a call when it is not answered.
    void connect();
    [[nodiscard]] bool connected() const noexcept;
    void disconnect() noexcept;

    // The highest applied migration; nullopt when the outbox is not installed.
    [[nodiscard]] std::optional<int> schema_version();

    // Up to claim_size(limit) due events, leased to us for `lease`, and when
    // the next one (event or delivery) falls due (same statement, so nothing
    // falls between the two). `after`: only events behind that watermark
    // (see the claim in queries.sql: for draining a backlog; a claim without
    // it must follow before events that committed late are seen). Else
    // `low_mark`: only events due at or after it (a claim from the
    // beginning must follow before late commits and unblocked keys are seen).
    // `followed` (with a low mark): another claim follows at once if this one
    // leases anything; then it does not say when the next one falls due.
    // `unkeyed`: the claim without its per-key part (claim_unkeyed in
    // queries.sql), which leases only events without an ordering key and
    // says whether it picked keyed ones (claim_result::picked_keyed).
    [[nodiscard]] claim_result claim(std::size_t limit, std::chrono::milliseconds lease,
                                     const std::optional<claim_watermark>& after = std::nullopt,
                                     const std::optional<std::string>& low_mark = std::nullopt,
                                     bool followed = false, bool unkeyed = false);
    // Up to claim_size(limit) due deliveries (event.destination set) to the
    // given destinations only, leased to us.
    [[nodiscard]] std::vector<event> claim_deliveries(std::size_t limit, std::chrono::milliseconds lease,
                                                      std::span<const std::string> destinations);

    // Each returns which of the given events were still ours (fencing).
    [[nodiscard]] std::vector<std::int64_t> complete(std::span<const lease_ref> delivered);
    [[nodiscard]] bool reschedule(lease_ref e, std::chrono::milliseconds delay, std::string_view error);
    [[nodiscard]] bool bury(lease_ref e, std::string_view error, std::optional<int> status,
                            std::string_view response_excerpt);
    // Parks a claimed event and hands its remaining destinations their own
    // delivery state: `owed` get a deliveries row each, `dead` a dead letter
    // each; with nothing owed the event is finished and deleted. One
    // transaction. False when the lease was no longer ours (nothing written).
    [[nodiscard]] bool fan_out(lease_ref e, std::span<const owed_delivery> owed, std::span<const dead_delivery> dead);
    // Records outcomes of claimed deliveries in one transaction and deletes
    // events whose last delivery this was. Returns how many outcomes were
    // fenced out (the lease was no longer ours).
    [[nodiscard]] std::size_t finish_deliveries(const delivery_outcomes& outcomes);
    // Hands back every event and delivery we still hold, due now. Returns how many.
    std::size_t release();
    // Hands back, due now and with the claim's attempt taken back, every
    // lease of ours but those in `keep` (a claim's answer was lost). On the
    // claim connection. Returns how many.
    std::size_t release_untracked(const held_leases& keep);

    // Deletes key holds that expired an hour ago or more. Returns how many.
    std::size_t forget_expired_key_holds();

    // What this outbox's message ids start with (sql/0005, "msg_<hex>_").
    [[nodiscard]] std::string message_prefix();

    // Moves deliveries whose event row is gone to dead letters (see
    // bury_orphan_deliveries in queries.sql). Returns them.
    [[nodiscard]] std::vector<delivery_ref> bury_orphan_deliveries();

    // Forgets idempotency keys older than `retention`. Returns how many.
    std::int64_t purge_idempotency_keys(std::chrono::milliseconds retention);
    // Deletes at most `batch` dead letters that died more than `retention`
    // ago, oldest first. Returns how many.
    std::size_t purge_dead_letters(std::chrono::milliseconds retention, std::size_t batch);

    // Claimed but never sent: back to the outbox due after `delay`, the
    // claim's attempt taken back. False when the lease was no longer ours.
    [[nodiscard]] bool hand_back(lease_ref e, std::chrono::milliseconds delay);
    [[nodiscard]] bool hand_back_delivery(const delivery_ref& d, std::chrono::milliseconds delay);

    // Leases bound to a live relay (sql/0006), for the connection that
    // claims: holds this lease owner's advisory lock for as long as the
    // session lives and registers it, now and again on every new connection
    // before its first claim. Call once the schema is known to be migrated.
    void bind_leases_to_session();
    // The other live relays registered with the other consume mode
    // (relays_consuming_otherwise in queries.sql; sql/0015): a claiming and
    // a windows relay side by side send events twice. Call after
    // bind_leases_to_session(), which registers ours.
    struct registered_relay {
        std::string lease_owner;
        std::string consume;
    };
    [[nodiscard]] std::vector<registered_relay> relays_consuming_otherwise();
    // Thrown by the call that registers this relay again on a new
    // connection (after a lost one) when live relays of the other mode are
    // registered: one started while this relay's session was gone and it
    // looked dead (with relay.consume = "auto", one that chose windows).
    // The connection is dropped, so the relay looks dead again; it must not
    // go on taking events.
    struct consume_mode_conflict : std::runtime_error {
        explicit consume_mode_conflict(std::vector<registered_relay> live)
            : std::runtime_error("live relays of the other consume mode"), others(std::move(live)) {}
        std::vector<registered_relay> others;
    };
    // Every other live relay registered here, with its mode ('' when older
    // than sql/0015): what relay.consume = "auto" joins. Before our own
    // registration.
    [[nodiscard]] std::vector<registered_relay> live_relays();
    struct takeover {
        std::vector<std::string> relays;  // lease owners found dead
        std::size_t leases = 0;           // events and deliveries handed back
        std::size_t cursors = 0;          // their window cursors, unowned now
    };
    // Finds the registered relays whose session is gone (their lock is
    // free), hands back their leases due now, unowns their window cursors
    // and forgets them. One short
    // transaction; with no relay dead, one indexed read of `relays`.
    [[nodiscard]] takeover take_over_dead_relays();

    // relay.consume = "windows": claim_deliveries does not wait for window
    // events (see the statement).
    void set_consume_windows(bool on) noexcept { consume_windows_ = on; }
    [[nodiscard]] const char* consume_mode() const noexcept { return consume_windows_ ? "windows" : "claims"; }

    // The relay's windows (relay.consume = "windows", store_window_relay.cpp):
    // the statements below in the engine's terms.
    // A page of a window, decoded as claimed events are, with the read's
    // answers on deliveries.
    [[nodiscard]] window_read_result read_window_page(const window_read_request& request);
    // Free window cursors ('' slots) up to our share (ceil(64 / relays
    // alive)) less the `held` we hold, taken for our lease owner.
    struct cursors_share {
        std::vector<taken_cursor> taken;
        std::size_t share = 0;
    };
    [[nodiscard]] cursors_share take_free_cursors(const std::vector<int>& held);
    // How many of the position's cursors were still ours and were written.
    [[nodiscard]] std::size_t checkpoint_cursors(const cursor_checkpoint& position);
    [[nodiscard]] std::size_t release_cursors(const cursor_checkpoint& position);
    // Events no window holds: written before `outboxd consume-setup windows`.
    [[nodiscard]] std::int64_t pre_window_events();
    // Whether `outboxd consume-setup windows` ran: new events record their
    // txid, and the window read has its index.
    [[nodiscard]] bool windows_set_up();
    // park_window_events for a batch's parks.
    std::size_t write_parks(const std::vector<outboxd::window_park>& parks);
    // park_pre_window_events (below) for parks of events written before
    // windows (core/pre_window_park.hpp); returns how many were written.
    std::size_t write_pre_window_parks(const std::vector<outboxd::window_park>& parks);

    // Publishes one circuit's state (a JSON object) on our relays row
    // (sql/0007); reset_circuits: all closed (a reload's new engine).
    void publish_circuit(const std::string& destination, const std::string& state_json);
    void reset_circuits();
    // A reload changed the relay's destinations: claims report only theirs
    // as due from now on (the claim statements are prepared again).
    void set_destinations(const std::vector<std::string>& destinations);
    // The figures of /metrics and the relay's summary (relay_stats in
    // queries.sql): the undelivered work, counted up to `cap` events plus
    // `cap` deliveries, the oldest due work's age, the schema version.
    struct stats {
        std::int64_t backlog = 0;
        double oldest_pending_seconds = 0;
        int schema_version = 0;
    };
    [[nodiscard]] stats read_stats(std::int64_t cap);

    // Makes the deliveries waiting out a backoff at `destination` due now
    // (its circuit closed). Returns how many.
    std::size_t release_waiting_deliveries(const std::string& destination);
    // Makes the delivery due soonest at `destination` due now (a probe for
    // its circuit). Returns how many (0 or 1).
    std::size_t release_one_waiting_delivery(const std::string& destination);

    // Wake-up (store_wake.cpp, sql/0008): this relay declares itself idle
    // or busy, the row counting for `valid`; forgets its declaration.
    void declare_wake(bool idle, std::chrono::milliseconds valid);
    void forget_wake();
    // The transactions in progress now that write `events` or `deliveries`
    // (see the statement); those of `xids` (comma-separated) still in
    // progress, comma-separated.
    [[nodiscard]] std::vector<xact_in_progress> transactions_in_progress();
    [[nodiscard]] std::string still_in_progress(const std::string& xids);
    // NOTIFY channel (the relay's self-test).
    void notify(const std::string& channel);
    // Whether the events table has its wake-up trigger (`outboxd wake-trigger`).
    [[nodiscard]] bool wake_trigger_installed();
    // What relay.wake = "wal" needs of the server, read before it starts.
    struct wal_readiness {
        std::string role;
        std::string wal_level;
        bool may_replicate = false;      // REPLICATION, superuser, or rds_replication
        bool publication_ready = false;  // `publication` publishes inserts into this schema's events
        long long free_slots = 0;        // max_replication_slots minus the slots there are
        long long free_senders = 0;      // max_wal_senders minus the WAL senders running
    };
    [[nodiscard]] wal_readiness wal_wake_readiness(const std::string& publication);
    // Of `xids` (32-bit, comma-separated; commits the WAL stream showed),
    // those a new snapshot does not see committed yet.
    [[nodiscard]] std::string not_yet_visible(const std::string& xids);

    // Commit-ordered windows (store_windows.cpp, sql/0009; docs/
    // commit-ordered-windows.md). Not used by the relay yet. Unprepared.
    struct window_event {
        std::int64_t id = 0;
        std::optional<std::string> ordering_key;
        int slot = 0;
        std::int64_t available_at_us = 0;  // microseconds since the epoch
        // The key has deliveries waiting (the claim's key_pending), or an
        // earlier event of it from before windows (txid NULL) is still in the
        // outbox: the event must queue behind them (be parked), not be sent.
        bool key_pending = false;
        std::string topic;
        std::string payload;  // JSON text
        std::string headers;  // JSON object text
        std::int64_t created_at_us = 0;  // microseconds since the epoch
        // A replayed event's destinations: it goes to these only (by name);
        // empty: to every destination its topic routes to.
        std::vector<std::string> destinations;
        std::int64_t age_us = 0;  // now() - created_at, by the database's clock
    };
    struct window_read {
        std::string snap_b;        // the window's end: pass it to the next chunk, then it becomes A
        std::uint64_t a_xmax = 0;  // for core/window_safety.hpp
        std::uint64_t b_xmax = 0;
        std::int64_t now_us = 0;         // the statement's now(), to judge available_at by
        std::vector<window_event> events;  // id order; max_events of them: there may be more
        // Some delivery to one of the read's destinations is due now.
        bool deliveries_due = false;
        // Milliseconds until the earliest delivery not due yet (any
        // destination; a retry or a lease running out); nullopt: none.
        std::optional<std::int64_t> next_due_ms;
    };
    // The events committed after snap_a and visible in snap_b (nullopt: a
    // snapshot taken now), ids from done_below on, of `slots` (nullopt: all),
    // at most max_events, with their bodies; events already fanned out are
    // left out. The next chunk of a window: the same A and B, done_below =
    // last id + 1. destinations: those deliveries_due is about (the relay's).
    [[nodiscard]] window_read read_window(const std::string& snap_a, const std::optional<std::string>& snap_b,
                                          std::int64_t done_below, const std::optional<std::vector<int>>& slots,
                                          std::size_t max_events, std::span<const std::string> destinations);
    struct window_event_body {
        std::int64_t id = 0;
        std::string topic;
        std::optional<std::string> ordering_key;
        std::string payload;  // JSON text
        std::string headers;  // JSON object text
        std::int64_t created_at_us = 0;
    };
    // The events of a page of a window, in id order (ids gone are left out).
    [[nodiscard]] std::vector<window_event_body> fetch_events(std::span<const std::int64_t> ids);
    struct cursor_lease {
        std::string snap_a;
        std::optional<std::string> snap_b;
        std::int64_t done_below = 0;
        std::int64_t epoch = 0;  // fences every checkpoint
        std::int64_t system_identifier = 0;
        int slot = 0;
    };
    // Takes the cursor of (destination, slot) for our lease owner (see
    // take_cursor in queries.sql; call bind_leases_to_session() first):
    // nullopt while a live relay owns it.
    [[nodiscard]] std::optional<cursor_lease> take_cursor(const std::string& destination, int slot);
    // Both false when the cursor is no longer ours at that epoch (nothing written).
    [[nodiscard]] bool checkpoint_cursor(const std::string& destination, int slot, std::int64_t epoch,
                                         const std::string& snap_a, const std::optional<std::string>& snap_b,
                                         std::int64_t done_below);
    [[nodiscard]] bool release_cursor(const std::string& destination, int slot, std::int64_t epoch);
    // The relay's cursors (destination '') of several slots in one statement
    // each, by the rules of the single-slot calls. take_cursors: a lease per
    // slot taken, in slot order (a slot a live relay owns is left out).
    // checkpoint_cursors, release_cursors: epochs[i] is the epoch of
    // slots[i]; returns how many cursors were still ours at their epoch (and
    // so written); the others were taken from us.
    [[nodiscard]] std::vector<cursor_lease> take_cursors(std::span<const int> slots);
    [[nodiscard]] std::size_t checkpoint_cursors(std::span<const int> slots, std::span<const std::int64_t> epochs,
                                                 const std::string& snap_a, const std::optional<std::string>& snap_b,
                                                 std::int64_t done_below);
    [[nodiscard]] std::size_t release_cursors(std::span<const int> slots, std::span<const std::int64_t> epochs);
    // The server's side of core/window_safety.hpp.
    [[nodiscard]] server_position window_safety();
    // relay.consume = "windows", at startup: throws window_unsafe on a
    // standby, and remembers the server's cluster. From then on the first
    // read_window on every new connection checks the cursor it reads with
    // against the server (that cluster, the server's next xid) and throws
    // window_unsafe instead of reading. take_free_cursors checks every
    // cursor it takes the same way.
    void check_window_server();
    // What a window event's outcome (or the sequencer's park) leaves owed:
    // `owed` get a deliveries row each (due no earlier than due_in from now,
    // and never before the event's available_at), `dead` a dead letter each
    // (destination empty: the whole event, a dead letter with destination
    // NULL). Nothing owed: the event is deleted.
    struct window_park {
        std::int64_t id = 0;
        std::int64_t epoch = 0;  // of the cursor ('', its slot) it was read under
        std::vector<owed_delivery> owed;
        std::vector<dead_delivery> dead;
    };
    // Writes the parks of a batch of window events in one statement
    // (park_window_events in queries.sql), fenced by each event's cursor.
    // Returns the ids written; writing the same parks again writes nothing.
    [[nodiscard]] std::vector<std::int64_t> park_window_events(std::span<const window_park> parks);
    // Events written before `outboxd consume-setup windows` and not parked
    // yet, after `after_id` in id order (at most max_events), and their parks
    // (core/pre_window_park.hpp; park_pre_window_events in queries.sql: not
    // fenced by a cursor; an event under a running lease, or of a key whose
    // hold is live, is left as it is). Returns the ids written.
    [[nodiscard]] std::vector<pre_window_event> pre_window_page(std::int64_t after_id, std::size_t max_events);
    [[nodiscard]] std::vector<std::int64_t> park_pre_window_events(std::span<const window_park> parks);
    // Deletes up to `batch` delivered window events, below every slot's
    // cursor (cleanup_window_events in queries.sql). Returns how many.
    // Skips the txids the previous calls left nothing behind in (kept here:
    // a new store reads from the start of the index once).
    std::size_t cleanup_window_events(std::size_t batch);

    [[nodiscard]] const std::string& lease_owner() const noexcept { return owner_; }
    // Before the first connection: the session goes through a transaction
    // pooler, which keeps neither prepared statements nor session settings
    // between transactions (and would hand our settings to other clients).
    void set_transaction_pooling(bool on) noexcept { transaction_pooling_ = on; }

    // The event claim of queries.sql with its size and watermark filled in,
    // the delivery claim with its size, and the settings of the session that
    // runs them (plan_once): public for the tests that check the plan
    // PostgreSQL makes of them and race them against open transactions.
    [[nodiscard]] std::string claim_sql(std::size_t size, claim_from from, bool unkeyed) const;
    [[nodiscard]] std::string claim_deliveries_sql(std::size_t size) const;
    [[nodiscard]] static std::vector<std::string> plan_once_settings();
    // What every relay session (relay_session) runs: public for the tests
    // that check the outcome statements' plans.
    [[nodiscard]] static std::vector<std::string> relay_session_settings();
    // What a session without plan_once sets around `complete` (and resets
    // after it): public for its plan's test.
    [[nodiscard]] static std::vector<std::string> complete_settings();

private:
    void set_up(pqxx::connection& c);
    void register_session(pqxx::connection& c, int tries = 10);
    // Before a claim: takes the session lock if this session does not hold it yet.
    void hold_session_lock(pqxx::connection& c);  // session settings and prepared statements
    template <typename Args>
    auto run(pqxx::transaction_base& tx, const Args& args) const;  // prepared, unless pooled
    void prepare_claims(pqxx::connection& c) const;
    void unprepare_claims(pqxx::connection& c) const;
    [[nodiscard]] server_position window_safety_now(pqxx::transaction_base& tx);

    std::string schema_;
    std::string owner_;
    bool relay_session_;
    bool plan_once_;
    std::chrono::milliseconds statement_timeout_;
    bool transaction_pooling_ = false;
    // The claim's :known_destination: the SQL that keeps other relays'
    // deliveries out of "deliveries are due".
    std::string known_destination_;
    std::vector<std::string> known_destinations_;  // the same, for statements that take them as a parameter
    bool consume_windows_ = false;
    // cleanup_window_events' `done`: a snapshot whose visible txids have no
    // delivered window event left.
    std::optional<std::string> window_cleanup_done_;
    query_book queries_;
    session session_;
    bool bound_to_session_ = false;
    bool holds_session_lock_ = false;
    bool registered_before_ = false;  // a registration that follows is after a lost connection
    // check_window_server(): the cluster the relay's cursors were checked
    // on, and whether this connection has not checked them yet (set by
    // every new connection).
    std::optional<std::int64_t> window_cluster_;
    bool window_safety_due_ = true;
};

}  // namespace outboxd::pg
