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

// Snapshots of one chain grow in xmax; of two with the same xmax, the one
// that saw more transactions running is the older.
bool older(const std::string& a, const std::string& b) {
    const auto xa = snapshot_xmax(a);
    const auto xb = snapshot_xmax(b);
    if (xa != xb) return xa < xb;
    return running_count(a) > running_count(b);
}

}  // namespace

void window_reader::hold(const std::vector<taken_cursor>& cursors) {
    if (holding()) throw std::logic_error("window_reader: cursors taken while others are held");
    if (cursors.empty()) return;
    const auto& first = cursors.front();
    const bool one_position = std::all_of(cursors.begin(), cursors.end(), [&](const taken_cursor& c) {
        return c.snap_a == first.snap_a && c.snap_b == first.snap_b && c.done_below == first.done_below;
    });
    for (const auto& c : cursors) epochs_[c.slot] = c.epoch;
    if (one_position) {
        next_a_ = first.snap_a;
        if (first.snap_b) resume_ = window_snapshots{first.snap_a, first.snap_b, first.done_below, first.done_below};
        return;
    }
    // From the oldest A, with a new window: nothing of any slot is skipped.
    next_a_ = first.snap_a;
    for (const auto& c : cursors) {
        if (older(c.snap_a, next_a_)) next_a_ = c.snap_a;
    }
}

void window_reader::lose() {
    ++generation_;
    seq_ = std::make_unique<window_sequencer>();
    epochs_.clear();
    next_a_.clear();
    resume_.reset();
    open_.reset();
    windows_.clear();
    events_.clear();
    slot_of_.clear();
    written_.reset();
}

std::optional<window_read_request> window_reader::next_read(std::size_t page_size) {
    if (!holding() || reading_ || queued() >= queue_limit_ || page_size == 0) return std::nullopt;
    if (!open_) {
        const auto id = seq_->open_window();
        windows_[id] = resume_ ? *resume_ : window_snapshots{next_a_, std::nullopt, 0, 0};
        resume_.reset();
        open_ = id;
    }
    const auto& w = windows_.at(*open_);
    window_read_request r{w.a, w.b, w.next_id, std::nullopt, std::min(page_size, queue_limit_ - queued())};
    if (epochs_.size() < static_cast<std::size_t>(window_slots)) {
        r.slots.emplace();
        for (const auto& [slot, epoch] : epochs_) r.slots->push_back(slot);
    }
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
    for (auto& r : page.events) {
        const auto id = r.e.id;
        items.push_back({id, r.e.ordering_key, r.key_pending, r.due});
        slot_of_[id] = r.slot;
        r.e.attempt = 1;  // the first, if it is sent
        r.e.window_slot = r.slot;
        events_[id] = std::make_shared<const event>(std::move(r.e));
        w.next_id = id + 1;
    }
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

void window_reader::sent_ok(std::int64_t id) {
    if (events_.erase(id) == 0) return;
    slot_of_.erase(id);
    seq_->sent_ok(id);
    forget_finished();
}

void window_reader::parking(std::int64_t id) {
    if (events_.contains(id)) seq_->parking(id);
}

void window_reader::settled(std::int64_t id) {
    if (events_.erase(id) == 0) return;
    slot_of_.erase(id);
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

bool window_reader::idle() const noexcept { return queued() == 0 && in_flight() == 0 && !open_ && !reading_; }

}  // namespace outboxd
