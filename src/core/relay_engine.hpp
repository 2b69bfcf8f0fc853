#pragma once
// The relay's decisions, with no I/O: when to claim and how many, which
// claimed event goes where, what an answer means for the event, what is
// written back and when, the timers, and shutdown. Single-threaded; it is
// fed inputs (a claim came back, a destination answered, outcomes were
// written, a timer fired, a wake-up, a signal) and answers with commands
// (claim, send, write outcomes, arm a timer, finish), which the shell in
// src/app/relay.cpp carries out on the event loop, the database threads and
// the sinks, feeding their results back. Nothing the engine holds is ever
// touched by another thread: what a database job needs travels inside its
// command, what it found comes back inside its result.
//
// The life of a claimed item
//   claimed ─> ready (FIFO; held while a delivery slot is busy)
//          ─> being sent (one of `concurrency` slots)
//               ├─ straight from `events`: sent to every destination its
//               │  topic routes to that has a free connection; deferred
//               │  where it has none (handed to its own delivery row there)
//               └─ a fanned-out delivery: to its one destination, or waits
//                  in that destination's lane for a free connection while
//                  the request still fits in the lease
//          ─> settled: its outcome joins the pending batch, and the slot
//             is free (finished())
//   A request not answered within slow_request_after gives up its item's
//   delivery slot at once: a slow or stalled destination then holds only
//   its own connections (max_concurrency), never the slots other
//   destinations' events need. The item still finishes, later, as usual.
//   An item that cannot be sent after all (its lease would end before an
//   attempt could, its destination's circuit opened, shutdown began) is
//   handed back: due again, its claim's attempt taken back, since attempts
//   count requests actually sent.
//   A run (a key's consecutive events leased by one claim behind its first,
//   see the claim in queries.sql) goes out one event at a time: a follower
//   waits in `runs_` until the event before it settles, and goes to the
//   front of the ready queue if that one was delivered everywhere. Anything
//   else (a retry, a dead letter, a fan-out, a hand-back, shutdown) hands
//   the run's unsent rest back untouched, so the key's order holds and its
//   hold (which names the run's last event) goes with the last hand-back.
//
// Claims (see core/dispatcher.hpp and core/claim_capacity.hpp): one at a
// time, sized to the free slots, which include events claimed ahead of
// their slot while a backlog drains; where the claim starts (drain
// watermark, low mark) and whether deliveries are due is kept here and sent
// with each claim (core/claim_sequence.hpp). Events are claimed first by
// the claim without the per-key part while no claim picked a keyed event
// for keyed_claims_for; an outbox with keys gets the full claim at once
// (the unkeyed one that picked keyed events is followed by it) and keeps it
// while keyed events keep coming.
//
// Outcomes: one write at a time; what finishes meanwhile waits in `pending`
// and goes with the next write. While other deliveries are still in flight,
// outcomes gather for up to outcome_gather_window before a write starts
// (sooner when many wait, a keyed event's successor waits on them, or the
// relay stops); with nothing else in flight they are written at once. A write that fails is kept and written
// again after a backoff (every write is fenced and idempotent). A keyed
// event settled means its key's next event may be due: the next claim
// starts from the beginning of the index.
//
// Destinations (core/circuit_breaker.hpp): a failing destination's circuit
// opens; while open, events routed to it are handed to their own delivery
// rows there without a request (no attempt counted), claims leave its
// deliveries alone, and one real delivery probes it now and then; the first
// success closes it and its waiting deliveries are released at once.
//
// Timers: the sweep (a claim now and then for what no wake-up announced,
// and housekeeping), the takeover (every second with live leases: hand back
// the leases of relays whose database session is gone, sql/0006), the next-due timer (retries and delayed events on
// time, never further than the sweep), the claim and flush retry timers,
// the circuit probe, and the shutdown timeout. Each arm carries a generation; a timer that
// fires after it was re-armed or cancelled is ignored.
//
// Shutdown: the first signal stops claiming and hands the ready queue back
// unsent, lets what is being sent finish, writes what
// is pending, then finishes (release every lease we hold, stop). The
// shutdown timeout finishes without waiting further; a second signal exits
// at once. A reload (SIGHUP) stops the same way but keeps listening: the
// shell then starts a new engine with the new configuration.
//
// Once (`run --once`): the relay stops by itself as on a signal once it is
// drained: nothing claimed, being sent or waiting to be written, and a claim
// that began after the last outcome was recorded, from the start of the
// index and with deliveries, found nothing due (with the claims behind it,
// while they come back full: rows of blocked keys fill a claim's bound
// without being claimable). Work due later (a retry's
// backoff, a delayed event, a destination whose circuit is open) is left for
// the next run; a retry that falls due while the run is still busy is sent.
//
// Circuits are published: each change of a destination's circuit (opened,
// closed) is a circuit_changed command, so operators see it (`outboxd
// status`).

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/circuit_breaker.hpp"
#include "core/claim_sequence.hpp"
#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/db_backoff.hpp"
#include "core/delivery_outcome.hpp"
#include "core/dispatcher.hpp"
#include "core/lease_ledger.hpp"
#include "core/event.hpp"
#include "core/outcome_batch.hpp"
#include "core/rate_meter.hpp"
#include "core/relay_metrics.hpp"
#include "core/routing.hpp"
#include "core/checkpoint_pacing.hpp"
#include "core/window_reader.hpp"

namespace outboxd {

using steady_time = std::chrono::steady_clock::time_point;

// A request slower than this gives up its delivery slot (see relay_engine).
inline constexpr std::chrono::milliseconds slow_request_after{250};
// How often at most the slow requests are looked at: a request gives up its
// slot between slow_request_after and that plus this.
inline constexpr std::chrono::milliseconds slow_check_interval{25};
// Outcomes written by one statement batch at most; the rest go with the next.
inline constexpr std::size_t most_outcomes_per_write = 4096;
// While more deliveries are in flight, outcomes gather for up to this long
// (or until outcome_gather_size of them wait) before they are written: a
// write's cost in PostgreSQL is mostly per statement (a busy relay measured
// 201 us for 13 rows), and under a steady stream one write per handful of
// events doubled what each event cost the database. Nothing waits for these
// writes but the leases' end and keyed successors (written at once).
inline constexpr std::chrono::milliseconds outcome_gather_window{10};
inline constexpr std::size_t outcome_gather_size = 256;

enum class relay_timer {
    sweep,
    next_due,
    claim_retry,
    flush_retry,
    shutdown,
    circuit_probe,
    takeover,
    slow_requests,
    outcome_gather,
    checkpoint
};
inline constexpr std::size_t relay_timer_count = 10;

// What a destination made of one request (the sink's report, I/O-free).
struct send_result {
    bool transport_error = false;  // no HTTP status (DNS, connect, TLS, reset, timeout)
    unsigned status = 0;
    std::string error;
    std::string retry_after;
    std::string body_excerpt;
    std::chrono::microseconds elapsed{0};
};

// ---- commands (engine -> shell) ------------------------------------------

// Run one claim on the claim connection (run_claim) and feed back claimed()
// or claim_failed().
struct claim_command {
    claim_request request;
};
// Send one request; feed back sent(send_id, ...) once, whatever happens.
// Nothing may start after `deadline`, and the attempt ends by it.
struct send_command {
    std::uint64_t send_id = 0;
    std::size_t destination = 0;  // index into config::destinations
    std::shared_ptr<const event> e;
    header_list headers;
    steady_time deadline{};
};
// Write the batch on the outcome connection; feed back outcomes_written()
// or outcomes_failed(). The batch is not changed until then.
struct write_outcomes_command {
    std::shared_ptr<const outcome_batch> batch;
};
struct arm_timer_command {
    relay_timer timer = relay_timer::sweep;
    steady_time at{};
    std::uint64_t generation = 0;  // feed back with timer_fired()
};
struct cancel_timer_command {
    relay_timer timer = relay_timer::sweep;
};
// Housekeeping on the outcome connection, off the claim path; a failure is
// only logged (the next sweep tries again).
// dead_relays: take over the leases of relays whose session is gone; feed
// back relays_taken_over().
// window_cleanup: delete delivered window events every cursor has passed;
// feed back window_cleanup_done().
enum class housekeeping_job {
    idempotency_keys,
    key_holds,
    orphan_deliveries,
    dead_letters,
    dead_relays,
    window_cleanup
};
struct housekeeping_command {
    housekeeping_job job = housekeeping_job::key_holds;
};
// Make a destination's waiting deliveries due now (its circuit closed), or
// only the one due soonest (its circuit may probe: that one is the probe),
// on the outcome connection; then wake().
struct release_deliveries_command {
    std::string destination;
    bool just_one = false;
};
// Shutdown began: stop the wake-up sources (LISTEN).
struct stop_listening_command {};
// Close the sinks, write `last` (best effort), release every lease still
// held (after any claim still running), checkpoint `cursors` and release
// them (windows), stop the loop.
struct finish_command {
    outcome_batch last;
    std::optional<cursor_checkpoint> cursors;
};
// relay.consume = "windows": take free window cursors up to this relay's
// share, less the slots it holds (`held`; on the outcome connection, behind
// the takeover of dead relays, whose rows would count); feed back
// cursors_taken() or cursors_take_failed().
struct take_cursors_command {
    std::vector<int> held;
};
// Checkpoint these cursors at `position` and release them (a relay holding
// more than its share gives the rest back at a window boundary).
struct release_cursors_command {
    cursor_checkpoint position;
};
// Write the held cursors' position (on the outcome connection); feed back
// checkpointed() or checkpoint_failed().
struct checkpoint_command {
    cursor_checkpoint position;
};
// Exit the process now, without waiting for anything (second signal).
struct exit_now_command {};
// A destination's circuit opened or closed: publish it (the relays row).
struct circuit_changed_command {
    std::string destination;
    circuit_state state = circuit_state::closed;
    std::size_t failures = 0;  // consecutive failures when it opened
};

using relay_command = std::variant<claim_command, send_command, write_outcomes_command, arm_timer_command,
                                   cancel_timer_command, housekeeping_command, release_deliveries_command,
                                   stop_listening_command, finish_command, exit_now_command,
                                   circuit_changed_command, take_cursors_command, checkpoint_command,
                                   release_cursors_command>;

// serve: until a signal. once: until drained (see the header comment).
enum class run_mode { serve, once };

class relay_engine {
public:
    // cfg must outlive the engine. seed: the retry jitter's randomness.
    relay_engine(const config& cfg, const clock_source& clock, std::uint64_t seed);

    // ---- inputs ----
    // LISTEN is active: drain what committed before it, start the sweep.
    // message_prefix: what this outbox's webhook-ids start with.
    void start(std::string message_prefix, run_mode mode = run_mode::serve);
    // Something may be due: a notification, a reconnect.
    void wake();
    // As wake(), with a claim from the beginning of the outbox: a transaction
    // that began a while ago may just have committed (core/wake_policy.hpp).
    void wake_from_start();
    // As wake(), with a claim that reaches back at least to `since` (a
    // watched transaction that began then has ended: core/wake_policy.hpp).
    void wake_since(database_time since);
    void claimed(claim_outcome result);
    void claim_failed(const std::string& why);
    void sent(std::uint64_t send_id, send_result result);
    void outcomes_written(std::size_t fenced);
    void outcomes_failed(const std::string& why);
    void timer_fired(relay_timer timer, std::uint64_t generation);
    void signalled(int signal_number);
    // SIGHUP: stop claiming and finish what is claimed, as on a signal, but
    // keep listening; finish_command then means "ready for the new engine".
    void reload_requested();
    // A dead-letter purge came back with a full batch: more may be past retention.
    void dead_letters_purged(bool more);
    // A takeover handed back `leases` of dead relays, due now.
    void relays_taken_over(std::size_t leases);
    // relay.consume = "windows" (docs/windows-in-the-relay.md).
    // share: ceil(64 / relays alive), what this relay should hold.
    void cursors_taken(std::vector<taken_cursor> cursors, std::size_t share);
    void cursors_take_failed(const std::string& why);
    // `written` of the position's cursors were still ours and were written.
    void checkpointed(const cursor_checkpoint& position, std::size_t written);
    void checkpoint_failed(const std::string& why);
    void window_cleanup_done(bool more);

    // How often the held window cursors are checkpointed (and delivered
    // window events below every cursor deleted): at most this often, and
    // further apart while a transaction runs long (core/checkpoint_pacing).
    static constexpr std::chrono::milliseconds checkpoint_interval{1'000};
    // Events read from windows and not handed out yet, at most (per relay).
    // A page reads about window_page_bytes of bodies (by the last page's
    // mean), between 128 and window_queue_limit events: a large window read
    // in small pages costs PostgreSQL the rest of the window at every page
    // (the window is materialized before its LIMIT).
    static constexpr std::size_t window_queue_limit = 16384;
    static constexpr std::size_t window_page_bytes = std::size_t{16} << 20;

    // How often a relay with live leases looks for dead relays: a killed
    // relay's work waits about this long, not for its lease to expire.
    static constexpr std::chrono::milliseconds takeover_interval{1'000};

    // Reports deliveries, claims and wake-ups to `m` from now on (nullptr:
    // to nobody). `m` must outlive the engine or be replaced first.
    void observe(relay_metrics* m) noexcept { metrics_ = m; }

    // What to do now, in order; each input adds to it.
    [[nodiscard]] std::vector<relay_command> take_commands();

    // ---- observers (logs and tests) ----
    [[nodiscard]] std::size_t sending() const noexcept { return sending_; }
    [[nodiscard]] std::size_t ready() const noexcept { return ready_.size(); }
    [[nodiscard]] std::size_t held() const noexcept { return dispatch_.in_flight(); }
    [[nodiscard]] std::size_t busy_connections(std::size_t destination) const { return lanes_.at(destination).busy; }
    [[nodiscard]] std::size_t lane_waiting(std::size_t destination) const {
        return lanes_.at(destination).waiting.size();
    }
    [[nodiscard]] const outcome_batch& pending_outcomes() const noexcept { return pending_; }
    [[nodiscard]] circuit_state circuit(std::size_t destination) const {
        return circuits_.at(destination).state(clock_.steady());
    }
    [[nodiscard]] bool stopping() const noexcept { return dispatch_.stopping(); }
    [[nodiscard]] bool finished_running() const noexcept { return finishing_; }
    [[nodiscard]] const window_reader* windows() const noexcept { return reader_ ? &*reader_ : nullptr; }

private:
    struct ready_item {
        std::shared_ptr<const event> e;
        steady_time lease_end;
    };
    // What one destination made of one attempt.
    struct destination_result {
        std::size_t destination = 0;
        delivery_outcome outcome;
        std::optional<int> status;  // nullopt: no HTTP status
        std::string excerpt;
    };
    // An event sent straight to every destination its topic routes to: its
    // outcome is known once all of them have answered.
    struct event_in_flight {
        lease_ref ref;
        bool keyed = false;
        std::size_t waiting = 0;
        std::vector<destination_result> failures;
        // No free connection there: not attempted, handed to its own
        // delivery row to wait for one.
        std::vector<std::size_t> deferred;
        // A request of it was slow: it gave up its delivery slot.
        bool slot_given_up = false;
        std::shared_ptr<const event> e;  // for logs and metrics
        steady_time lease_end{};
    };
    // One destination's delivery of a fanned-out event (headers: only while
    // it waits in its lane).
    struct owed_item {
        std::shared_ptr<const event> e;
        delivery_ref ref;
        bool keyed = false;
        header_list headers;
        std::int64_t unix_now = 0;
        steady_time lease_end;
        bool slot_given_up = false;  // its request was slow
    };
    // Whom a send's answer is for.
    struct send_waiter {
        std::size_t destination = 0;
        std::shared_ptr<event_in_flight> direct;  // set: part of a direct event
        std::optional<owed_item> owed;            // else: a delivery
    };
    // A destination's share of this relay: requests in flight, and
    // deliveries claimed for it that wait for one of its connections.
    struct lane {
        std::size_t busy = 0;
        std::size_t limit = 1;
        std::deque<owed_item> waiting;
        // The last claim left its deliveries out: it had no free connection.
        bool passed_over = false;
        [[nodiscard]] bool full() const noexcept { return busy >= limit; }
    };

    void emit(relay_command c) { commands_.push_back(std::move(c)); }
    void arm(relay_timer t, steady_time at);
    void cancel(relay_timer t);
    [[nodiscard]] std::uint64_t& generation(relay_timer t) { return timer_generation_[static_cast<std::size_t>(t)]; }

    // claiming
    void start_claim(std::size_t n);
    [[nodiscard]] bool owes_delivery_claim() const;
    void fit_capacity();
    void pump();
    void reset_claim_marks(bool watermark_too);
    void apply_resets_after_claim();
    // `in` counts from `from`: when the statement that measured it began.
    void arm_next_due(std::chrono::milliseconds in, bool replace, steady_time from);
    void sweep();

    // delivering
    void deliver(std::shared_ptr<const event> e, steady_time lease_end);
    void deliver_owed(std::shared_ptr<const event> e, header_list headers, std::int64_t unix_now,
                      steady_time lease_end);
    void send(std::size_t destination, std::shared_ptr<const event> e, header_list headers, std::int64_t unix_now,
              steady_time lease_end, send_waiter waiter);
    void lane_freed(std::size_t destination);
    // A request to it may start now: a free connection, and its circuit allows.
    [[nodiscard]] bool can_send(std::size_t destination);
    [[nodiscard]] std::size_t free_connections(std::size_t destination);
    void judge_health(std::size_t destination, const send_result& r);
    void arm_probe();
    void hand_back(const event& e, std::chrono::milliseconds delay);
    void hand_back_to_circuit(const event& e, std::size_t destination);
    void start_waiting(std::size_t destination, owed_item item);
    [[nodiscard]] destination_result judge(std::size_t destination, std::int32_t attempt, const send_result& r);
    void log_result(const event& e, const destination_result& res, std::int32_t attempt,
                    std::chrono::microseconds elapsed) const;
    // To the metrics observer, if any.
    void report(std::string_view destination, delivery_result r, std::int32_t attempt, const event& e,
                steady_time lease_end);
    void on_event_result(event_in_flight& state, std::size_t destination, const send_result& r);
    void on_owed_result(const owed_item& item, std::size_t destination, const send_result& r);
    void settle(const event_in_flight& state);
    void record_owed(const delivery_ref& ref, bool keyed, const destination_result& res);
    void bury_unsendable(const event& e, const std::string& why);
    // A direct event settled: the next of its run, if any, goes out now
    // (true) when this one was delivered everywhere; otherwise the run's
    // unsent rest is handed back (false).
    bool next_in_run(const event& e, bool delivered);
    // Claimed followers whose run's first event this claim did not lease
    // (it changed under the claim): handed back, after the dispatcher has
    // counted them.
    void hand_back_orphans(std::vector<ready_item>& orphans);
    // Where a directly sent event's outcome goes: a lease's outcome into the
    // pending batch; a window event's into the reader (delivered) or a park.
    void record_delivered(const event& e, const lease_ref& ref);
    void record_fan_out(const event& e, fan_out_item item);
    // Window events: take what may go out now into the ready queue (at most
    // `max`); returns how many. pull_window() also counts them as held.
    std::size_t queue_window_steps(std::size_t max);
    void pull_window();
    void take_cursors();
    void write_checkpoint();
    void shed_surplus_cursors();
    void unroutable(const event& e);
    void retry_after_flush(std::chrono::milliseconds in);
    [[nodiscard]] std::vector<std::size_t> named_destinations(const std::vector<std::string>& names) const;
    // Every claimed item ends in exactly one call: its slot is free (unless
    // it gave it up already, slot_given_up).
    void finished(bool slot_given_up = false);
    // A request not answered within slow_request_after gives up its item's
    // delivery slot (see the header comment).
    void watch_slow(std::uint64_t send_id);
    void give_up_slots_of_slow_requests();

    // recording outcomes
    // gathered: the gather window is over, write whatever waits.
    void flush_outcomes(bool gathered = false);
    // Whether pending outcomes should be written now rather than gathered.
    [[nodiscard]] bool write_outcomes_now() const;

    // shutdown
    void stop_claiming(bool keep_listening);
    void check_drained();
    void maybe_finish();
    void finish();

    const config& cfg_;
    const clock_source& clock_;
    route_table routes_;
    std::string message_prefix_;
    std::vector<relay_command> commands_;
    std::mt19937_64 rng_;
    std::uniform_real_distribution<double> unit_{0.0, 1.0};
    std::array<std::uint64_t, relay_timer_count> timer_generation_{};

    // ---- claiming ----
    dispatcher dispatch_;
    rate_meter delivery_rate_;  // items finished per second, for claiming ahead
    // The longest one attempt may take at any destination (connect + request).
    std::chrono::milliseconds longest_attempt_{0};
    // Sent with the next claim, updated by its outcome (see claim_sequence.hpp).
    bool deliveries_due_ = true;
    std::optional<claim_watermark> drain_watermark_;
    std::optional<std::string> low_mark_;
    // When a claim last picked a keyed event; nullopt: never.
    std::optional<steady_time> keys_picked_at_;
    static constexpr std::chrono::seconds keyed_claims_for{1};
    // Resets asked for while a claim ran: applied after its outcome, which
    // would otherwise overwrite them (0: none, 1: low mark, 2: both).
    int reset_after_claim_ = 0;
    // A reach back (wake_since) asked for while a claim ran, likewise.
    std::optional<database_time> reach_after_claim_;
    steady_time claim_asked_{};
    std::size_t claim_wanted_ = 0;  // the running claim's size
    // Outcome writes finished when the running claim began: if more finish
    // before it returns, its snapshot may predate a retry just recorded.
    std::uint64_t flushes_at_claim_ = 0;
    db_backoff claim_backoff_;
    bool next_due_armed_ = false;
    steady_time next_due_at_{};

    // ---- delivering ----
    std::deque<ready_item> ready_;
    // Runs under way: by the id of the run's first event, its followers not
    // handed out yet, in id order.
    std::unordered_map<std::int64_t, std::deque<ready_item>> runs_;
    std::size_t sending_ = 0;
    bool pumping_ = false;
    std::vector<lane> lanes_;  // one per destination, same index
    std::vector<circuit_breaker> circuits_;  // one per destination, same index
    std::unordered_map<std::uint64_t, send_waiter> sends_;
    std::uint64_t next_send_id_ = 1;
    // Requests in send order with the time they count as slow.
    std::deque<std::pair<steady_time, std::uint64_t>> slow_watch_;
    bool slow_timer_armed_ = false;
    // Items whose slot was given up and that have not finished yet: shutdown
    // waits for them like for the others.
    std::size_t slow_in_flight_ = 0;
    relay_metrics* metrics_ = nullptr;

    // ---- recording outcomes ----
    outcome_batch pending_;
    // The soonest retry among pending_: the next-due timer is armed for it
    // once the retry is recorded (not before: an early claim finds nothing).
    std::optional<std::chrono::milliseconds> arm_due_after_flush_;
    std::shared_ptr<const outcome_batch> writing_;  // set while a write runs
    std::optional<std::chrono::milliseconds> writing_retry_in_;
    steady_time writing_since_{};  // when the write under way was issued
    std::uint64_t flushes_recorded_ = 0;
    db_backoff flush_backoff_;
    bool flush_backing_off_ = false;  // a write failed: the next waits for flush_retry
    bool gathering_ = false;          // outcome_gather is armed: pending_ waits for it

    // ---- shutdown ----
    bool finishing_ = false;
    run_mode mode_ = run_mode::serve;
    // --once: the running claim confirms the drain (began idle, from the
    // start of the index); it came back empty.
    bool confirming_ = false;
    bool confirmed_empty_ = false;
    bool claim_backing_off_ = false;  // a claim failed: none before claim_retry
    // A claim failed, perhaps after it committed: the next one first hands
    // back the leases of ours that ledger_ does not hold.
    bool claim_answer_unknown_ = false;
    lease_ledger ledger_;

    // ---- windows (relay.consume = "windows") ----
    std::optional<window_reader> reader_;
    bool taking_cursors_ = false;
    std::size_t cursor_share_ = window_slots;
    bool checkpointing_ = false;
    checkpoint_pacing checkpoint_pacing_;  // further apart while a transaction runs long
    bool checkpoints_spaced_out_ = false;  // what the log last said of it
    bool cleaning_windows_ = false;
    bool window_read_deferred_ = false;  // a read was due while the queue was full
};

}  // namespace outboxd
