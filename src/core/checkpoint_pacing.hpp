#pragma once
// How often a windows relay writes its cursors' checkpoint
// (docs/windows-in-the-relay.md, "Checkpoints"). No I/O, time as input.
//
// Every checkpoint rewrites the relay's cursor rows, and while a transaction
// that began earlier is still running PostgreSQL can prune none of the
// versions those writes leave: each checkpoint, cleanup and status then
// walks all of them (measured: a checkpoint 0.35 ms at the start of a
// 5-minute transaction, 2.9 ms at its end, at one a second). So while one
// transaction stays running, checkpoints come further apart as it ages:
// every max(interval, held / 30), at most every max_interval. The row
// versions it makes grow with the logarithm of its age instead of linearly
// (about 30 + 30 ln(t / 30 s) of them after t: ~100 after 5 minutes, ~175
// after an hour, against 300 and 3,600). The cost: a relay that dies
// (kill -9, its session lost) while such a transaction runs hands over
// cursors up to held / 30 old (at most max_interval), and what it settled
// since is sent again (at least once, nothing lost). A graceful stop and a
// hand-over write the position first, as always.
//
// Seen from the relay: the oldest transaction running when its position's
// snapshot was taken is that snapshot's xmin. While checkpoints keep
// showing one xmin (below xmax: something is running), that transaction
// has been running at least since the first of them. A transaction that
// holds back vacuum without a transaction id (a long read-only snapshot,
// pg_dump) does not show there, and checkpoints stay once a second.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "core/window_safety.hpp"

namespace outboxd {

class checkpoint_pacing {
public:
    using time = std::chrono::steady_clock::time_point;
    using ms = std::chrono::milliseconds;

    static constexpr ms interval{1'000};
    static constexpr ms max_interval{60'000};
    static constexpr int age_divisor = 30;

    // Whether a checkpoint of a position whose newest snapshot is `snapshot`
    // (pg_snapshot text, "xmin:xmax:xip") is due at `now`. Ask at most once
    // an `interval`; written() after each checkpoint written.
    [[nodiscard]] bool due(const std::string& snapshot, time now);
    void written(time now) noexcept { last_written_ = now; }

    // How far apart checkpoints are now (for tests and logs).
    [[nodiscard]] ms current_interval(time now) const noexcept;
    // Whether they are further apart than `interval` now (a transaction
    // has run for more than age_divisor intervals), and its xid (xmin).
    [[nodiscard]] bool spaced_out(time now) const noexcept { return current_interval(now) > interval; }
    [[nodiscard]] std::optional<std::uint64_t> held_xmin() const noexcept { return held_xmin_; }

private:
    std::optional<std::uint64_t> held_xmin_;  // xmin seen running since held_since_
    time held_since_{};
    std::optional<time> last_written_;
};

}  // namespace outboxd
