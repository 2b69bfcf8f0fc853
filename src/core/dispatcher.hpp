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
//   stopping      shutdown began: never claim again
//
// Transitions (each returns the size of the claim to start now, 0 for none)
//   on_wake                NOTIFY, sweep tick, next-due timer, reconnect,
//                          retry timer: wanted = true, backing_off = false
//   on_claimed(got, asked) claiming = false, in_flight += got;
//                          got == asked means more may be due: wanted = true
//   on_claim_failed        claiming = false, wanted = true, backing_off = true
//   on_delivery_finished   in_flight -= 1 (a slot is free)
//   on_outcomes_recorded   a delivered event with an ordering key left the
//                          table: its successor may be due now, wanted = true
//   on_stop                stopping = true
// A claim starts when: !stopping && !claiming && !backing_off && wanted &&
// in_flight < slots; it asks for exactly the free slots, so a relay never
// holds a lease it has no slot to work on.

#include <cstddef>

namespace outboxd {

class dispatcher {
public:
    explicit dispatcher(std::size_t slots) noexcept : slots_(slots == 0 ? 1 : slots) {}

    [[nodiscard]] std::size_t on_wake() noexcept;
    [[nodiscard]] std::size_t on_claimed(std::size_t got, std::size_t asked) noexcept;
    [[nodiscard]] std::size_t on_claim_failed() noexcept;
    [[nodiscard]] std::size_t on_delivery_finished() noexcept;
    [[nodiscard]] std::size_t on_outcomes_recorded(bool unblocked_keys) noexcept;
    void on_stop() noexcept { stopping_ = true; }

    [[nodiscard]] std::size_t in_flight() const noexcept { return in_flight_; }
    [[nodiscard]] std::size_t slots() const noexcept { return slots_; }
    [[nodiscard]] bool claiming() const noexcept { return claiming_; }
    [[nodiscard]] bool stopping() const noexcept { return stopping_; }
    // Shutdown may finish: nothing in flight and no claim whose result is pending.
    [[nodiscard]] bool drained() const noexcept { return stopping_ && in_flight_ == 0 && !claiming_; }

private:
    std::size_t maybe_claim() noexcept;

    std::size_t slots_;
    std::size_t in_flight_ = 0;
    bool claiming_ = false;
    bool wanted_ = false;
    bool backing_off_ = false;
    bool stopping_ = false;
};

}  // namespace outboxd
