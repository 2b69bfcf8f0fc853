#pragma once
// The leases a relay holds: from the claim that took them until the outcome
// written for them is in the database (however that outcome went: delivered,
// retried, dead, fanned out, handed back, or fenced out). A claim whose
// answer was lost took leases the relay never learned of; they are the
// relay's leases missing from here (see release_untracked in queries.sql).

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/event.hpp"
#include "core/outbox_rows.hpp"
#include "core/outcome_batch.hpp"

namespace outboxd {

class lease_ledger {
public:
    void claimed(const event& e) {
        if (e.destination) {
            ++deliveries_[{e.id, *e.destination}];
        } else {
            ++events_[e.id];
        }
    }

    void recorded(const outcome_batch& b) {
        for (const auto& r : b.delivered) drop_event(r.id);
        for (const auto& r : b.retries) drop_event(r.ref.id);
        for (const auto& r : b.dead) drop_event(r.ref.id);
        for (const auto& r : b.fan_outs) drop_event(r.ref.id);
        for (const auto& r : b.handed_back) drop_event(r.ref.id);
        for (const auto& r : b.deliveries.delivered) drop_delivery(r);
        for (const auto& r : b.deliveries.retries) drop_delivery(r.ref);
        for (const auto& r : b.deliveries.dead) drop_delivery(r.ref);
        for (const auto& r : b.deliveries_handed_back) drop_delivery(r.ref);
    }

    [[nodiscard]] held_leases held() const {
        held_leases out;
        out.events.reserve(events_.size());
        for (const auto& [id, n] : events_) out.events.push_back(id);
        for (const auto& [key, n] : deliveries_) {
            out.delivery_ids.push_back(key.first);
            out.delivery_destinations.push_back(key.second);
        }
        return out;
    }

    [[nodiscard]] std::size_t size() const noexcept { return events_.size() + deliveries_.size(); }

private:
    // Counted: an event claimed again (its lease expired while we were
    // slow) is held twice until both outcomes are written.
    template <typename Map, typename Key>
    static void drop(Map& m, const Key& key) {
        if (const auto it = m.find(key); it != m.end() && --it->second == 0) m.erase(it);
    }
    void drop_event(std::int64_t id) { drop(events_, id); }
    void drop_delivery(const delivery_ref& r) { drop(deliveries_, std::pair<std::int64_t, std::string>{r.id, r.destination}); }

    std::unordered_map<std::int64_t, int> events_;
    std::map<std::pair<std::int64_t, std::string>, int> deliveries_;
};

}  // namespace outboxd
