#pragma once
// How many claimed events a relay may hold, and how many must be free before
// it claims again while a backlog drains (dispatcher slots and batch). Pure.
//
// Besides one event per delivery slot, a relay may hold events claimed ahead,
// waiting their turn: that is what lets a backlog be claimed in batches of
// hundreds of rows without opening more connections (a claim's cost in
// PostgreSQL is mostly per statement). Their leases run while they wait, so
// it holds only as many as it can start within a quarter of the lease's
// slack (lease minus the longest attempt) at the rate it is delivering now:
// none at startup, none for a slow destination, at most `most_ahead_per_slot`
// per slot for a fast one. The batch is at most what is held ahead, so a
// claim starts while every delivery slot still has an event to work on.

#include <chrono>
#include <cstddef>

namespace outboxd {

inline constexpr std::size_t most_ahead_per_slot = 7;

struct claim_capacity {
    std::size_t slots = 1;  // events held at most (being sent + waiting)
    std::size_t batch = 1;  // free slots a claim waits for while draining
};

// concurrency: delivery slots; delivered_per_s: the current delivery rate;
// slack: lease - (connect_timeout + request_timeout), the longest an event
// may wait before its attempt starts; largest_claim: the claim size limit.
[[nodiscard]] claim_capacity capacity_for(std::size_t concurrency, double delivered_per_s,
                                          std::chrono::milliseconds slack, std::size_t largest_claim) noexcept;

}  // namespace outboxd
