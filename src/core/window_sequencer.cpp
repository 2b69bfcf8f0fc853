#include "core/window_sequencer.hpp"

#include <stdexcept>

namespace outboxd {

window_sequencer::window_id window_sequencer::open_window() {
    window_state w;
    w.id = next_window_++;
    w.parks_seen_below = oldest_unrecorded_park();
    windows_.push_back(std::move(w));
    return windows_.back().id;
}

window_sequencer::window_state& window_sequencer::window_of(window_id w) {
    for (auto& s : windows_) {
        if (s.id == w) return s;
    }
    throw std::logic_error("window_sequencer: unknown or finished window");
}

const window_sequencer::window_state& window_sequencer::window_of(window_id w) const {
    for (const auto& s : windows_) {
        if (s.id == w) return s;
    }
    throw std::logic_error("window_sequencer: unknown or finished window");
}

void window_sequencer::add(window_id w, std::vector<window_item> page) {
    auto& win = window_of(w);
    if (win.closed) throw std::logic_error("window_sequencer: page added to a closed window");
    for (auto& item : page) {
        if (item.id <= win.last_id) throw std::logic_error("window_sequencer: page ids must ascend");
        win.last_id = item.id;
        win.unsettled.insert(item.id);
        ++queued_;
        queued_item q{std::move(item), w};
        if (!q.item.ordering_key) {
            ready_.emplace(std::pair{w, q.item.id}, std::move(q));
            continue;
        }
        const auto& key = *q.item.ordering_key;
        auto& waiting = waiting_[key];
        // The head of a key that is not busy is in ready_; anything else waits.
        const bool head_in_ready = !busy_keys_.contains(key) && waiting.empty() && !has_ready_head(key);
        if (head_in_ready) {
            ready_heads_.insert(key);
            ready_.emplace(std::pair{w, q.item.id}, std::move(q));
        } else {
            waiting.push_back(std::move(q));
        }
    }
}

void window_sequencer::close_window(window_id w) {
    window_of(w).closed = true;
    finish_windows();
}

bool window_sequencer::must_park(const queued_item& q) const {
    if (!q.item.due || q.item.key_pending) return true;
    if (!q.item.ordering_key) return false;
    const auto parked = parked_keys_.find(*q.item.ordering_key);
    // Parked in a write its window's read could not see.
    return parked != parked_keys_.end() && parked->second >= window_of(q.window).parks_seen_below;
}

std::uint64_t window_sequencer::park_key(const std::optional<std::string>& key) {
    const auto seq = next_park_++;
    unrecorded_parks_.insert(seq);
    if (key) parked_keys_[*key] = seq;
    return seq;
}

std::vector<window_sequencer::step> window_sequencer::take(std::size_t max) {
    std::vector<step> out;
    while (out.size() < max && !ready_.empty()) {
        auto node = ready_.extract(ready_.begin());
        auto q = std::move(node.mapped());
        --queued_;
        const auto what = must_park(q) ? action::park : action::send;
        flight f{q.window, q.item.ordering_key, std::nullopt};
        if (what == action::park) f.park_seq = park_key(q.item.ordering_key);
        in_flight_.emplace(q.item.id, f);
        if (q.item.ordering_key) {
            const auto& key = *q.item.ordering_key;
            ready_heads_.erase(key);
            if (what == action::send) {
                busy_keys_.insert(key);
            } else {
                release_key(key);  // parks of a key follow each other at once, in order
            }
        }
        out.push_back({std::move(q.item), q.window, what});
    }
    return out;
}

bool window_sequencer::has_ready_head(const std::string& key) const { return ready_heads_.contains(key); }

void window_sequencer::release_key(const std::string& key) {
    const auto it = waiting_.find(key);
    if (it == waiting_.end() || it->second.empty()) {
        if (it != waiting_.end()) waiting_.erase(it);
        return;
    }
    auto q = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) waiting_.erase(it);
    ready_heads_.insert(key);
    ready_.emplace(std::pair{q.window, q.item.id}, std::move(q));
}

void window_sequencer::sent_ok(std::int64_t id) { settle(id); }

void window_sequencer::parking(std::int64_t id) {
    auto& f = in_flight_.at(id);
    if (f.park_seq) return;
    f.park_seq = park_key(f.key);
    if (f.key && busy_keys_.erase(*f.key) > 0) release_key(*f.key);
}

void window_sequencer::settled(std::int64_t id) { settle(id); }

void window_sequencer::settle(std::int64_t id) {
    const auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    const auto f = it->second;
    in_flight_.erase(it);
    if (f.park_seq) unrecorded_parks_.erase(*f.park_seq);
    window_of(f.window).unsettled.erase(id);
    if (f.key && !f.park_seq && busy_keys_.erase(*f.key) > 0) release_key(*f.key);
    finish_windows();
    forget_seen_parks();
}

void window_sequencer::finish_windows() {
    while (!windows_.empty() && windows_.front().closed && windows_.front().unsettled.empty()) {
        last_finished_ = windows_.front().id;
        windows_.pop_front();
    }
}

std::uint64_t window_sequencer::oldest_unrecorded_park() const {
    return unrecorded_parks_.empty() ? next_park_ : *unrecorded_parks_.begin();
}

// A parked key whose park every remaining window's read saw (and every later
// read will) no longer needs remembering: key_pending speaks for it.
void window_sequencer::forget_seen_parks() {
    const auto seen_by_all = windows_.empty() ? oldest_unrecorded_park() : windows_.front().parks_seen_below;
    std::erase_if(parked_keys_, [&](const auto& kv) { return kv.second < seen_by_all; });
}

window_sequencer::position window_sequencer::checkpoint() const {
    position p;
    p.last_finished = last_finished_;
    if (windows_.empty()) return p;
    const auto& front = windows_.front();
    p.window = front.id;
    if (front.last_id == 0) return p;
    p.done_below = front.unsettled.empty() ? front.last_id + 1 : *front.unsettled.begin();
    return p;
}

}  // namespace outboxd
