// core/windows_report: what `outboxd status` says about the window cursors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/windows_report.hpp"

using namespace outboxd;

namespace {

constexpr std::int64_t here = 7301234567890123456;
constexpr std::int64_t elsewhere = 7309999999999999999;

window_cursor_state cursor(int slot, const char* owner, bool alive, const char* snap_a, double age,
                           std::int64_t cluster = here, std::optional<std::string> snap_b = std::nullopt) {
    window_cursor_state c;
    c.slot = slot;
    if (owner) c.owner = owner;
    c.owner_alive = alive;
    c.snap_a = snap_a;
    c.snap_b = std::move(snap_b);
    c.system_identifier = cluster;
    c.checkpoint_age_seconds = age;
    return c;
}

}  // namespace

TEST_CASE("windows report: no cursors, no report (the outbox is read by claims)") {
    CHECK_FALSE(judge_windows({}, {false, 100, here}).has_value());
}

TEST_CASE("windows report: cursors held by live relays, the oldest checkpoint, no refusal") {
    const std::vector<window_cursor_state> cursors = {
        cursor(0, "relay-a", true, "90:95:91", 0.4),  cursor(1, "relay-a", true, "90:95:91", 0.4),
        cursor(2, "relay-b", true, "80:85:", 2.5),    cursor(3, "dead-relay", false, "70:75:", 9.0),
        cursor(4, nullptr, false, "70:75:", 1.0),
    };
    const auto r = judge_windows(cursors, {false, 100, here});
    REQUIRE(r.has_value());
    CHECK(r->cursors == 5);
    CHECK(r->held == 3);   // a dead owner's cursor and an unowned one are not held
    CHECK(r->relays == 2);
    CHECK(r->oldest_checkpoint_seconds == doctest::Approx(9.0));
    CHECK(r->oldest_checkpoint_slot == 3);
    CHECK(r->verdict == window_verdict::fine);
    CHECK(r->refusal.empty());
    const auto lines = windows_lines(*r);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] == "windows: 5 cursors, 3 held by 2 live relays; oldest checkpoint 9.0s ago (slot 3)");
}

TEST_CASE("windows report: the refusal a relay would exit with, the furthest cursor named") {
    SUBCASE("xid regression: of two cursors ahead, the one furthest ahead; B counts inside a window") {
        const auto r = judge_windows({cursor(0, nullptr, false, "90:95:", 1),
                                      cursor(1, nullptr, false, "90:95:", 1, here, "90:700:"),
                                      cursor(2, nullptr, false, "90:300:", 1)},
                                     {false, 200, here});
        REQUIRE(r.has_value());
        CHECK(r->verdict == window_verdict::xid_regression);
        CHECK(r->refusal.find("next transaction id 200 is below the cursor's 700") != std::string::npos);
        CHECK(r->refusal.find("outboxd cursor reset") != std::string::npos);
        const auto lines = windows_lines(*r);
        REQUIRE(lines.size() == 2);
        CHECK(lines[1].rfind("windows cannot be read here, a relay exits with code 9: xid regression", 0) == 0);
    }
    SUBCASE("another cluster is named before a regression, as the relay checks it") {
        const auto r = judge_windows(
            {cursor(0, nullptr, false, "90:700:", 1), cursor(1, nullptr, false, "1:1:", 1, elsewhere)},
            {false, 200, here});
        REQUIRE(r.has_value());
        CHECK(r->verdict == window_verdict::other_cluster);
        CHECK(r->refusal.find("taken on cluster 7309999999999999999") != std::string::npos);
    }
    SUBCASE("a standby, whatever the cursors") {
        const auto r = judge_windows({cursor(0, "relay-a", true, "90:95:", 1)}, {true, 200, here});
        REQUIRE(r.has_value());
        CHECK(r->verdict == window_verdict::standby);
        CHECK(r->refusal.find("standby") != std::string::npos);
    }
}

TEST_CASE("windows report: the transactions holding the cursors back, each named by what identifies it") {
    holding_transaction session;
    session.xid = "751";
    session.pid = 26200;
    session.state = "idle in transaction";
    session.application_name = "billing";
    session.age_seconds = 312.04;
    holding_transaction prepared;
    prepared.xid = "755";
    prepared.gid = "xa-17";
    prepared.prepared_by = "app";
    prepared.age_seconds = 7200;
    holding_transaction unseen;  // a session of a role whose details we may not see
    unseen.xid = "760";
    CHECK(describe(session) == "txid 751 (pid 26200, idle in transaction, billing, 312.0s)");
    CHECK(describe(prepared) == "txid 755 (prepared 'xa-17' by app, 7200.0s)");
    CHECK(describe(unseen) == "txid 760");

    auto r = judge_windows({cursor(0, "relay-a", true, "751:800:751,755,760", 0.2)}, {false, 900, here});
    REQUIRE(r.has_value());
    r->holding_back = {session, prepared, unseen};
    const auto lines = windows_lines(*r);
    REQUIRE(lines.size() == 2);
    CHECK(lines[1] ==
          "windows held back by transactions running since before the oldest cursor: "
          "txid 751 (pid 26200, idle in transaction, billing, 312.0s); txid 755 (prepared 'xa-17' by app, 7200.0s); "
          "txid 760 (until they end, delivered events stay on disk and the relays' cursor writes slow down)");
}
