#include "core/windows_report.hpp"

#include <set>

#include <fmt/format.h>

namespace outboxd {

std::optional<windows_report> judge_windows(const std::vector<window_cursor_state>& cursors,
                                            const server_position& server) {
    if (cursors.empty()) return std::nullopt;
    windows_report r;
    r.cursors = cursors.size();
    std::set<std::string> relays;
    const window_cursor_state* oldest = nullptr;
    std::optional<cursor_origin> refused;
    for (const auto& c : cursors) {
        if (c.owner && c.owner_alive) {
            ++r.held;
            relays.insert(*c.owner);
        }
        if (!oldest || c.checkpoint_age_seconds > oldest->checkpoint_age_seconds) oldest = &c;
        const auto origin = origin_of(c.snap_a, c.snap_b, c.system_identifier);
        const auto verdict = check_window(origin, server);
        if (verdict == window_verdict::fine) continue;
        // The first check that fails, as a relay would meet it; of several
        // cursors failing it, the one furthest from the server.
        if (!refused || verdict < r.verdict || (verdict == r.verdict && origin.xmax > refused->xmax)) {
            r.verdict = verdict;
            refused = origin;
        }
    }
    r.relays = relays.size();
    r.oldest_checkpoint_seconds = oldest->checkpoint_age_seconds;
    r.oldest_checkpoint_slot = oldest->slot;
    if (refused) r.refusal = describe(r.verdict, *refused, server);
    return r;
}

std::string describe(const holding_transaction& t) {
    std::vector<std::string> parts;
    if (t.gid) {
        parts.push_back(t.prepared_by ? fmt::format("prepared '{}' by {}", *t.gid, *t.prepared_by)
                                      : fmt::format("prepared '{}'", *t.gid));
    } else if (t.pid) {
        parts.push_back(fmt::format("pid {}", *t.pid));
        if (t.state) parts.push_back(*t.state);
        if (t.application_name && !t.application_name->empty()) parts.push_back(*t.application_name);
    }
    if (t.age_seconds) parts.push_back(fmt::format("{:.1f}s", *t.age_seconds));
    if (parts.empty()) return fmt::format("txid {}", t.xid);
    return fmt::format("txid {} ({})", t.xid, fmt::join(parts, ", "));
}

std::vector<std::string> windows_lines(const windows_report& r) {
    std::vector<std::string> out;
    out.push_back(fmt::format("windows: {} cursors, {} held by {} live relay{}; "
                              "oldest checkpoint {:.1f}s ago (slot {})",
                              r.cursors, r.held, r.relays, r.relays == 1 ? "" : "s", r.oldest_checkpoint_seconds,
                              r.oldest_checkpoint_slot));
    if (r.verdict != window_verdict::fine) {
        out.push_back(fmt::format("windows cannot be read here, a relay exits with code 9: {}", r.refusal));
    }
    if (!r.holding_back.empty()) {
        std::vector<std::string> each;
        each.reserve(r.holding_back.size());
        for (const auto& t : r.holding_back) each.push_back(describe(t));
        out.push_back(fmt::format("windows held back by transactions running since before the oldest cursor: {} "
                                  "(until they end, delivered events stay on disk and the relays' cursor writes "
                                  "slow down)",
                                  fmt::join(each, "; ")));
    }
    return out;
}

}  // namespace outboxd
