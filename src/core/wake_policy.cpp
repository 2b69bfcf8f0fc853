#include "core/wake_policy.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/duration.hpp"
#include "core/log.hpp"

namespace outboxd {

using namespace std::chrono_literals;

wake_mode parse_wake_mode(const std::string& text) {
    if (text == "auto") return wake_mode::automatic;
    if (text == "notify") return wake_mode::notify;
    if (text == "poll") return wake_mode::poll;
    if (text == "wal") return wake_mode::wal;
    throw std::invalid_argument("unknown wake mode: " + text);  // the configuration checked it
}

wake_policy::actions wake_policy::started(time now) {
    if (s_.mode == wake_mode::poll || s_.mode == wake_mode::wal) {
        start_polling(now);  // wal: until the stream is up
    } else {
        refresh_at_ = now + s_.refresh_interval;
    }
    return {};
}

void wake_policy::start_polling(time now) {
    polling_ = true;
    poll_at_ = now + s_.poll_interval;
}

wake_policy::actions wake_policy::listening(time now) {
    actions a;
    if (!listens()) return a;
    a.self_notify = true;
    self_test_until_ = now + s_.self_test_timeout;
    // Whatever it was before (nothing at startup, busy before the connection
    // was lost), the relay declares itself idle now, exactly as when a busy
    // spell ends: producers that read the old state and have not committed
    // yet are watched.
    busy_poll_at_.reset();
    watch_at_.reset();
    watching_.clear();
    if (polling_) {
        state_ = state::idle;
        return a;
    }
    state_ = state::settling;
    settle_from_start_ = true;
    declared_idle_ = true;
    a.declare = true;
    a.read_in_progress = true;
    return a;
}

wake_policy::actions wake_policy::stream_claim(time now) {
    actions a;
    if (stream_claim_at_) return a;  // a claim is already set for the end of the gap
    if (stream_claimed_ && now - *stream_claimed_ < s_.stream_gap && fast_inflow()) {
        stream_claim_at_ = *stream_claimed_ + s_.stream_gap;
        return a;
    }
    stream_claimed_ = now;
    a.claim = true;
    return a;
}

namespace {

std::vector<std::string> split_xids(const std::string& text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start < text.size()) {
        auto end = text.find(',', start);
        if (end == std::string::npos) end = text.size();
        if (end > start) out.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

void wake_policy::start_check(actions& a) {
    checking_.clear();
    for (const auto& u : unseen_) checking_ += (checking_.empty() ? "" : ",") + u.xid;
    check_running_ = true;
    recheck_at_.reset();
    a.check_visible = true;
}

// Under load the check waits for the end of the claim gap, as the claim
// would: one check and one claim per gap, however many commits came.
void wake_policy::check_soon(actions& a, time now) {
    if (check_running_) return;
    if (fast_inflow() && stream_claimed_ && now - *stream_claimed_ < s_.stream_gap) {
        const auto at = *stream_claimed_ + s_.stream_gap;
        if (!recheck_at_ || at < *recheck_at_) recheck_at_ = at;
        return;
    }
    start_check(a);
}

wake_policy::actions wake_policy::committed(const std::string& xids, time now) {
    actions a;
    if (!streams_wal() || polling_) {
        a.claim = true;
        return a;
    }
    // Paused: nothing comes from a closed stream, but a pause may cross a
    // read of it; the busy claims find these.
    if (stream_paused()) return a;
    for (auto& x : split_xids(xids)) {
        const bool known =
            std::any_of(unseen_.begin(), unseen_.end(), [&](const unseen_commit& u) { return u.xid == x; });
        if (!known) unseen_.push_back({std::move(x), now});
    }
    if (unseen_.empty()) return a;
    check_soon(a, now);
    return a;
}

wake_policy::actions wake_policy::visible(const std::string& remaining, time now) {
    actions a;
    check_running_ = false;
    const auto still = split_xids(remaining);
    const auto asked = split_xids(checking_);
    bool became_visible = false;
    std::vector<unseen_commit> next;
    std::string given_up;
    bool arrived_meanwhile = false;
    std::optional<time> oldest;
    for (auto& u : unseen_) {
        const bool was_asked = contains(asked, u.xid);
        if (was_asked && !contains(still, u.xid)) {
            became_visible = true;
            continue;
        }
        if (was_asked && now - u.since >= s_.visibility_give_up) {
            given_up += (given_up.empty() ? "" : ",") + u.xid;
            continue;
        }
        arrived_meanwhile = arrived_meanwhile || !was_asked;
        if (!oldest || u.since < *oldest) oldest = u.since;
        next.push_back(std::move(u));
    }
    unseen_ = std::move(next);
    if (became_visible) a = stream_claim(now);
    if (!given_up.empty()) {
        // Should never happen: the claims that polling and the sweep make find them.
        log::warn("commits shown by the WAL stream are still not visible; no longer waiting for them",
                  {{"xids", given_up}});
        a.claim = true;
    }
    if (unseen_.empty()) return a;
    if (arrived_meanwhile) {
        check_soon(a, now);
    } else {
        const bool slow = oldest && now - *oldest >= s_.watch_slow_after;
        recheck_at_ = slow ? now + s_.watch_slow_interval : now + s_.visibility_recheck;
    }
    return a;
}

wake_policy::actions wake_policy::notified(time now) {
    actions a;
    if (streams_wal() && !polling_) return stream_claim(now);
    a.claim = true;
    self_test_until_.reset();
    if (polling_ && listens()) {
        log::info("notifications arrive again; no longer polling");
        polling_ = false;
        poll_at_.reset();
        if (state_ == state::idle && !declared_idle_) {
            declared_idle_ = true;
            a.declare = true;
        }
    }
    (void)now;
    return a;
}

wake_policy::actions wake_policy::stream_up(time now) {
    actions a;
    if (!streams_wal()) return a;
    polling_ = false;
    poll_at_.reset();
    busy_poll_at_.reset();  // streaming again after a pause: the stream wakes the relay
    restart_rate_window(now);
    a.claim = true;  // what committed before the slot existed (a new one after a pause) is not in the stream
    // A commit just behind the slot's start point is not in the stream either,
    // and may not be visible to that claim yet (synchronous replication): its
    // transaction is still in progress, so what is in progress is watched.
    state_ = state::settling;
    settle_from_start_ = true;
    watch_at_.reset();
    watching_.clear();
    a.read_in_progress = true;
    (void)now;
    return a;
}

wake_policy::actions wake_policy::stream_down(time now) {
    actions a;
    if (!streams_wal() || polling_) return a;
    log::warn("the WAL stream is down: claiming every poll_interval until it is back",
              {{"poll_interval", format_duration(s_.poll_interval)}});
    start_polling(now);
    if (state_ == state::busy || state_ == state::resuming) state_ = state::idle;
    busy_poll_at_.reset();
    stream_claim_at_.reset();
    // Polling claims find them, and the claim when the stream is back.
    unseen_.clear();
    recheck_at_.reset();
    a.claim = true;  // a commit may have been on its way in the lost stream
    return a;
}

wake_policy::actions wake_policy::no_trigger(time now) {
    actions a;
    log::error("the events table has no wake-up trigger: producers notify nobody; claiming every poll_interval "
               "(run `outboxd wake-trigger install`, or set relay.wake = \"poll\")",
               {{"poll_interval", format_duration(s_.poll_interval)}});
    start_polling(now);
    if (declared_idle_) {
        declared_idle_ = false;
        a.declare = false;
    }
    return a;
}

void wake_policy::start_busy_spell(time now) {
    state_ = state::busy;
    last_found_ = now;
    quiet_windows_ = 0;
    watch_at_.reset();
}

wake_policy::actions wake_policy::become_busy(time now) {
    actions a;
    // Still watched, not polled: those that end while the relay is busy are
    // reached back for at its next transition (declared_idle).
    start_busy_spell(now);
    declared_idle_ = false;
    a.declare = false;
    a.claim = true;
    return a;
}

wake_policy::actions wake_policy::settle(time now) {
    actions a;
    (void)now;
    state_ = state::settling;
    // Busy until now: its claims' low marks cover what committed meanwhile.
    settle_from_start_ = false;
    busy_poll_at_.reset();
    declared_idle_ = true;
    a.declare = true;
    a.read_in_progress = true;
    return a;
}

void wake_policy::count_claimed(std::size_t got, time now) {
    if (now - window_start_ >= 100ms) {
        // The window ran from its first claim to this one: 100 ms or more.
        const auto elapsed = std::chrono::duration_cast<ms>(now - window_start_).count();
        last_window_busy_ = static_cast<long long>(window_count_) * 1000 >=
                            static_cast<long long>(s_.busy_rate) * elapsed;
        quiet_windows_ = last_window_busy_ ? 0 : quiet_windows_ + 1;
        window_start_ = now;
        window_count_ = 0;
    }
    window_count_ += got;
}

bool wake_policy::fast_inflow() const noexcept { return last_window_busy_ || window_count_ * 10 >= s_.busy_rate; }

// The inflow fell under busy_rate and stayed there: a wake-up per event is
// cheap again, and claims busy_gap apart would make each event wait for the
// next one. (Claims that keep finding a few events never come up empty for
// idle_after.)
bool wake_policy::busy_spell_over(std::size_t got, time now) const {
    return quiet_windows_ >= quiet_windows_to_idle || (got == 0 && now - last_found_ >= s_.idle_after);
}

// A busy relay claims on its own: a full claim is followed at once by the
// engine; otherwise busy_gap after one that found events (much of a claim's
// cost is fixed, so fewer claims of more events each), busy_poll after one
// that found none.
void wake_policy::next_busy_claim(std::size_t got, bool full, time now) {
    if (got > 0) {
        last_found_ = now;
        if (!full) busy_poll_at_ = now + s_.busy_gap;
        return;
    }
    busy_poll_at_ = now + s_.busy_poll;
}

wake_policy::actions wake_policy::claimed(std::size_t got, bool full, time now) {
    actions a;
    if (streams_wal()) {
        count_claimed(got, now);
        return polling_ ? a : wal_claimed(got, full, now);
    }
    if (s_.mode != wake_mode::automatic || polling_) return a;
    count_claimed(got, now);
    switch (state_) {
        case state::idle:
        case state::watching:
            if (window_count_ * 10 >= s_.busy_rate) return become_busy(now);
            return a;
        case state::settling:
        case state::resuming:  // wal only
            return a;
        case state::busy:
            if (busy_spell_over(got, now)) return settle(now);
            next_busy_claim(got, full, now);
            return a;
    }
    return a;
}

wake_policy::actions wake_policy::wal_claimed(std::size_t got, bool full, time now) {
    actions a;
    switch (state_) {
        case state::idle:
        case state::watching:
            // A whole window at busy_rate, not a burst's first claims: a
            // pause costs a resume, a claim from the start and a read of
            // what is in progress when it ends.
            if (last_window_busy_) return pause_stream(now);
            return a;
        case state::settling:
            return a;
        case state::busy:
            if (!busy_spell_over(got, now)) {
                next_busy_claim(got, full, now);
                return a;
            }
            state_ = state::resuming;
            // The rate of the spell is not the rate after it: a window it
            // began must not pause the new stream at once.
            restart_rate_window(now);
            a.resume_stream = true;
            [[fallthrough]];
        case state::resuming:
            next_resuming_claim(got, full, now);
            return a;
    }
    return a;
}

// Until the new stream runs. A slot is made in milliseconds, unless a
// transaction held open anywhere in the cluster (a forgotten prepared one:
// for good) keeps its creation waiting; meanwhile the relay claims on the
// busy cadence while claims find events, and every watch_slow_interval once
// they have found none for idle_after: an event waits at most that long, and
// a blocked slot costs ten empty claims a second, not five hundred.
void wake_policy::next_resuming_claim(std::size_t got, bool full, time now) {
    if (got == 0 && now - last_found_ >= s_.idle_after) {
        busy_poll_at_ = now + s_.watch_slow_interval;
        return;
    }
    next_busy_claim(got, full, now);
}

void wake_policy::restart_rate_window(time now) {
    window_start_ = now;
    window_count_ = 0;
    last_window_busy_ = false;
    quiet_windows_ = 0;
}

wake_policy::actions wake_policy::pause_stream(time now) {
    actions a;
    start_busy_spell(now);
    // The busy claims find what the stream showed and has not been claimed
    // yet; the claim from the start when the stream is up again reaches
    // whatever was watched (and is read in progress again then).
    unseen_.clear();
    recheck_at_.reset();
    stream_claim_at_.reset();
    watching_.clear();
    busy_poll_at_ = now + s_.busy_gap;
    a.pause_stream = true;
    return a;
}

wake_policy::actions wake_policy::declared(bool ok, time now) {
    actions a;
    if (ok || state_ != state::settling) return a;
    if (streams_wal()) {
        // The read at stream up failed: nothing to watch; claim everything once more.
        state_ = state::idle;
        a.claim_from_start = true;
        return a;
    }
    // Producers may still think we are busy: stay busy, try again later.
    state_ = state::busy;
    declared_idle_ = false;
    last_found_ = now;
    busy_poll_at_ = now + s_.idle_after;
    return a;
}

// The claim after some watched transactions ended (their events are visible
// now): reaching back to the earliest start among them that wrote events.
wake_policy::actions wake_policy::claim_after(const std::vector<xact_in_progress>& ended) {
    actions a;
    std::optional<database_time> since;
    for (const auto& x : ended) {
        if (!x.writes_events) continue;
        if (!x.written_since) {
            a.claim_from_start = true;
            return a;
        }
        if (!since || *x.written_since < *since) since = x.written_since;
    }
    a.claim_since = since;
    a.claim = !ended.empty() && !since;
    return a;
}

wake_policy::actions wake_policy::declared_idle(std::vector<xact_in_progress> xacts, time now) {
    actions a;
    if (state_ != state::settling) return a;
    transition_ = now;
    if (settle_from_start_) {
        a.claim_from_start = true;
    } else {
        // Writers watched at an earlier transition that ended while the relay
        // was busy: its claims looked back at most 5 s.
        std::vector<xact_in_progress> ended;
        for (auto& x : watching_) {
            const bool still = std::any_of(xacts.begin(), xacts.end(), [&](const auto& y) { return y.xid == x.xid; });
            if (!still) ended.push_back(std::move(x));
        }
        a = claim_after(ended);
        a.claim = !a.claim_from_start && !a.claim_since;
    }
    watching_ = std::move(xacts);
    if (watching_.empty()) {
        state_ = state::idle;
    } else {
        state_ = state::watching;
        watch_at_ = now + s_.watch_interval;
    }
    return a;
}

std::string wake_policy::in_progress() const {
    std::string xids;
    for (const auto& x : watching_) xids += (xids.empty() ? "" : ",") + x.xid;
    return xids;
}

wake_policy::actions wake_policy::watched(std::string remaining, time now) {
    watch_running_ = false;
    if (state_ != state::watching) return {};
    const auto still = split_xids(remaining);
    std::vector<xact_in_progress> left;
    std::vector<xact_in_progress> ended;
    for (auto& x : watching_) (contains(still, x.xid) ? left : ended).push_back(std::move(x));
    watching_ = std::move(left);
    auto a = claim_after(ended);
    if (watching_.empty()) {
        state_ = state::idle;
        return a;
    }
    watch_at_ = now + (now - transition_ >= s_.watch_slow_after ? s_.watch_slow_interval : s_.watch_interval);
    return a;
}

wake_policy::actions wake_policy::timer(time now) {
    actions a;
    if (self_test_until_ && *self_test_until_ <= now) {
        self_test_until_.reset();
        log::error("notifications do not arrive: LISTEN succeeded but our own test notification never came "
                   "(a transaction pooler between outboxd and PostgreSQL?); claiming every poll_interval "
                   "instead. Connect outboxd directly or through session pooling, or set relay.wake = \"poll\"",
                   {{"poll_interval", format_duration(s_.poll_interval)}});
        start_polling(now);
        state_ = state::idle;
        busy_poll_at_.reset();
        watch_at_.reset();
        watching_.clear();
        if (declared_idle_) {
            declared_idle_ = false;
            a.declare = false;  // nobody hears them: producers should not pay for them
        }
    }
    if (poll_at_ && *poll_at_ <= now) {
        a.claim = true;
        poll_at_ = now + s_.poll_interval;
    }
    if (refresh_at_ && *refresh_at_ <= now) {
        refresh_at_ = now + s_.refresh_interval;
        if (!a.declare && state_ != state::settling) a.declare = declared_idle_;
    }
    if (recheck_at_ && *recheck_at_ <= now && !check_running_) start_check(a);
    if (stream_claim_at_ && *stream_claim_at_ <= now) {
        stream_claim_at_.reset();
        stream_claimed_ = now;
        a.claim = true;
    }
    if (busy_poll_at_ && *busy_poll_at_ <= now) {
        busy_poll_at_.reset();
        a.claim = true;
    }
    if (watch_at_ && *watch_at_ <= now && !watch_running_) {
        watch_at_.reset();
        watch_running_ = true;
        a.watch = true;
    }
    return a;
}

std::optional<wake_policy::time> wake_policy::next_timer() const {
    std::optional<time> t;
    for (const auto& c : {self_test_until_, poll_at_, refresh_at_, busy_poll_at_, watch_at_, stream_claim_at_,
                          recheck_at_}) {
        if (c && (!t || *c < *t)) t = c;
    }
    return t;
}

}  // namespace outboxd
