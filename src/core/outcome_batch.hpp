#pragma once
// Outcomes waiting to be written to the outbox, gathered by the relay engine
// and written in batches by one job at a time. Kept (and written again)
// until the database has them: each write is fenced by owner and attempt,
// so writing one twice changes nothing.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/outbox_rows.hpp"

namespace outboxd {

struct reschedule_item {
    lease_ref ref;
    std::chrono::milliseconds delay{0};
    std::string error;
};

struct bury_item {
    lease_ref ref;
    std::string error;
    std::optional<int> status;
    std::string excerpt;
};

struct fan_out_item {
    lease_ref ref;
    std::vector<owed_delivery> owed;
    std::vector<dead_delivery> dead;
};

// An event read from a commit-ordered window that some destination failed,
// deferred, or that must wait (not due, its key pending): it gets its
// delivery rows and dead letters now (park_window_events), fenced by the
// cursor it was read under, not by a lease.
struct window_park {
    std::int64_t id = 0;
    std::int64_t epoch = 0;
    std::vector<owed_delivery> owed;
    std::vector<dead_delivery> dead;  // destination "": the whole event
};

struct outcome_batch {
    // Events sent straight from `events` and accepted by every destination.
    std::vector<lease_ref> delivered;
    // Whole events: no route matched, or they cannot be sent at all.
    std::vector<reschedule_item> retries;
    std::vector<bury_item> dead;
    // Events some destination failed (or that must queue behind their key).
    std::vector<fan_out_item> fan_outs;
    // One destination's delivery of a fanned-out event.
    delivery_outcomes deliveries;
    // Claimed but never sent: back to the outbox with the claim's attempt
    // taken back (the error of a handed-back item is not written).
    std::vector<reschedule_item> handed_back;
    std::vector<delivery_retry> deliveries_handed_back;
    // Window events parked (see window_park).
    std::vector<window_park> parks;
    // Something keyed finished (delivered or dead) or was fanned out: the
    // next event of that key may be due once this is recorded.
    bool unblocks_key = false;

    [[nodiscard]] bool empty() const noexcept {
        return delivered.empty() && retries.empty() && dead.empty() && fan_outs.empty() && deliveries.empty() &&
               handed_back.empty() && deliveries_handed_back.empty() && parks.empty();
    }
    [[nodiscard]] std::size_t size() const noexcept {
        return delivered.size() + retries.size() + dead.size() + fan_outs.size() + deliveries.delivered.size() +
               deliveries.retries.size() + deliveries.dead.size() + handed_back.size() + deliveries_handed_back.size() +
               parks.size();
    }
    // Whether it writes deliveries due at once (a destination that had no
    // free connection for its event, one that failed with no wait before
    // its retry).
    [[nodiscard]] bool owes_deliveries_now() const noexcept {
        return std::any_of(fan_outs.begin(), fan_outs.end(), [](const fan_out_item& f) {
            return std::any_of(f.owed.begin(), f.owed.end(),
                               [](const owed_delivery& o) { return o.due_in <= std::chrono::milliseconds(0); });
        });
    }
    // Moves up to `n` outcomes, from the front, into a batch of their own
    // (a write of a bounded size); the rest stay. Both keep unblocks_key.
    [[nodiscard]] outcome_batch take_front(std::size_t n) {
        outcome_batch front;
        front.unblocks_key = unblocks_key;
        auto take = [&n](auto& to, auto& from) {
            const auto k = std::min(n, from.size());
            std::move(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(k), std::back_inserter(to));
            from.erase(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(k));
            n -= k;
        };
        take(front.delivered, delivered);
        take(front.retries, retries);
        take(front.dead, dead);
        take(front.fan_outs, fan_outs);
        take(front.deliveries.delivered, deliveries.delivered);
        take(front.deliveries.retries, deliveries.retries);
        take(front.deliveries.dead, deliveries.dead);
        take(front.handed_back, handed_back);
        take(front.deliveries_handed_back, deliveries_handed_back);
        take(front.parks, parks);
        return front;
    }
    void append(outcome_batch&& other) {
        auto move_all = [](auto& to, auto& from) { std::move(from.begin(), from.end(), std::back_inserter(to)); };
        move_all(delivered, other.delivered);
        move_all(retries, other.retries);
        move_all(dead, other.dead);
        move_all(fan_outs, other.fan_outs);
        move_all(deliveries.delivered, other.deliveries.delivered);
        move_all(deliveries.retries, other.deliveries.retries);
        move_all(deliveries.dead, other.deliveries.dead);
        move_all(handed_back, other.handed_back);
        move_all(deliveries_handed_back, other.deliveries_handed_back);
        move_all(parks, other.parks);
        unblocks_key = unblocks_key || other.unblocks_key;
    }
};

}  // namespace outboxd
