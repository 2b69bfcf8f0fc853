#pragma once
// Whether a commit-ordered window may be read against this server
// (docs/commit-ordered-windows.md, "Safety checks"). Pure: the store reads
// the server's side (window_safety in queries.sql) and the cursor's.
//
// A cursor's snapshots are only meaningful on the primary of the cluster
// that took them, with its xid counter at or past them. Against a standby,
// a different cluster (a restore into a new one), or a server whose counter
// is behind the cursor (a dump restored, a PITR to before the cursor's
// checkpoint), new events could look already seen and be skipped: the
// relay must stop reading and say so, never carry on.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace outboxd {

// What a cursor recorded: the highest xmax of its snapshots (A, or B while
// inside a window) and the cluster it was taken on.
struct cursor_origin {
    std::uint64_t xmax = 0;
    std::int64_t system_identifier = 0;
};

// The server now.
struct server_position {
    bool in_recovery = false;
    std::uint64_t next_xid = 0;  // xmax of a snapshot taken now
    std::int64_t system_identifier = 0;
};

enum class window_verdict {
    fine,
    standby,         // the server is in recovery: never take snapshots there
    other_cluster,   // the cursor was taken on another cluster
    xid_regression,  // the server's next xid is below the cursor's xmax
};

// Checks in that order: a standby first (nothing it says can be trusted for
// this), then the cluster's identity, then the counter. An xmax equal to the
// server's next xid is fine: no transaction has started since.
[[nodiscard]] window_verdict check_window(const cursor_origin& cursor, const server_position& server) noexcept;

// One line for the operator naming both sides' values ("" when fine).
[[nodiscard]] std::string describe(window_verdict verdict, const cursor_origin& cursor,
                                   const server_position& server);

// A window must not be read against this server: what() is describe()'s line.
struct window_unsafe : std::runtime_error {
    window_unsafe(window_verdict verdict, const std::string& line) : std::runtime_error(line), verdict(verdict) {}
    window_verdict verdict;
};

// Throws window_unsafe unless check_window says fine.
void require_window_safe(const cursor_origin& cursor, const server_position& server);

// A cursor's origin from its snapshots' text (B while inside a window) and
// the cluster it was taken on.
[[nodiscard]] cursor_origin origin_of(const std::string& snap_a, const std::optional<std::string>& snap_b,
                                      std::int64_t system_identifier);

// The bounds of a pg_snapshot's text form ("xmin:xmax:xip,..."): something
// was running in it when xmin is below xmax. Throws std::invalid_argument
// on anything else.
struct snapshot_bounds {
    std::uint64_t xmin = 0;
    std::uint64_t xmax = 0;
};
[[nodiscard]] snapshot_bounds bounds_of(const std::string& snapshot);
[[nodiscard]] inline std::uint64_t snapshot_xmax(const std::string& snapshot) { return bounds_of(snapshot).xmax; }

}  // namespace outboxd
