#include "core/wake_policy.hpp"

#include <doctest/doctest.h>

#include <chrono>

using outboxd::database_time;
using outboxd::wake_mode;
using outboxd::wake_policy;
using outboxd::xact_in_progress;
using namespace std::chrono_literals;

namespace {

// Writers of events whose starts the relay cannot see.
std::vector<xact_in_progress> starts_unknown(std::initializer_list<const char*> xids) {
    std::vector<xact_in_progress> out;
    for (const auto* x : xids) out.push_back({x, true, std::nullopt});
    return out;
}

wake_policy::settings auto_settings() {
    wake_policy::settings s;
    s.mode = wake_mode::automatic;
    return s;
}

const wake_policy::time t0{};

// Started and listening, declared idle with nothing in progress.
wake_policy idle_relay() {
    wake_policy w(auto_settings());
    (void)w.started(t0);
    (void)w.listening(t0);
    (void)w.declared_idle({}, t0);
    (void)w.notified(t0);  // the self-test came back
    return w;
}

}  // namespace

TEST_CASE("wake policy: LISTEN declares the relay idle, then reads what is in progress and watches it") {
    wake_policy w(auto_settings());
    (void)w.started(t0);
    const auto a = w.listening(t0);
    CHECK(a.self_notify);
    REQUIRE(a.declare);
    CHECK(*a.declare);
    CHECK(a.read_in_progress);
    const auto b = w.declared_idle(starts_unknown({"101", "102"}), t0 + 1ms);
    CHECK(b.claim_from_start);
    REQUIRE(w.next_timer());
    CHECK(*w.next_timer() == t0 + 1ms + 10ms);
    const auto c = w.timer(t0 + 11ms);
    CHECK(c.watch);
    CHECK(w.in_progress() == "101,102");
    // Nothing ended: no claim; one ended: a claim from the start.
    CHECK_FALSE(w.watched("101,102", t0 + 12ms).claim_from_start);
    (void)w.timer(t0 + 22ms);
    CHECK(w.watched("102", t0 + 23ms).claim_from_start);
    (void)w.timer(t0 + 33ms);
    CHECK(w.watched("", t0 + 34ms).claim_from_start);
    CHECK(w.in_progress().empty());
}

TEST_CASE("wake policy: after a busy spell, the claims at the transition and at a watched writer's end reach back "
          "only to that writer's start") {
    // Busy claims' low marks cover what committed while the relay was busy;
    // a writer still in progress at the transition may have events due from
    // its start. A walk from the beginning of the outbox would read, under a
    // transaction held open elsewhere, every event delivered since it began.
    auto w = idle_relay();
    (void)w.claimed(40, false, t0 + 1ms);  // busy
    REQUIRE(w.busy());
    auto a = w.claimed(0, false, t0 + 200ms);  // settling
    REQUIRE(a.read_in_progress);
    const database_time early{std::chrono::seconds(1'000)};
    const database_time late{std::chrono::seconds(2'000)};
    a = w.declared_idle({{"7", true, late}, {"8", true, early}, {"9", false, std::nullopt}, {"10", true, std::nullopt}},
                        t0 + 201ms);
    CHECK(a.claim);
    CHECK_FALSE(a.claim_from_start);
    CHECK_FALSE(a.claim_since);
    CHECK(w.in_progress() == "7,8,9,10");
    // 9 wrote only deliveries, which every claim reads whole: a plain claim.
    REQUIRE(w.timer(t0 + 211ms).watch);
    a = w.watched("7,8,10", t0 + 212ms);
    CHECK(a.claim);
    CHECK_FALSE(a.claim_from_start);
    CHECK_FALSE(a.claim_since);
    // 7 and 8 ended together: back to the earlier start of the two.
    REQUIRE(w.timer(t0 + 222ms).watch);
    a = w.watched("10", t0 + 223ms);
    CHECK_FALSE(a.claim_from_start);
    REQUIRE(a.claim_since);
    CHECK(*a.claim_since == early);
    // 10's start is not known: from the beginning.
    REQUIRE(w.timer(t0 + 233ms).watch);
    a = w.watched("", t0 + 234ms);
    CHECK(a.claim_from_start);
    CHECK(w.in_progress().empty());
    CHECK_FALSE(w.timer(t0 + 244ms).watch);
}

TEST_CASE("wake policy: a watched writer that ends while the relay is busy again is reached back for at its next "
          "transition") {
    // The busy claims look back at most 5 s (their low marks): a writer that
    // read "busy" before the first transition and commits during the next
    // busy spell would otherwise wait for the sweep.
    auto w = idle_relay();
    const database_time early{std::chrono::seconds(1'000)};
    (void)w.claimed(40, false, t0 + 1ms);
    (void)w.claimed(0, false, t0 + 200ms);
    (void)w.declared_idle({{"7", true, early}, {"8", true, early}}, t0 + 201ms);
    (void)w.claimed(40, false, t0 + 300ms);  // busy again
    REQUIRE(w.busy());
    REQUIRE(w.claimed(0, false, t0 + 500ms).read_in_progress);
    // 8 is still in progress, 7 ended meanwhile.
    const auto a = w.declared_idle({{"8", true, early}}, t0 + 501ms);
    CHECK_FALSE(a.claim_from_start);
    REQUIRE(a.claim_since);
    CHECK(*a.claim_since == early);
    CHECK(w.in_progress() == "8");
}

TEST_CASE("wake policy: a busy relay declares itself busy and claims back to back, busy_gap apart") {
    auto w = idle_relay();
    CHECK_FALSE(w.claims_back_to_back());
    CHECK_FALSE(w.claimed(10, false, t0 + 1ms).declare);  // 10 in 100 ms: under 300/s
    const auto a = w.claimed(25, false, t0 + 2ms);      // 35: over
    REQUIRE(a.declare);
    CHECK_FALSE(*a.declare);
    CHECK(a.claim);
    CHECK(w.busy());
    // Every claim that finds something is followed by another (the claims
    // then leave "when is the next one due" to one that finds nothing).
    CHECK(w.claims_back_to_back());
    // Found some: again busy_gap later (claims of more events each, fewer
    // of them); full: the engine goes on by itself, at once.
    CHECK_FALSE(w.claimed(3, false, t0 + 3ms).claim);
    REQUIRE(w.next_timer());
    CHECK(*w.next_timer() == t0 + 3ms + 5ms);
    CHECK(w.timer(t0 + 8ms).claim);
    CHECK_FALSE(w.claimed(8, true, t0 + 9ms).claim);
    // Found nothing: again after busy_poll, until idle_after has passed.
    const auto b = w.claimed(0, false, t0 + 10ms);
    CHECK_FALSE(b.claim);
    CHECK(*w.next_timer() == t0 + 12ms);
    CHECK(w.timer(t0 + 12ms).claim);
    CHECK_FALSE(w.claimed(0, false, t0 + 108ms).declare);  // 99 ms since the last that found some
    const auto c = w.claimed(0, false, t0 + 109ms);
    REQUIRE(c.declare);
    CHECK(*c.declare);
    CHECK(c.read_in_progress);
    CHECK_FALSE(w.busy());
    CHECK_FALSE(w.claims_back_to_back());
}

TEST_CASE("wake policy: a busy relay goes idle when the inflow stays under busy_rate, though every claim finds some") {
    // A burst makes the relay busy; then 200 events a second, one every
    // 5 ms: each busy claim finds one, so claims never come up empty for
    // idle_after. Busy, each event would wait for the next claim (up to
    // busy_gap); idle, it is claimed at its notification.
    auto w = idle_relay();
    (void)w.claimed(40, false, t0 + 1ms);
    REQUIRE(w.busy());
    auto now = t0 + 1ms;
    bool went_idle = false;
    for (int i = 0; i < 200 && !went_idle; ++i) {
        now += 5ms;
        const auto a = w.claimed(1, false, now);
        went_idle = a.declare && *a.declare;
    }
    CHECK(went_idle);
    CHECK(now - t0 <= 450ms);  // three windows of 100 ms under the rate, and the first one's rest
    // At the busy rate or over, it stays busy.
    auto v = idle_relay();
    (void)v.claimed(40, false, t0 + 1ms);
    now = t0 + 1ms;
    for (int i = 0; i < 400; ++i) {
        now += 3ms;
        const auto a = v.claimed(1, false, now);  // 333 a second
        CHECK_FALSE((a.declare && *a.declare));
    }
    CHECK(v.busy());
}

TEST_CASE("wake policy: a failed idle declaration keeps the relay busy and tries again") {
    auto w = idle_relay();
    (void)w.claimed(40, false, t0 + 1ms);
    (void)w.claimed(0, false, t0 + 200ms);  // settling
    (void)w.declared(false, t0 + 201ms);
    CHECK(w.busy());
    CHECK(w.timer(t0 + 301ms).claim);
}

TEST_CASE("wake policy: the watch slows down after a second") {
    auto w = idle_relay();
    (void)w.claimed(40, false, t0 + 1ms);
    (void)w.claimed(0, false, t0 + 200ms);
    (void)w.declared_idle(starts_unknown({"7"}), t0 + 200ms);
    (void)w.timer(t0 + 210ms);
    (void)w.watched("7", t0 + 1300ms);
    CHECK(*w.next_timer() == t0 + 1400ms);
}

TEST_CASE("wake policy: no notification after LISTEN: polling, declared busy, until one arrives") {
    wake_policy w(auto_settings());
    (void)w.started(t0);
    (void)w.listening(t0);
    (void)w.declared_idle({}, t0);
    const auto a = w.timer(t0 + 2s);
    CHECK(w.polling());
    REQUIRE(a.declare);
    CHECK_FALSE(*a.declare);
    CHECK(*w.next_timer() == t0 + 2s + 500ms);
    CHECK(w.timer(t0 + 2500ms).claim);
    // Polling: claims do not make it busy.
    CHECK_FALSE(w.claimed(500, false, t0 + 2501ms).declare);
    const auto b = w.notified(t0 + 3s);
    CHECK_FALSE(w.polling());
    REQUIRE(b.declare);
    CHECK(*b.declare);
}

TEST_CASE("wake policy: poll mode claims every poll_interval and never listens or declares") {
    wake_policy::settings s;
    s.mode = wake_mode::poll;
    s.poll_interval = 100ms;
    wake_policy w(s);
    CHECK_FALSE(w.listens());
    (void)w.started(t0);
    CHECK(*w.next_timer() == t0 + 100ms);
    const auto a = w.timer(t0 + 100ms);
    CHECK(a.claim);
    CHECK_FALSE(a.declare);
    CHECK(*w.next_timer() == t0 + 200ms);
}

TEST_CASE("wake policy: notify mode stays declared idle however much comes in, and refreshes it") {
    wake_policy::settings s;
    s.mode = wake_mode::notify;
    s.refresh_interval = 30s;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.listening(t0);
    (void)w.declared_idle({}, t0);
    (void)w.notified(t0);
    CHECK_FALSE(w.claimed(1000, true, t0 + 1ms).declare);
    CHECK_FALSE(w.busy());
    const auto a = w.timer(t0 + 30s);
    REQUIRE(a.declare);
    CHECK(*a.declare);
}

TEST_CASE("wake policy: wal mode polls until the stream is up, claims then and at every commit, polls again when it is lost") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.poll_interval = 100ms;
    wake_policy w(s);
    CHECK_FALSE(w.listens());
    CHECK(w.streams_wal());
    (void)w.started(t0);
    CHECK(w.polling());
    CHECK(*w.next_timer() == t0 + 100ms);
    CHECK(w.timer(t0 + 100ms).claim);
    const auto up = w.stream_up(t0 + 150ms);
    CHECK(up.claim);  // what committed before the slot existed
    CHECK_FALSE(up.declare);
    CHECK_FALSE(w.polling());
    CHECK_FALSE(w.next_timer());  // no declaration to refresh, no self-test
    const auto n = w.notified(t0 + 200ms);
    CHECK(n.claim);
    CHECK_FALSE(n.declare);
    CHECK_FALSE(w.claimed(5000, true, t0 + 201ms).declare);  // never busy, never declares
    const auto down = w.stream_down(t0 + 300ms);
    CHECK(down.claim);
    CHECK(w.polling());
    CHECK(*w.next_timer() == t0 + 400ms);
    CHECK_FALSE(w.stream_down(t0 + 350ms).claim);  // already polling
    CHECK(w.stream_up(t0 + 500ms).claim);
    CHECK_FALSE(w.polling());
}

TEST_CASE("wake policy: wal mode claims each commit at once below busy_rate, and shares one claim per stream_gap above it") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.busy_rate = 300;
    s.stream_gap = 20ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    // Slow inflow: every commit claims at once, however close together.
    CHECK(w.notified(t0 + 1ms).claim);
    (void)w.claimed(1, false, t0 + 2ms);
    CHECK(w.notified(t0 + 3ms).claim);
    (void)w.claimed(1, false, t0 + 4ms);
    // 40 events in this window: 400 a second, above busy_rate.
    (void)w.claimed(38, false, t0 + 5ms);
    CHECK_FALSE(w.claims_back_to_back());  // a claim follows the next commit, not this claim
    CHECK_FALSE(w.notified(t0 + 6ms).claim);
    CHECK(*w.next_timer() == t0 + 23ms);      // the gap after the claim at 3ms
    CHECK_FALSE(w.notified(t0 + 8ms).claim);  // shares the claim set for the end of the gap
    CHECK(w.timer(t0 + 23ms).claim);
    CHECK_FALSE(w.next_timer());
    // A commit long after the last claim is claimed at once, busy or not.
    CHECK(w.notified(t0 + 60ms).claim);
    // 200 a second, in a window that ran 150 ms (30 events): not busy.
    (void)w.claimed(30, false, t0 + 100ms);
    (void)w.claimed(1, false, t0 + 250ms);
    CHECK(w.notified(t0 + 251ms).claim);
    CHECK(w.notified(t0 + 252ms).claim);
    // Slow again: the next windows see few events.
    (void)w.claimed(1, false, t0 + 400ms);
    (void)w.claimed(1, false, t0 + 510ms);
    CHECK(w.notified(t0 + 511ms).claim);
    CHECK(w.notified(t0 + 512ms).claim);
}

TEST_CASE("wake policy: wal mode claims a streamed commit once it is visible, and checks again until it is") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.visibility_recheck = 2ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    auto a = w.committed("700,701", t0 + 1ms);
    CHECK(a.check_visible);
    CHECK_FALSE(a.claim);
    CHECK(w.unseen() == "700,701");
    // Another commit while the check runs: asked about with the next check.
    CHECK_FALSE(w.committed("702", t0 + 2ms).check_visible);
    a = w.visible("701", t0 + 3ms);  // 700 visible, 701 not yet
    CHECK(a.claim);
    CHECK(a.check_visible);  // 702 came meanwhile: checked at once
    CHECK(w.unseen() == "701,702");
    a = w.visible("701", t0 + 4ms);
    CHECK(a.claim);  // 702 visible
    CHECK_FALSE(a.check_visible);
    CHECK(*w.next_timer() == t0 + 6ms);
    a = w.timer(t0 + 6ms);
    CHECK(a.check_visible);
    CHECK(w.unseen() == "701");
    a = w.visible("", t0 + 7ms);
    CHECK(a.claim);
    CHECK_FALSE(w.next_timer());
    // Visible at the first check: one round trip, then the claim.
    CHECK(w.committed("703", t0 + 10ms).check_visible);
    CHECK(w.visible("", t0 + 11ms).claim);
}

TEST_CASE("wake policy: wal mode under load checks and claims once per stream_gap") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.busy_rate = 300;
    s.stream_gap = 20ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    (void)w.claimed(40, false, t0 + 1ms);  // 400 a second
    CHECK(w.committed("1", t0 + 2ms).check_visible);
    CHECK(w.visible("", t0 + 3ms).claim);
    // Within the gap: neither a check nor a claim until its end.
    CHECK_FALSE(w.committed("2", t0 + 4ms).check_visible);
    CHECK_FALSE(w.committed("3", t0 + 5ms).check_visible);
    CHECK(*w.next_timer() == t0 + 23ms);
    const auto a = w.timer(t0 + 23ms);
    CHECK(a.check_visible);
    CHECK(w.unseen() == "2,3");
    CHECK(w.visible("", t0 + 24ms).claim);
}

TEST_CASE("wake policy: wal mode under a steady stream keeps checking each commit, however long the stream runs") {
    // Commits keep coming, each while the check of the one before runs, so
    // some commit is always waiting to be checked. No commit was ever
    // invisible for long: none may be given up on (a commit given up on
    // before it is visible is claimed by nobody until the sweep).
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.visibility_give_up = 100ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    REQUIRE(w.committed("1", t0).check_visible);
    for (int i = 2; i <= 150; ++i) {
        const auto now = t0 + std::chrono::milliseconds(i);
        CHECK_FALSE(w.committed(std::to_string(i), now).check_visible);  // a check runs
        const auto a = w.visible("", now);  // the one asked about is visible
        CHECK(a.claim);
        CHECK_MESSAGE(a.check_visible, "commit ", i, " is not checked");
        CHECK(w.unseen() == std::to_string(i));
    }
}

TEST_CASE("wake policy: wal mode gives up on a commit that stays invisible, and only on it") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.visibility_give_up = 100ms;
    s.visibility_recheck = 1ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    REQUIRE(w.committed("7", t0).check_visible);
    CHECK_FALSE(w.visible("7", t0 + 1ms).claim);
    (void)w.timer(t0 + 2ms);
    CHECK_FALSE(w.committed("8", t0 + 99ms).check_visible);  // a check runs
    // 7 has been invisible for the whole give-up time: claimed anyway, not
    // checked again; 8 just came and is still checked.
    const auto a = w.visible("7", t0 + 100ms);
    CHECK(a.claim);
    CHECK(a.check_visible);
    CHECK(w.unseen() == "8");
    CHECK(w.visible("", t0 + 101ms).claim);
    CHECK_FALSE(w.next_timer());
}

TEST_CASE("wake policy: wal mode at stream up reads the transactions in progress and watches them, as after a LISTEN") {
    // A transaction whose commit record lies just behind the new slot's start
    // point is not streamed, and may not be visible yet at the claim at
    // stream up (synchronous replication): it is still in progress then, so
    // it is watched and claimed from the start when it ends.
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.watch_interval = 10ms;
    wake_policy w(s);
    (void)w.started(t0);
    auto a = w.stream_up(t0 + 1ms);
    CHECK(a.claim);
    CHECK(a.read_in_progress);
    CHECK_FALSE(a.declare);  // nothing to declare: no trigger reads it in this mode
    a = w.declared_idle(starts_unknown({"900", "901"}), t0 + 2ms);
    CHECK(a.claim_from_start);
    CHECK(w.in_progress() == "900,901");
    CHECK(*w.next_timer() == t0 + 12ms);
    CHECK(w.timer(t0 + 12ms).watch);
    CHECK(w.watched("901", t0 + 13ms).claim_from_start);  // 900 ended
    CHECK(w.timer(t0 + 23ms).watch);
    CHECK(w.watched("", t0 + 24ms).claim_from_start);
    CHECK_FALSE(w.next_timer());
    // The read failed: a claim from the start now, nothing watched.
    (void)w.stream_down(t0 + 30ms);
    (void)w.stream_up(t0 + 40ms);
    a = w.declared(false, t0 + 41ms);
    CHECK(a.claim_from_start);
    CHECK_FALSE(w.busy());
    CHECK_FALSE(w.timer(t0 + 41ms + s.idle_after).claim);  // not busy: no busy claim either
}

TEST_CASE("wake policy: wal mode pauses the stream after a whole window at busy_rate, claims on its own, and resumes when the spell ends") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.busy_rate = 300;
    s.busy_gap = 5ms;
    s.busy_poll = 2ms;
    s.idle_after = 100ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    (void)w.declared_idle({}, t0 + 1ms);
    // A burst's first claims do not pause: the window is not over yet.
    CHECK_FALSE(w.claimed(40, false, t0 + 2ms).pause_stream);
    CHECK_FALSE(w.stream_paused());
    // The window closes at 400 a second: the stream pauses.
    auto a = w.claimed(10, false, t0 + 102ms);
    CHECK(a.pause_stream);
    CHECK(w.stream_paused());
    CHECK(w.busy());
    CHECK(w.claims_back_to_back());
    CHECK(*w.next_timer() == t0 + 107ms);  // busy_gap
    // What the stream still shows while it stops is left to the busy claims.
    a = w.committed("41,42", t0 + 103ms);
    CHECK_FALSE(a.check_visible);
    CHECK_FALSE(a.claim);
    CHECK(w.timer(t0 + 107ms).claim);
    (void)w.claimed(2, false, t0 + 108ms);
    CHECK(*w.next_timer() == t0 + 113ms);
    CHECK(w.timer(t0 + 113ms).claim);
    (void)w.claimed(0, false, t0 + 114ms);
    CHECK(*w.next_timer() == t0 + 116ms);  // busy_poll after a claim that found none
    // Steady load keeps it paused: windows at the rate.
    for (int i = 0; i < 5; ++i) {
        const auto now = t0 + 210ms + std::chrono::milliseconds(100 * i);
        a = w.claimed(40, false, now);
        CHECK_FALSE(a.resume_stream);
        CHECK_FALSE(a.pause_stream);
    }
    // Three windows under the rate (the one closed at 710 ms still holds the
    // claim at 610 ms): the stream resumes; until it runs, claims go on.
    for (const auto at : {710ms, 810ms, 910ms}) CHECK_FALSE(w.claimed(1, false, t0 + at).resume_stream);
    a = w.claimed(1, false, t0 + 1010ms);
    CHECK(a.resume_stream);
    CHECK_FALSE(w.stream_paused());
    CHECK_FALSE(w.polling());
    CHECK(*w.next_timer() == t0 + 1015ms);  // busy_gap: that claim found an event
    CHECK(w.timer(t0 + 1015ms).claim);
    CHECK_FALSE(w.claimed(0, false, t0 + 1016ms).resume_stream);  // asked once
    CHECK(*w.next_timer() == t0 + 1018ms);
    // Up again: as at any stream up, a claim and a read of what is in
    // progress (a commit just behind the resume point is not streamed), and
    // no more claims of its own.
    a = w.stream_up(t0 + 1017ms);
    CHECK(a.claim);
    CHECK(a.read_in_progress);
    CHECK_FALSE(w.polling());
    CHECK_FALSE(w.next_timer());
    a = w.declared_idle(starts_unknown({"950"}), t0 + 1018ms);
    CHECK(a.claim_from_start);
    CHECK(w.in_progress() == "950");
    // Streamed commits are checked and claimed again.
    CHECK(w.committed("951", t0 + 1020ms).check_visible);
    // The spell's rate window does not carry over: a claim right after the
    // stream is up, of a few events, does not pause it again.
    CHECK_FALSE(w.claimed(5, false, t0 + 1030ms).pause_stream);
    CHECK_FALSE(w.claimed(5, false, t0 + 1140ms).pause_stream);
    CHECK_FALSE(w.stream_paused());
}

// A wal relay whose stream came up at `up`: idle 1 ms later, then a whole
// window at 400 events a second (busy_rate 300) pauses the stream at up + 102 ms.
namespace {
void pause_under_load(wake_policy& w, wake_policy::time up) {
    (void)w.declared_idle({}, up + 1ms);
    (void)w.claimed(40, false, up + 2ms);
    REQUIRE(w.claimed(40, false, up + 102ms).pause_stream);
}
}  // namespace

TEST_CASE("wake policy: wal mode resumes after idle_after of empty claims, and polls when the stream is lost while paused") {
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.busy_rate = 300;
    s.busy_poll = 2ms;
    s.idle_after = 100ms;
    s.poll_interval = 500ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    pause_under_load(w, t0);
    // Nothing found since: idle_after later it resumes. The new slot may
    // wait for a transaction held open elsewhere (for good, a forgotten
    // prepared one): meanwhile a claim every watch_slow_interval while
    // nothing comes, the busy cadence when something does.
    CHECK_FALSE(w.claimed(0, false, t0 + 150ms).resume_stream);
    CHECK(w.claimed(0, false, t0 + 202ms).resume_stream);
    CHECK_FALSE(w.polling());
    CHECK(*w.next_timer() == t0 + 202ms + s.watch_slow_interval);
    CHECK(w.timer(t0 + 302ms).claim);
    CHECK_FALSE(w.claimed(0, false, t0 + 303ms).resume_stream);
    CHECK(*w.next_timer() == t0 + 403ms);
    (void)w.claimed(3, false, t0 + 404ms);
    CHECK(*w.next_timer() == t0 + 404ms + s.busy_gap);
    // The new connection failed: polling; the stream up after the reconnect
    // claims and reads what is in progress.
    auto a = w.stream_down(t0 + 410ms);
    CHECK(a.claim);
    CHECK(w.polling());
    CHECK_FALSE(w.stream_paused());
    CHECK_FALSE(w.claimed(50, false, t0 + 450ms).pause_stream);  // polling: never pauses
    a = w.stream_up(t0 + 500ms);
    CHECK(a.claim);
    CHECK(a.read_in_progress);
    CHECK_FALSE(w.polling());
    // Lost while paused, before any resume.
    pause_under_load(w, t0 + 500ms);
    (void)w.stream_down(t0 + 603ms);
    CHECK_FALSE(w.stream_paused());
    CHECK(w.polling());
}

TEST_CASE("wake policy: wal mode does not pause a resumed stream again on the rate of the spell that ended") {
    // The spell ends on idle_after while the window it began still counts
    // its last events at busy_rate: the first claim after the stream is up
    // must not read that window as a new spell.
    wake_policy::settings s;
    s.mode = wake_mode::wal;
    s.busy_rate = 300;
    s.idle_after = 100ms;
    wake_policy w(s);
    (void)w.started(t0);
    (void)w.stream_up(t0);
    pause_under_load(w, t0);
    (void)w.claimed(40, false, t0 + 140ms);
    (void)w.claimed(0, false, t0 + 202ms);  // closes a window of 40: busy
    REQUIRE(w.claimed(0, false, t0 + 240ms).resume_stream);
    (void)w.stream_up(t0 + 260ms);
    (void)w.declared_idle({}, t0 + 261ms);
    CHECK_FALSE(w.claimed(1, false, t0 + 265ms).pause_stream);
    CHECK_FALSE(w.claimed(1, false, t0 + 370ms).pause_stream);
    CHECK_FALSE(w.stream_paused());
}
