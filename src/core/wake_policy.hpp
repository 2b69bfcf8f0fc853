#pragma once
// When the relay claims without being told to, and what it tells producers
// (README "Wake-up modes", sql/0008). No I/O, time only as inputs: the shell
// (src/app/relay.cpp) feeds it what happened and does what it answers; every
// claim it asks for goes through the engine's wake().
//
// Modes
//   notify  LISTEN; the relay declares itself idle for good, so every
//           producer's commit notifies.
//   auto    LISTEN; idle while little comes in (producers notify), busy
//           while events come in faster than busy_rate (producers do not
//           notify; the relay claims busy_gap after a claim that found
//           events, at once after a full one, and every busy_poll after a
//           claim that found nothing).
//   poll    no LISTEN, no declaration; a claim every poll_interval.
//   wal     no LISTEN, no declaration, no trigger: a logical replication
//           stream (src/pg/wal_listener) reports each commit that inserted
//           into the outbox. Claims every poll_interval while the stream is
//           down (startup included); a claim when it comes (back) up, since
//           what committed before its slot existed is not in the stream; and
//           then, as after a LISTEN, the transactions in progress are read
//           and watched (a commit just behind the slot's start point may not
//           be visible to that claim yet).
//           While events come in faster than busy_rate, the commits reported
//           within stream_gap of the last claim they caused share one claim
//           at its end: under load, claims of many events each instead of
//           one claim per commit (the claims' cost is the producers' too,
//           on the same database); below busy_rate every commit is claimed
//           at once.
//           When a whole rate window (100 ms) reached busy_rate, the stream
//           itself pauses (pause_stream: the replication connection closes,
//           its temporary slot with it): the server's WAL sender spends a
//           send() per message, three per streamed commit, which on a
//           database committing thousands of times a second costs it far
//           more than the claims it saves. The relay then claims on its own
//           as a busy auto relay does (busy_gap after a claim that found
//           events, busy_poll after one that found none). When the spell
//           ends (as auto's: three windows under busy_rate, or idle_after of
//           empty claims) the stream resumes (resume_stream: a new slot,
//           which waits for the transactions in progress) and the relay goes
//           on claiming until it runs, on the busy cadence while claims find
//           events and every watch_slow_interval once they have found none
//           for idle_after; then, as at any stream up, it claims from the
//           start and watches what is in progress: a commit just behind the
//           new slot's start point is not streamed and may not be visible
//           yet.
//           The WAL shows a commit a moment before the transaction is
//           visible to other sessions (its commit record is flushed before
//           the backend leaves the list of running transactions; with
//           synchronous replication, until a standby confirms). So each
//           reported commit is first checked (committed: check_visible):
//           the claim follows once it is visible, and what is not visible
//           yet is checked again every visibility_recheck (slower after
//           watch_slow_after), for at most visibility_give_up.
//
// auto: busy -> idle without losing a commit. A producer reads the
// declaration when it inserts and may commit much later. After idle_after of
// empty claims, or three rate windows in a row (100 ms each) under
// busy_rate, the relay declares itself idle and, once that is committed,
// reads the transactions in progress (declared_idle): a producer that read
// "busy" has either committed already (the claim that follows sees it, as
// any claim from the low mark would: see the claim in src/pg/queries.sql) or
// is among them. The relay watches them (every watch_interval, slower after
// watch_slow_after) and claims each time one of them ends, reaching back to
// that transaction's start (from the beginning of the outbox when its start
// is not known): under a transaction held open elsewhere, a walk from the
// beginning reads the index entries of every event delivered since it
// began. So an event whose producer raced the transition is claimed within
// watch_interval of its commit (watch_slow_interval if it committed more
// than watch_slow_after after the transition); any other event is notified
// or found by a busy claim.
//
// The same happens after every LISTEN (at startup nothing was declared; after
// a reconnect the relay may have been busy, and notifications were lost
// while it was away), with the claim at declared_idle from the beginning of
// the outbox.
//
// Self-test (notify and auto): after every LISTEN the shell notifies the
// channel from another connection. If nothing arrives within
// self_test_timeout (behind a transaction pooler LISTEN "succeeds" and
// nothing ever comes) the relay says so loudly, declares itself busy (no
// producer pays for a notification nobody hears) and claims every
// poll_interval until a notification does arrive.

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.hpp"

namespace outboxd {

// A transaction in progress when the relay declared itself idle (or its WAL
// stream came up) that may have written an event the relay has not seen
// (pg::store::transactions_in_progress).
struct xact_in_progress {
    std::string xid;
    // Whether it writes `events` (else only `deliveries`, which every claim
    // looks at whole).
    bool writes_events = true;
    // Its events are due no earlier than this (its start); nullopt: not
    // known, the claim after its end starts from the beginning of the outbox.
    std::optional<database_time> written_since;
};

enum class wake_mode { automatic, notify, poll, wal };
[[nodiscard]] wake_mode parse_wake_mode(const std::string& text);

class wake_policy {
public:
    using time = std::chrono::steady_clock::time_point;
    using ms = std::chrono::milliseconds;

    struct settings {
        wake_mode mode = wake_mode::automatic;
        ms poll_interval{500};
        ms refresh_interval{30'000};  // the declaration is renewed this often
        ms self_test_timeout{2'000};
        std::size_t busy_rate = 300;  // events per second
        ms busy_poll{2};
        ms busy_gap{5};
        ms idle_after{100};
        ms watch_interval{10};
        ms watch_slow_after{1'000};
        ms watch_slow_interval{100};
        ms stream_gap{20};
        std::chrono::microseconds visibility_recheck{500};
        ms visibility_give_up{60'000};
    };

    // What the shell does now.
    struct actions {
        bool claim = false;             // engine wake()
        bool claim_from_start = false;  // engine wake_from_start()
        std::optional<database_time> claim_since;  // engine wake_since(*claim_since)
        std::optional<bool> declare;    // declare_wake(idle = *declare)
        bool read_in_progress = false;  // transactions_in_progress(), then declared_idle()
        bool watch = false;             // still_in_progress(watched()), then watched()
        bool self_notify = false;       // NOTIFY the channel from another connection
        bool check_visible = false;     // not_yet_visible(unseen()), then visible()
        bool pause_stream = false;      // wal: stop the stream (the relay claims on its own)
        bool resume_stream = false;     // wal: stream again, from a new slot; stream_up() follows
    };

    explicit wake_policy(settings s) : s_(s) {}

    [[nodiscard]] bool listens() const noexcept {
        return s_.mode == wake_mode::automatic || s_.mode == wake_mode::notify;
    }
    [[nodiscard]] bool streams_wal() const noexcept { return s_.mode == wake_mode::wal; }

    // ---- inputs ----
    actions started(time now);                 // after the first drain began
    actions listening(time now);               // LISTEN is (again) active
    actions notified(time now);                // a notification (or a WAL commit) arrived
    actions stream_up(time now);               // wal: the replication stream runs (again); reads what is in progress
    actions stream_down(time now);             // wal: the replication stream is lost
    actions committed(const std::string& xids, time now);  // wal: the stream showed these commits
    actions visible(const std::string& remaining, time now);  // wal: what not_yet_visible() answered
    actions no_trigger(time now);              // producers' inserts notify nobody
    actions claimed(std::size_t got, bool full, time now);
    actions declared(bool ok, time now);       // a declare_wake came back
    actions declared_idle(std::vector<xact_in_progress> xacts, time now);
    actions watched(std::string remaining, time now);
    actions timer(time now);                   // at next_timer()

    // When timer() is due next; nullopt: nothing to wait for.
    [[nodiscard]] std::optional<time> next_timer() const;
    // The watched transactions' xids, comma-separated.
    [[nodiscard]] std::string in_progress() const;
    [[nodiscard]] const std::string& unseen() const noexcept { return checking_; }
    // Observers (tests, logs).
    [[nodiscard]] bool busy() const noexcept { return state_ == state::busy; }
    // Whether a claim that leases anything is followed by another within
    // busy_gap (auto, busy; wal, paused or resuming; a full claim is
    // followed at once in every mode).
    // The claim's answer to "when is the next one due" can then wait for a
    // claim that leases nothing: this one is never the last before the
    // relay waits.
    [[nodiscard]] bool claims_back_to_back() const noexcept {
        return (s_.mode == wake_mode::automatic || s_.mode == wake_mode::wal) && !polling_ &&
               (state_ == state::busy || state_ == state::resuming);
    }
    // wal: the stream is paused, and the relay claims on its own.
    [[nodiscard]] bool stream_paused() const noexcept { return streams_wal() && state_ == state::busy; }
    [[nodiscard]] bool polling() const noexcept { return polling_; }
    [[nodiscard]] bool declared_idle_now() const noexcept { return declared_idle_; }

private:
    // wal: busy is "stream paused", resuming "asked to stream again, not
    // streaming yet".
    enum class state { idle, busy, settling, watching, resuming };

    void start_busy_spell(time now);
    actions become_busy(time now);
    actions claim_after(const std::vector<xact_in_progress>& ended);
    actions settle(time now);
    void start_polling(time now);

    settings s_;
    state state_ = state::idle;
    bool declared_idle_ = false;      // what the database was last told
    bool polling_ = false;            // claims every poll_interval
    std::optional<time> poll_at_;
    std::optional<time> self_test_until_;
    std::optional<time> refresh_at_;
    std::optional<time> busy_poll_at_;
    std::optional<time> watch_at_;
    time last_found_{};               // busy: the last claim that found something
    time transition_{};               // when the relay declared itself idle
    std::vector<xact_in_progress> watching_;
    bool settle_from_start_ = false;  // the claim at declared_idle starts from the beginning
    bool watch_running_ = false;
    // events claimed in the current rate window
    time window_start_{};
    std::size_t window_count_ = 0;
    bool last_window_busy_ = false;    // the previous window reached busy_rate
    std::size_t quiet_windows_ = 0;    // windows in a row under busy_rate
    // auto: a busy relay goes idle after this many (about 300 ms under the rate)
    static constexpr std::size_t quiet_windows_to_idle = 3;
    // wal: when the stream last caused a claim; a claim held back until then
    std::optional<time> stream_claimed_;
    std::optional<time> stream_claim_at_;

    void count_claimed(std::size_t got, time now);
    [[nodiscard]] bool busy_spell_over(std::size_t got, time now) const;
    void next_busy_claim(std::size_t got, bool full, time now);
    void next_resuming_claim(std::size_t got, bool full, time now);
    void restart_rate_window(time now);
    actions wal_claimed(std::size_t got, bool full, time now);
    actions pause_stream(time now);
    actions stream_claim(time now);
    void start_check(actions& a);
    void check_soon(actions& a, time now);
    // wal: commits the stream showed that were not visible yet, by xid,
    // each with when the stream showed it (the give-up is per commit: under
    // a steady stream the list never empties)
    struct unseen_commit {
        std::string xid;
        time since;
    };
    std::vector<unseen_commit> unseen_;
    std::string checking_;               // what the running check asked about
    bool check_running_ = false;
    std::optional<time> recheck_at_;
    [[nodiscard]] bool fast_inflow() const noexcept;
};

}  // namespace outboxd
