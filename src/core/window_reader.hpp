#pragma once
// A relay's reading of commit-ordered windows, with no I/O (docs/
// windows-in-the-relay.md, step 3): which slots' cursors it holds and at
// which epochs, the chain of windows it reads (each read's A is the last
// window's B), the pages in flight, the events read and not settled yet
// (through core/window_sequencer, which keeps per-key order), and what the
// cursors may be checkpointed at. The relay engine asks it for the next
// read, feeds it the pages, takes what may go out, reports how each event
// settled, and writes its checkpoints.
//
// Positions. A cursor says: every event of its slot visible in snap_a is
// done; while a window (snap_a, snap_b] is being worked through, so is
// every event of it below done_below. The relay reads one window for all
// the slots it holds, so it holds them at one position: when the cursors it
// takes are not all at the same one (several relays held them before), it
// starts from the oldest snap_a with a fresh window. Events the others had
// already settled are then sent again, which at-least-once allows; nothing
// is skipped.
//
// Reads. One at a time; the next page of a window (a page came back full)
// starts behind its last id with the same snapshots; a window ends with a
// page that is not full, and the next one starts at its B. No read while
// the events read and not handed out reach queue_limit (memory is bounded;
// the database keeps the rest). A failed read is simply asked again.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/event.hpp"
#include "core/window_sequencer.hpp"

namespace outboxd {

// The number of slots the outbox is split into (event_slot(), sql/0009).
inline constexpr int window_slots = 64;

// A cursor the relay took (destination '' serves every destination).
struct taken_cursor {
    int slot = 0;
    std::string snap_a;
    std::optional<std::string> snap_b;
    std::int64_t done_below = 0;
    std::int64_t epoch = 0;
};

struct window_read_request {
    std::string snap_a;
    std::optional<std::string> snap_b;  // nullopt: a new window, B taken by the read
    std::int64_t done_below = 0;        // ids from here on
    std::optional<std::vector<int>> slots;  // nullopt: every slot
    std::size_t limit = 0;
};

// One event of a page, as read.
struct window_event_read {
    event e;  // id, topic, key, payload, headers, only_to, age_at_claim; attempt 0
    int slot = 0;
    bool key_pending = false;
    bool due = true;  // available_at <= the read's now()
};

struct window_page {
    std::string snap_b;
    std::vector<window_event_read> events;  // id order
    bool full = false;                      // as many as asked: the window goes on
};

// What to write into the cursors of `slots` (each at its own epoch).
struct cursor_checkpoint {
    std::vector<int> slots;
    std::vector<std::int64_t> epochs;
    std::string snap_a;
    std::optional<std::string> snap_b;
    std::int64_t done_below = 0;
    friend bool operator==(const cursor_checkpoint&, const cursor_checkpoint&) = default;
};

class window_reader {
public:
    // queue_limit: events read and not handed out, at most; byte_limit: the
    // bodies (payload and headers) of the events read and not settled.
    explicit window_reader(std::size_t queue_limit, std::size_t byte_limit = std::size_t{32} << 20)
        : queue_limit_(queue_limit), byte_limit_(byte_limit) {}

    // The cursors taken. Taken while others are held, they join the chain
    // after the window being read: a catch-up window first brings the side
    // that is behind (their slots, or ours) to where the other stands, so
    // that neither sends anything again; then one chain reads them all.
    void hold(const std::vector<taken_cursor>& cursors);
    // Gives up `n` of the held cursors, only while idle() with no catch-up
    // pending (a window boundary: nothing of theirs is read and unsettled):
    // their position, to checkpoint and release. nullopt: not now.
    [[nodiscard]] std::optional<cursor_checkpoint> shed(std::size_t n);
    // The cursors are no longer ours (a checkpoint was fenced out): forget
    // them and everything read under them; outcomes that still come in for
    // those events are ignored, and nothing more is read until hold().
    void lose();
    [[nodiscard]] bool holding() const noexcept { return !epochs_.empty(); }
    [[nodiscard]] std::size_t slots_held() const noexcept { return epochs_.size(); }

    // The next read, if one may start now (none running, cursors held, room
    // in the queue for a page or for half the queue, and under the byte
    // limit); it is running from now until page_read or read_failed.
    [[nodiscard]] std::optional<window_read_request> next_read(std::size_t page_size);
    void page_read(window_page page);
    void read_failed();
    [[nodiscard]] bool reading() const noexcept { return reading_; }

    struct step {
        std::shared_ptr<const event> e;
        int slot = 0;
        bool park = false;  // park it (fan it out into `deliveries`) instead of sending it
    };
    // What may go out now, oldest first, at most `max`.
    [[nodiscard]] std::vector<step> take(std::size_t max);
    // How each event handed out settled (see core/window_sequencer.hpp);
    // ids not (or no longer) handed out are ignored.
    void sent_ok(std::int64_t id);
    void parking(std::int64_t id);
    void settled(std::int64_t id);

    // The epoch of the cursor an event read under `slot` is fenced by.
    [[nodiscard]] std::optional<std::int64_t> epoch_of(int slot) const;
    // Where the held cursors may be checkpointed now; nullopt when nothing
    // moved since the last checkpoint_written().
    [[nodiscard]] std::optional<cursor_checkpoint> checkpoint() const;
    void checkpoint_written(const cursor_checkpoint& c) { written_ = c; }
    // Every held cursor at its current position, whether it moved or not
    // (to hand the cursors over at shutdown).
    [[nodiscard]] std::optional<cursor_checkpoint> position() const;

    // Read and not handed out / handed out and not settled.
    [[nodiscard]] std::size_t queued() const noexcept { return seq_->queued(); }
    [[nodiscard]] std::size_t in_flight() const noexcept { return seq_->in_flight(); }
    // Nothing read is waiting or unsettled, and the last window read ended.
    [[nodiscard]] bool idle() const noexcept;
    // The bodies of the events read and not settled, and the mean body of
    // the last page (0 before any): a page's size can follow it.
    [[nodiscard]] std::size_t held_bytes() const noexcept { return held_bytes_; }
    [[nodiscard]] std::size_t mean_event_bytes() const noexcept { return mean_event_bytes_; }
    [[nodiscard]] std::vector<int> slots() const;

private:
    struct window_snapshots {
        std::string a;
        std::optional<std::string> b;
        std::int64_t next_id = 0;  // the next page starts here
        std::int64_t floor = 0;    // a resumed window: settled below this before
        std::optional<std::vector<int>> slots;  // a catch-up window: these only
    };
    // Cursors taken while others were held, waiting for their catch-up.
    struct join {
        std::vector<int> slots;
        std::string a;
    };
    [[nodiscard]] static std::string oldest_a(const std::vector<taken_cursor>& cursors);
    [[nodiscard]] std::optional<window_snapshots> catch_up();
    void forget_finished();

    void forget(std::int64_t id);

    std::size_t queue_limit_;
    std::size_t byte_limit_;
    std::size_t held_bytes_ = 0;
    std::size_t mean_event_bytes_ = 0;
    std::unique_ptr<window_sequencer> seq_ = std::make_unique<window_sequencer>();
    std::map<int, std::int64_t> epochs_;  // slot -> epoch
    // Where the next new window starts, and the resume point of the first
    // one after hold() (a window the cursors were inside of).
    std::string next_a_;
    std::optional<window_snapshots> resume_;
    std::vector<join> joins_;
    // The window being read (its last page was full), if any.
    std::optional<window_sequencer::window_id> open_;
    std::map<window_sequencer::window_id, window_snapshots> windows_;
    bool reading_ = false;
    // lose() makes a read still running when it came stale.
    std::uint64_t generation_ = 0;
    std::uint64_t read_generation_ = 0;
    std::unordered_map<std::int64_t, std::shared_ptr<const event>> events_;  // read, not settled
    std::unordered_map<std::int64_t, int> slot_of_;
    std::optional<cursor_checkpoint> written_;
};

}  // namespace outboxd
