#include "core/window_safety.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

namespace outboxd {

window_verdict check_window(const cursor_origin& cursor, const server_position& server) noexcept {
    if (server.in_recovery) return window_verdict::standby;
    if (cursor.system_identifier != server.system_identifier) return window_verdict::other_cluster;
    if (server.next_xid < cursor.xmax) return window_verdict::xid_regression;
    return window_verdict::fine;
}

std::string describe(window_verdict verdict, const cursor_origin& cursor, const server_position& server) {
    switch (verdict) {
        case window_verdict::fine:
            return "";
        case window_verdict::standby:
            return "the server is a standby (in recovery): windows are read on the primary only";
        case window_verdict::other_cluster:
            return fmt::format("the cursor was taken on cluster {}, this server is cluster {}: refusing to read "
                               "(after checking, with every relay stopped, run `outboxd cursor reset`: "
                               "every event still in the outbox is then sent again)",
                               cursor.system_identifier, server.system_identifier);
        case window_verdict::xid_regression:
            return fmt::format("xid regression: the server's next transaction id {} is below the cursor's {} "
                               "(a restore or PITR?): refusing to read (after checking, with every relay stopped, "
                               "run `outboxd cursor reset`: every event still in the outbox is then sent again)",
                               server.next_xid, cursor.xmax);
    }
    return "";
}

void require_window_safe(const cursor_origin& cursor, const server_position& server) {
    const auto verdict = check_window(cursor, server);
    if (verdict != window_verdict::fine) throw window_unsafe(verdict, describe(verdict, cursor, server));
}

cursor_origin origin_of(const std::string& snap_a, const std::optional<std::string>& snap_b,
                        std::int64_t system_identifier) {
    auto xmax = snapshot_xmax(snap_a);
    if (snap_b) xmax = std::max(xmax, snapshot_xmax(*snap_b));
    return {.xmax = xmax, .system_identifier = system_identifier};
}

namespace {

std::uint64_t number(const std::string& s, std::size_t begin, std::size_t end) {
    std::uint64_t n = 0;
    const auto [ptr, ec] = std::from_chars(s.data() + begin, s.data() + end, n);
    if (begin == end || ec != std::errc() || ptr != s.data() + end) {
        throw std::invalid_argument("not a pg_snapshot: " + s);
    }
    return n;
}

}  // namespace

snapshot_bounds bounds_of(const std::string& snapshot) {
    const auto first = snapshot.find(':');
    const auto second = first == std::string::npos ? std::string::npos : snapshot.find(':', first + 1);
    if (second == std::string::npos) throw std::invalid_argument("not a pg_snapshot: " + snapshot);
    return {.xmin = number(snapshot, 0, first), .xmax = number(snapshot, first + 1, second)};
}

}  // namespace outboxd
