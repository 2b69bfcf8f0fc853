#pragma once
// What `outboxd status` says about commit-ordered windows (README
// "Consumption modes"). Pure: src/pg/status.cpp reads the cursors, the
// server and the transactions; this judges them.
//
// A windows relay that refuses its cursors (exit 9: a restore, a failover to
// a server whose xid counter is behind them, another cluster, a standby) is
// gone by the time an operator looks, and nothing of the refusal is written
// to the database. status therefore judges the cursors again, by the relay's
// own rules (core/window_safety.hpp), and names the refusal and its remedy.
// It also says what keeps the cursors' work from moving on: cursors no live
// relay holds, the oldest checkpoint, and the transactions that were
// already running when the slowest cursor last moved (a forgotten session
// or a prepared transaction keeps every row version since it began).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/window_safety.hpp"

namespace outboxd {

// One relay cursor (destination '') as the cursors table holds it.
struct window_cursor_state {
    int slot = 0;
    std::optional<std::string> owner;
    bool owner_alive = false;  // its owner's claiming session holds its lock
    std::string snap_a;
    std::optional<std::string> snap_b;
    std::int64_t system_identifier = 0;
    double checkpoint_age_seconds = 0;
};

// A transaction still running since before the slowest cursor's position.
struct holding_transaction {
    std::string xid;
    std::optional<std::string> gid;          // a prepared transaction's
    std::optional<std::string> prepared_by;  // its owner
    std::optional<std::int64_t> pid;         // a session's backend
    std::optional<std::string> state;        // e.g. "idle in transaction"
    std::optional<std::string> application_name;
    std::optional<double> age_seconds;  // since it began (prepared: since PREPARE)
};

struct windows_report {
    std::size_t cursors = 0;
    std::size_t held = 0;    // owned by a live relay
    std::size_t relays = 0;  // live relays owning cursors
    double oldest_checkpoint_seconds = 0;
    int oldest_checkpoint_slot = 0;
    window_verdict verdict = window_verdict::fine;
    std::string refusal;  // describe()'s line, "" when fine
    std::vector<holding_transaction> holding_back;
};

// nullopt: no cursors (the outbox is read by claims). The verdict is the
// first cursor's that is not fine, by the order check_window applies.
[[nodiscard]] std::optional<windows_report> judge_windows(const std::vector<window_cursor_state>& cursors,
                                                          const server_position& server);

// The report as `outboxd status` prints it: one line, and one more for a
// refusal and for the transactions holding the cursors' work back.
[[nodiscard]] std::vector<std::string> windows_lines(const windows_report& report);

// "txid 751 (pid 26200, idle in transaction, psql, 13.2s)" or
// "txid 755 (prepared 'gid' by alice, 2.0s)".
[[nodiscard]] std::string describe(const holding_transaction& t);

}  // namespace outboxd
