#pragma once
// The relay's claim loop as a pure state machine: when to claim, and how
// many. No sockets, no database, no clock: the relay feeds it what happened
// and does what it answers.
//
// State
//   in_flight     events claimed and not yet finished delivering (<= slots)
//   claiming      one claim statement is running (there is never a second)
//   wanted        something may be due that we have not claimed: a wake-up
//                 arrived, a claim came back full, or a key was unblocked
//   backing_off   the last claim failed (database trouble); no claims until
//                 the relay's retry timer calls on_wake()
//   draining      the last claim came back full: a backlog is being drained
//   stopping      shutdown began: never claim again
//
// Transitions (each returns the size of the claim to start now, 0 for none)
//   on_wake                NOTIFY, sweep tick, next-due timer, reconnect,
//                          retry timer: wanted = true, backing_off = false
//   on_claimed(got, asked) claiming = false, in_flight += got;
//                          got == asked means more may be due: wanted = true
//                          and draining = true; less: draining = false
//   on_claim_failed        claiming = false, wanted = true, backing_off = true
//   on_delivery_finished   in_flight -= 1 (a slot is free)
//   on_outcomes_recorded   a delivered event with an ordering key left the
//                          table (its successor may be due now), or
//                          deliveries were written due now: wanted = true
//   on_stop                stopping = true
//   resize(slots, batch)   new limits (the relay's capacity follows its
//                          delivery rate); starts nothing by itself
// A claim starts when: !stopping && !claiming && !backing_off && wanted &&
// in_flight < slots, and while draining only once at least `batch` slots are
// free; it asks for exactly the free slots, so a relay never holds a lease it
// has no slot to work on.
// Why `batch`: a claim's cost in PostgreSQL is mostly per statement, not per
// row (a 100k drain measured 376 us per claim of 14 rows), and during a
// backlog slots free up one at a time; claiming at every free slot would
// claim a handful of rows at a time. Outside a drain a claim starts at the
// first free slot, so a new event never waits for others.

#include <cstddef>

namespace outboxd {

class dispatcher {
public:
    // batch: free slots a claim waits for while draining (1..slots).
    explicit dispatcher(std::size_t slots, std::size_t batch = 1) noexcept { resize(slots, batch); }

    // New limits, applied from the next transition on (none starts a claim
    // by itself). Events already in flight beyond new slots stay: no claim
    // starts until they are back under it.
    void resize(std::size_t slots, std::size_t batch) noexcept;

    [[nodiscard]] std::size_t on_wake() noexcept;
    [[nodiscard]] std::size_t on_claimed(std::size_t got, std::size_t asked) noexcept;
    [[nodiscard]] std::size_t on_claim_failed() noexcept;
    [[nodiscard]] std::size_t on_delivery_finished() noexcept;
    [[nodiscard]] std::size_t on_outcomes_recorded(bool more_due) noexcept;
    void on_stop() noexcept { stopping_ = true; }
    // Events handed out without a claim (read from a window earlier, held
    // back for their key until now): in_flight += n.
    void on_taken(std::size_t n) noexcept { in_flight_ += n; }

    [[nodiscard]] std::size_t in_flight() const noexcept { return in_flight_; }
    [[nodiscard]] std::size_t slots() const noexcept { return slots_; }
    [[nodiscard]] std::size_t batch() const noexcept { return batch_; }
    [[nodiscard]] bool draining() const noexcept { return draining_; }
    [[nodiscard]] bool claiming() const noexcept { return claiming_; }
    [[nodiscard]] bool stopping() const noexcept { return stopping_; }
    // Shutdown may finish: nothing in flight and no claim whose result is pending.
    [[nodiscard]] bool drained() const noexcept { return stopping_ && in_flight_ == 0 && !claiming_; }

private:
    std::size_t maybe_claim() noexcept;

    std::size_t slots_ = 1;
    std::size_t batch_ = 1;
    std::size_t in_flight_ = 0;
    bool draining_ = false;
    bool claiming_ = false;
    bool wanted_ = false;
    bool backing_off_ = false;
    bool stopping_ = false;
};

}  // namespace outboxd
