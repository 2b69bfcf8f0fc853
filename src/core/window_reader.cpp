#include "core/window_reader.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/window_safety.hpp"

namespace outboxd {

namespace {

std::size_t running_count(const std::string& snapshot) {
    const auto last = snapshot.rfind(':');
    if (last == std::string::npos || last + 1 == snapshot.size()) return 0;
    return static_cast<std::size_t>(std::count(snapshot.begin() + static_cast<std::ptrdiff_t>(last), snapshot.end(), ',')) + 1;
}

// What an event read holds in memory, near enough.
std::size_t body_bytes(const event& e) {
    std::size_t n = sizeof(event) + e.payload.size() + e.topic.size();
    for (const auto& [name, value] : e.headers) n += name.size() + value.size();
    return n;
}

// Snapshots of one chain grow in xmax; of two with the same xmax, the one
// that saw more transactions running is the older.
bool older(const std::string& a, const std::string& b) {
    const auto xa = snapshot_xmax(a);
    const auto xb = snapshot_xmax(b);
    if (xa != xb) return xa < xb;
    return running_count(a) > running_count(b);
}

}  // namespace

std::string window_reader::oldest_a(const std::vector<taken_cursor>& cursors) {
    std::string a = cursors.front().snap_a;
    for (const auto& c : cursors) {
        if (older(c.snap_a, a)) a = c.snap_a;
    }
    return a;
}

void window_reader::hold(const std::vector<taken_cursor>& cursors) {
    if (cursors.empty()) return;
    if (holding()) {
        // A cursor inside a window restarts it (from its A): what it had
        // settled there is sent again, which only a takeover after a crash
        // can cause (a relay hands cursors over at a window boundary).
        join j{{}, oldest_a(cursors)};
        for (const auto& c : cursors) {
            epochs_[c.slot] = c.epoch;
            j.slots.push_back(c.slot);
        }
        joins_.push_back(std::move(j));
        return;
    }
    const auto& first = cursors.front();
    const bool one_position = std::all_of(cursors.begin(), cursors.end(), [&](const taken_cursor& c) {
        return c.snap_a == first.snap_a && c.snap_b == first.snap_b && c.done_below == first.done_below;
    });
    for (const auto& c : cursors) epochs_[c.slot] = c.epoch;
    if (one_position) {
        next_a_ = first.snap_a;
        if (first.snap_b) {
            resume_ = window_snapshots{first.snap_a, first.snap_b, first.done_below, first.done_below, std::nullopt};
        }
        return;
    }
    // From the oldest A, with a new window: nothing of any slot is skipped.
    next_a_ = oldest_a(cursors);
}

// The window that brings a joined group and the chain to one position:
// (their A, our A] for their slots when they are behind, (our A, their A]
// for ours when we are; then the chain goes on from the later of the two.
std::optional<window_reader::window_snapshots> window_reader::catch_up() {
    while (!joins_.empty()) {
        auto j = std::move(joins_.front());
        joins_.erase(joins_.begin());
        if (j.a == next_a_) continue;
        if (older(j.a, next_a_)) return window_snapshots{j.a, next_a_, 0, 0, std::move(j.slots)};
        std::vector<int> ours;
        for (const auto& [slot, epoch] : epochs_) {
            if (std::find(j.slots.begin(), j.slots.end(), slot) == j.slots.end()) ours.push_back(slot);
        }
        return window_snapshots{next_a_, j.a, 0, 0, std::move(ours)};
    }
    return std::nullopt;
}

std::optional<cursor_checkpoint> window_reader::shed(std::size_t n) {
    if (!idle() || !joins_.empty() || resume_ || n == 0 || n >= epochs_.size()) return std::nullopt;
    cursor_checkpoint c;
    c.snap_a = next_a_;
    while (c.slots.size() < n) {
        const auto last = std::prev(epochs_.end());
        c.slots.push_back(last->first);
        c.epochs.push_back(last->second);
        epochs_.erase(last);
    }
    written_.reset();  // the position now covers other slots
    return c;
}

std::vector<int> window_reader::slots() const {
    std::vector<int> out;
    for (const auto& [slot, epoch] : epochs_) out.push_back(slot);
    return out;
}

void window_reader::lose() {
    ++generation_;
    seq_ = std::make_unique<window_sequencer>();
    epochs_.clear();
    next_a_.clear();
    resume_.reset();
    joins_.clear();
    open_.reset();
    windows_.clear();
    events_.clear();
    slot_of_.clear();
    held_bytes_ = 0;
    written_.reset();
}

std::optional<window_read_request> window_reader::next_read(std::size_t page_size) {
    if (!holding() || reading_ || queued() >= queue_limit_ || held_bytes_ >= byte_limit_ || page_size == 0) {
        return std::nullopt;
    }
    // A read as small as the room left costs a statement for a few events
    // (a keyed drain keeps the queue nearly full: three times the reads of
    // an unkeyed one): wait until a page fits, or half the queue is free
    // (the engine reads again then: relay_engine::pull_window).
    if (queue_limit_ - queued() < std::min(page_size, queue_limit_ / 2)) return std::nullopt;
    if (!open_) {
        const auto id = seq_->open_window();
        if (resume_) {
            windows_[id] = *resume_;
            resume_.reset();
        } else if (auto c = catch_up()) {
            windows_[id] = std::move(*c);
        } else {
            windows_[id] = window_snapshots{next_a_, std::nullopt, 0, 0, std::nullopt};
        }
        open_ = id;
    }
    const auto& w = windows_.at(*open_);
    window_read_request r{w.a, w.b, w.next_id, w.slots, std::min(page_size, queue_limit_ - queued())};
    if (!r.slots && epochs_.size() < static_cast<std::size_t>(window_slots)) r.slots = slots();
    reading_ = true;
    read_generation_ = generation_;
    return r;
}

void window_reader::page_read(window_page page) {
    reading_ = false;
    if (read_generation_ != generation_ || !open_) return;  // read under cursors lost since
    auto& w = windows_.at(*open_);
    if (!w.b) w.b = std::move(page.snap_b);
    std::vector<window_item> items;
    items.reserve(page.events.size());
    std::size_t page_bytes = 0;
    for (auto& r : page.events) {
        const auto id = r.e.id;
        items.push_back({id, r.e.ordering_key, r.key_pending, r.due});
        slot_of_[id] = r.slot;
        r.e.attempt = 1;  // the first, if it is sent
        r.e.window_slot = r.slot;
        const auto bytes = body_bytes(r.e);
        page_bytes += bytes;
        held_bytes_ += bytes;
        events_[id] = std::make_shared<const event>(std::move(r.e));
        w.next_id = id + 1;
    }
    if (!items.empty()) mean_event_bytes_ = page_bytes / items.size();
    seq_->add(*open_, std::move(items));
    if (!page.full) {
        seq_->close_window(*open_);
        next_a_ = *w.b;
        open_.reset();
    }
    forget_finished();
}

void window_reader::read_failed() { reading_ = false; }

std::vector<window_reader::step> window_reader::take(std::size_t max) {
    std::vector<step> out;
    for (auto& s : seq_->take(max)) {
        out.push_back({events_.at(s.item.id), slot_of_.at(s.item.id), s.what == window_sequencer::action::park});
    }
    return out;
}

void window_reader::forget(std::int64_t id) {
    const auto it = events_.find(id);
    held_bytes_ -= std::min(held_bytes_, body_bytes(*it->second));
    events_.erase(it);
    slot_of_.erase(id);
}

void window_reader::sent_ok(std::int64_t id) {
    if (!events_.contains(id)) return;
    forget(id);
    seq_->sent_ok(id);
    forget_finished();
}

void window_reader::parking(std::int64_t id) {
    if (events_.contains(id)) seq_->parking(id);
}

void window_reader::settled(std::int64_t id) {
    if (!events_.contains(id)) return;
    forget(id);
    seq_->settled(id);
    forget_finished();
}

// Snapshots of finished windows are no longer needed: the cursor is past them.
void window_reader::forget_finished() {
    const auto p = seq_->checkpoint();
    if (!p.last_finished) return;
    windows_.erase(windows_.begin(), windows_.upper_bound(*p.last_finished));
}

std::optional<std::int64_t> window_reader::epoch_of(int slot) const {
    const auto it = epochs_.find(slot);
    if (it == epochs_.end()) return std::nullopt;
    return it->second;
}

std::optional<cursor_checkpoint> window_reader::position() const {
    if (!holding()) return std::nullopt;
    cursor_checkpoint c;
    for (const auto& [slot, epoch] : epochs_) {
        c.slots.push_back(slot);
        c.epochs.push_back(epoch);
    }
    const auto p = seq_->checkpoint();
    if (p.window) {
        const auto& w = windows_.at(*p.window);
        c.snap_a = w.a;
        c.snap_b = w.b;
        if (w.b) c.done_below = std::max(p.done_below, w.floor);
    } else if (resume_) {
        // Inside a window, not read again yet.
        c.snap_a = resume_->a;
        c.snap_b = resume_->b;
        c.done_below = resume_->floor;
    } else {
        c.snap_a = next_a_;
    }
    return c;
}

std::optional<cursor_checkpoint> window_reader::checkpoint() const {
    auto c = position();
    if (!c || c == written_) return std::nullopt;
    return c;
}

bool window_reader::idle() const noexcept {
    return queued() == 0 && in_flight() == 0 && !open_ && !reading_ && seq_->checkpoint().window == std::nullopt;
}

}  // namespace outboxd
