#pragma once
// Per-key order for events read from commit-ordered windows, in memory (see
// docs/windows-in-the-relay.md). No I/O, no clock: the relay opens a window
// when its read begins, adds the pages it reads, takes what may go out now,
// and reports how each event settled; the sequencer answers with what to
// send, what to park (fan out into `deliveries`), and how far the cursor may
// move.
//
// The rules
//   * One event of a key at a time: a keyed event is handed out only once
//     every earlier event of its key (earlier window, or same window and
//     lower id) has settled. Unkeyed events go out as they come.
//   * Park instead of send: an event not due yet (a delayed event), one whose
//     key had deliveries waiting when its window was read (key_pending), or
//     one whose key this relay parked in a write that its window's read
//     could not see (the write was not recorded when the read began).
//   * A key is parked from the moment one of its events is parked (a failed
//     delivery, or the rule above): its later events are parked too, behind
//     it, until a window read that began after every such park was recorded
//     (that read's key_pending speaks for the key from then on).
//   * An event settles when it is delivered everywhere, or when the write
//     that parked it is recorded.
//   * The cursor: windows finish in order; a window is finished once it is
//     closed (its last page added) and every event of it settled. Inside
//     the oldest unfinished window, done_below is the lowest unsettled id:
//     a relay resuming that window from done_below sends nothing twice that
//     settled below it.
//
// Memory is bounded by the caller: it reads the next page only while
// queued() is under its limit.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace outboxd {

// One event of a window page, as the read returns it.
struct window_item {
    std::int64_t id = 0;
    std::optional<std::string> ordering_key;
    bool key_pending = false;  // the key had deliveries waiting when the window was read
    bool due = true;           // available_at <= the read's now()
};

class window_sequencer {
public:
    using window_id = std::uint64_t;

    enum class action { send, park };
    struct step {
        window_item item;
        window_id window = 0;
        action what = action::send;
    };

    // Where the cursor may be checkpointed: every window before `window` is
    // finished; inside it, every id below done_below settled (0: none yet,
    // or `window` has not been added to). nullopt window: no window is open
    // or unfinished beyond the last finished one.
    struct position {
        std::optional<window_id> last_finished;
        std::optional<window_id> window;
        std::int64_t done_below = 0;
    };

    // A window's read begins now (before its statement is sent).
    window_id open_window();
    // A page of the window, ids ascending and above every id added before.
    void add(window_id w, std::vector<window_item> page);
    // The window's last page was added (an empty window is closed at once).
    void close_window(window_id w);

    // What may go out now, oldest first: at most `max` steps. A `send` step
    // is in flight until sent_ok() or parking(); a `park` step until
    // settled().
    [[nodiscard]] std::vector<step> take(std::size_t max);

    // Delivered to every destination: settled.
    void sent_ok(std::int64_t id);
    // A sent event is being parked (some destination failed or deferred
    // it): its key is parked from now on; it settles with settled().
    void parking(std::int64_t id);
    // The write that parked it was recorded.
    void settled(std::int64_t id);

    [[nodiscard]] position checkpoint() const;

    // Events added and not handed out yet.
    [[nodiscard]] std::size_t queued() const noexcept { return queued_; }
    // Handed out and not settled.
    [[nodiscard]] std::size_t in_flight() const noexcept { return in_flight_.size(); }
    [[nodiscard]] bool key_parked(const std::string& key) const { return parked_keys_.contains(key); }

private:
    struct window_state {
        window_id id = 0;
        bool closed = false;
        // Parks with a sequence number below this were recorded when its
        // read began: its key_pending speaks for them.
        std::uint64_t parks_seen_below = 0;
        std::set<std::int64_t> unsettled;  // added, not settled
        std::int64_t last_id = 0;
    };
    struct queued_item {
        window_item item;
        window_id window = 0;
    };
    struct flight {
        window_id window = 0;
        std::optional<std::string> key;
        std::optional<std::uint64_t> park_seq;  // set once it is being parked
    };

    window_state& window_of(window_id w);
    [[nodiscard]] const window_state& window_of(window_id w) const;
    [[nodiscard]] bool must_park(const queued_item& q) const;
    std::uint64_t park_key(const std::optional<std::string>& key);
    // The key's next event, if any, may be handed out.
    void release_key(const std::string& key);
    [[nodiscard]] bool has_ready_head(const std::string& key) const;
    void settle(std::int64_t id);
    void finish_windows();
    void forget_seen_parks();
    [[nodiscard]] std::uint64_t oldest_unrecorded_park() const;

    window_id next_window_ = 1;
    std::deque<window_state> windows_;  // unfinished, in order
    std::optional<window_id> last_finished_;

    // What may be handed out now, in (window, id) order: every queued
    // unkeyed event, and the oldest queued event of each key that has no
    // send in flight.
    std::map<std::pair<window_id, std::int64_t>, queued_item> ready_;
    // Each key's queued events that wait behind its head, in order (the
    // head itself is in ready_ unless the key is busy).
    std::unordered_map<std::string, std::deque<queued_item>> waiting_;
    // Keys with a send in flight: their next event waits.
    std::set<std::string> busy_keys_;
    // Keys whose head is in ready_.
    std::set<std::string> ready_heads_;
    std::size_t queued_ = 0;

    std::unordered_map<std::int64_t, flight> in_flight_;
    std::uint64_t next_park_ = 0;
    // Parks not yet recorded, by sequence number.
    std::set<std::uint64_t> unrecorded_parks_;
    // key -> the newest park of the key (sequence number).
    std::unordered_map<std::string, std::uint64_t> parked_keys_;
};

}  // namespace outboxd
