#include "core/relay_engine.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "core/claim_capacity.hpp"
#include "core/duration.hpp"
#include "core/log.hpp"
#include "core/signing.hpp"
#include "core/webhook_request.hpp"

namespace outboxd {

using std::chrono::milliseconds;

namespace {

std::string str(std::int64_t n) { return fmt::format("{}", n); }

// What an outcome about a claimed event is fenced on: its lease, or for a
// run's follower the key hold it was sent under.
lease_ref lease_of(const event& e) { return {e.id, e.attempt, e.tid, e.hold}; }

delivery_result result_of(delivery_outcome::kind k) {
    switch (k) {
        case delivery_outcome::kind::delivered: return delivery_result::delivered;
        case delivery_outcome::kind::retry: return delivery_result::retry;
        case delivery_outcome::kind::dead: return delivery_result::dead;
    }
    return delivery_result::retry;
}

}  // namespace

relay_engine::relay_engine(const config& cfg, const clock_source& clock, std::uint64_t seed)
    : cfg_(cfg), clock_(clock), routes_(cfg), rng_(seed), dispatch_(cfg.concurrency) {
    for (const auto& d : cfg_.destinations) {
        longest_attempt_ = std::max(longest_attempt_, d.connect_timeout + d.request_timeout);
        lanes_.push_back({0, std::max<std::size_t>(1, d.max_concurrency), {}});
        circuits_.emplace_back(d.circuit);
    }
    if (cfg_.consume == "windows") reader_.emplace(window_queue_limit);
}

std::vector<relay_command> relay_engine::take_commands() { return std::exchange(commands_, {}); }

void relay_engine::arm(relay_timer t, steady_time at) { emit(arm_timer_command{t, at, ++generation(t)}); }

void relay_engine::cancel(relay_timer t) {
    ++generation(t);  // a fire already on its way is ignored
    emit(cancel_timer_command{t});
}

void relay_engine::timer_fired(relay_timer t, std::uint64_t gen) {
    if (gen != generation(t)) return;
    switch (t) {
        case relay_timer::sweep:
            sweep();
            break;
        case relay_timer::next_due:
            next_due_armed_ = false;
            if (metrics_ != nullptr) metrics_->woken(wake_source::timer);
            wake();
            break;
        case relay_timer::claim_retry:
            claim_backing_off_ = false;
            if (metrics_ != nullptr) metrics_->woken(wake_source::timer);
            wake();
            break;
        case relay_timer::flush_retry:
            flush_backing_off_ = false;
            flush_outcomes();
            break;
        case relay_timer::outcome_gather:
            gathering_ = false;
            flush_outcomes(true);
            break;
        case relay_timer::circuit_probe:
            // Something must be due there to probe with, though all it owes
            // may wait out a backoff: the delivery due soonest is made due
            // now. Then a claim that includes the destinations that may probe.
            for (std::size_t i = 0; i < circuits_.size(); ++i) {
                if (circuits_[i].state(clock_.steady()) == circuit_state::probing &&
                    circuits_[i].allows_request(clock_.steady())) {
                    emit(release_deliveries_command{cfg_.destinations[i].name, true});
                }
            }
            if (metrics_ != nullptr) metrics_->woken(wake_source::timer);
            wake();
            arm_probe();
            break;
        case relay_timer::takeover:
            if (dispatch_.stopping()) break;
            emit(housekeeping_command{housekeeping_job::dead_relays});
            // Cursors freed by the takeover (their relay died), or by a relay
            // that held more than its share, are ours to take.
            take_cursors();
            shed_surplus_cursors();
            arm(relay_timer::takeover, clock_.steady() + takeover_interval);
            break;
        case relay_timer::checkpoint:
            if (dispatch_.stopping()) break;
            shed_surplus_cursors();
            write_checkpoint();
            arm(relay_timer::checkpoint, clock_.steady() + checkpoint_interval);
            break;
        case relay_timer::slow_requests:
            give_up_slots_of_slow_requests();
            break;
        case relay_timer::shutdown:
            log::warn("shutdown timeout: releasing deliveries still in flight",
                      {{"in_flight", str(static_cast<std::int64_t>(dispatch_.in_flight()))}});
            finish();
            break;
    }
}

// ---- claiming ----------------------------------------------------------------

void relay_engine::start(std::string message_prefix, run_mode mode) {
    // relay.consume = "auto" is settled into one of the two before an engine
    // is given work (app/relay.cpp): an engine built on "auto" would claim.
    if (cfg_.consume != "claims" && cfg_.consume != "windows") {
        throw std::logic_error("relay_engine: relay.consume must be claims or windows, not " + cfg_.consume);
    }
    message_prefix_ = std::move(message_prefix);
    mode_ = mode;
    // Nothing recorded yet, marks empty, deliveries included: the first
    // claim is as good as a confirming one.
    confirming_ = mode_ == run_mode::once;
    arm(relay_timer::sweep, clock_.steady() + cfg_.sweep_interval);
    if (cfg_.live_leases) {
        // At once: a restarted relay picks up its predecessor's work.
        emit(housekeeping_command{housekeeping_job::dead_relays});
        arm(relay_timer::takeover, clock_.steady() + takeover_interval);
    }
    if (reader_) {
        // After the takeover (same connection): a dead relay's row, gone
        // by then, does not count in the share.
        take_cursors();
        arm(relay_timer::checkpoint, clock_.steady() + checkpoint_interval);
    }
    wake();
}

void relay_engine::relays_taken_over(std::size_t leases) {
    if (leases == 0 || dispatch_.stopping()) return;
    // A claim running now may predate them: it cannot confirm a drain.
    confirming_ = false;
    confirmed_empty_ = false;
    // Handed back due now, events and deliveries alike; a key they held may
    // have later events waiting behind the marks: claim from the beginning.
    deliveries_due_ = true;
    reset_claim_marks(true);
    wake();
}

void relay_engine::wake() { start_claim(dispatch_.on_wake()); }

void relay_engine::wake_from_start() {
    if (dispatch_.stopping()) return;
    reset_claim_marks(false);
    wake();
}

void relay_engine::wake_since(database_time since) {
    if (dispatch_.stopping()) return;
    if (dispatch_.claiming()) {
        if (!reach_after_claim_ || since < *reach_after_claim_) reach_after_claim_ = since;
    } else {
        low_mark_ = low_mark_reaching(low_mark_, since);
    }
    wake();
}

void relay_engine::start_claim(std::size_t n) {
    if (n == 0) return;
    // While no destination's circuit is closed, what is claimed could only
    // be handed to delivery rows: claim nothing while all are open (the
    // events wait in the outbox, untouched, and go out by the fast path once
    // a probe succeeds), and one event per destination that may probe now.
    const auto now = clock_.steady();
    bool any_closed = circuits_.empty();
    std::size_t probes = 0;
    for (auto& c : circuits_) {
        const auto state = c.state(now);
        if (state == circuit_state::closed) any_closed = true;
        if (state == circuit_state::probing && c.allows_request(now)) ++probes;
    }
    if (!any_closed) {
        if (probes == 0) {
            (void)dispatch_.on_claimed(0, 1);  // as a claim that found nothing
            confirmed_empty_ = std::exchange(confirming_, false);
            maybe_finish();
            return;
        }
        n = std::min(n, probes);
    }
    claim_request request{n, cfg_.lease, {}, deliveries_due_, drain_watermark_, low_mark_, {}, false, {}};
    request.unkeyed_first = !keys_picked_at_ || now - *keys_picked_at_ >= keyed_claims_for;
    if (claim_answer_unknown_) request.release_all_but = ledger_.held();
    if (reader_) {
        request.windows = true;
        const auto mean = reader_->mean_event_bytes();
        const auto page = mean == 0 ? std::size_t{1024}
                                    : std::clamp<std::size_t>(window_page_bytes / mean, 128, window_queue_limit);
        request.window = reader_->next_read(std::max(n, page));
        // The queue is full: read again once it has room (pull_window).
        window_read_deferred_ = !request.window && reader_->holding() && !reader_->reading();
    }
    // Deliveries are claimed only for destinations that can take them now,
    // as many as each has free connections.
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
        lanes_[i].passed_over = lanes_[i].full();
        if (const auto free = free_connections(i); free > 0) {
            request.open_destinations.push_back({cfg_.destinations[i].name, free});
        }
    }
    claim_asked_ = clock_.steady();
    claim_wanted_ = n;
    flushes_at_claim_ = flushes_recorded_;
    emit(claim_command{std::move(request)});
}

void relay_engine::claimed(claim_outcome result) {
    // Whether an outcome was recorded while this claim ran, judged now:
    // start_claim() below resets the count for the claim it starts.
    const bool next_due_authoritative = flushes_recorded_ == flushes_at_claim_;
    claim_backoff_.reset();
    claim_answer_unknown_ = false;
    if (result.released > 0) {
        log::warn("handed back leases taken by a claim whose answer was lost; they are due now",
                  {{"leases", str(static_cast<std::int64_t>(result.released))}});
    }
    const bool page_full = result.window && result.window->full;
    const bool page_empty = !result.window || result.window->events.empty();
    if (reader_ && result.window) reader_->page_read(std::move(*result.window));
    // A confirming claim that came back full but empty (it examined its bound
    // of rows of blocked keys) goes on through the claims behind it.
    confirmed_empty_ = false;
    if (confirming_ && (!result.events.empty() || !result.full)) {
        confirmed_empty_ = result.events.empty() && (!reader_ || (page_empty && !page_full && reader_->idle()));
        confirming_ = false;
    }
    deliveries_due_ = result.deliveries_due;
    if (result.picked_keyed) keys_picked_at_ = clock_.steady();
    drain_watermark_ = std::move(result.drain_watermark);
    low_mark_ = std::move(result.low_mark);
    apply_resets_after_claim();
    if (metrics_ != nullptr) metrics_->claimed(result.events.size());
    if (finishing_) return;  // a timed-out shutdown: the release covers these
    auto& events = result.events;
    // A claim under way when a reload or a shutdown began: what it took is
    // handed back unsent and due now, as stop_claiming() did with what was
    // waiting. Sent, it would go out under the configuration a reload is
    // replacing (to a destination the new one may have dropped), and would
    // hold up a shutdown that no longer claims.
    if (dispatch_.stopping() && !events.empty()) {
        for (const auto& e : events) {
            ledger_.claimed(e);
            hand_back(e, milliseconds(0));
        }
        events.clear();
        flush_outcomes();
    }
    if (!events.empty() && log::enabled(log::level::debug)) {
        const auto us = [](steady_time from, steady_time to) {
            return str(std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
        };
        // queued: waiting for the claim thread; claim: the statements'
        // round trips; handoff: back to the event loop.
        log::debug("claimed", {{"count", str(static_cast<std::int64_t>(events.size()))},
                               {"queued_us", us(claim_asked_, result.started)},
                               {"claim_us", us(result.started, result.done)},
                               {"handoff_us", us(result.done, clock_.steady())}});
    }
    fit_capacity();
    // From when the claim began, not when it came back: the database's lease
    // started at its statement's now(), and the statements (which may wait
    // on another claim's key hold) and the hand-off take time.
    const auto lease_end = result.started + cfg_.lease;
    const auto claimed_count = events.size();
    // Followers wait for their run's first event, in id order (the claim's
    // rows come in no particular order).
    std::map<std::int64_t, std::vector<ready_item>> followers;  // by run head
    std::set<std::int64_t> keyed_claimed;
    for (auto& e : events) {
        ledger_.claimed(e);
        const auto head = e.run_head;
        if (!head && e.ordering_key) keyed_claimed.insert(e.id);
        ready_item item{std::make_shared<const event>(std::move(e)), lease_end};
        if (head) {
            followers[*head].push_back(std::move(item));
        } else {
            ready_.push_back(std::move(item));
        }
    }
    std::vector<ready_item> orphans;
    for (auto& [head, items] : followers) {
        std::sort(items.begin(), items.end(), [](const ready_item& x, const ready_item& y) { return x.e->id < y.e->id; });
        if (keyed_claimed.contains(head)) {
            std::move(items.begin(), items.end(), std::back_inserter(runs_[head]));
        } else {
            std::move(items.begin(), items.end(), std::back_inserter(orphans));
        }
    }
    // Window events take the slots the claim asked for and deliveries left.
    const auto free = dispatch_.slots() > dispatch_.in_flight() ? dispatch_.slots() - dispatch_.in_flight() : 0;
    const auto got = claimed_count + (reader_ ? queue_window_steps(free > claimed_count ? free - claimed_count : 0) : 0);
    // The dispatcher reads "got as many as asked" as "more may be due".
    // (Events read and held back for their key are not "more": they go out
    // as their keys settle, pull_window(), with no read.)
    const bool more = result.full || page_full;
    // Counted as held before any is delivered: an event that cannot be sent
    // finishes at once inside pump().
    const auto next = dispatch_.on_claimed(got, more ? got : got + 1);
    hand_back_orphans(orphans);
    pump();
    // Judged before the next claim, which takes what a lane has free now.
    const bool owed = owes_delivery_claim();
    start_claim(next);
    if (owed && !dispatch_.claiming()) wake();
    maybe_finish();
    // Retries and delayed events fire on time, not at the next sweep. If an
    // outcome was recorded while the claim ran, its snapshot may predate a
    // retry just written (it saw that row still leased, due at the lease's
    // end): then its answer may only bring the timer forward. Counted from
    // when the claim began, not from its answer: "due in 300 ms" was
    // measured at its statement's now(), and a claim that took a second
    // (a lock wait, a slow server) would otherwise fire that much late. Its
    // statement may have begun a little after `started`: the timer fires at
    // most that much early, and the claim it starts answers the rest.
    if (!dispatch_.stopping() && result.next_due) {
        arm_next_due(*result.next_due, next_due_authoritative, result.started);
    }
}

void relay_engine::claim_failed(const std::string& why) {
    (void)dispatch_.on_claim_failed();
    if (reader_) reader_->read_failed();
    confirming_ = false;
    // It may have committed and lost only its answer (the connection died).
    claim_answer_unknown_ = true;
    claim_backing_off_ = true;
    apply_resets_after_claim();
    if (metrics_ != nullptr) metrics_->claim_failed(why);
    const auto delay = claim_backoff_.next();
    log::warn("claim failed; retrying", {{"error", why}, {"retry_in", format_duration(delay)}});
    maybe_finish();
    if (dispatch_.stopping()) return;
    arm(relay_timer::claim_retry, clock_.steady() + delay);
}

// What a backlog drain left behind its watermark, or a key unblocked behind
// the low mark, is found by a claim that starts further back.
void relay_engine::reset_claim_marks(bool watermark_too) {
    if (dispatch_.claiming()) {
        reset_after_claim_ = std::max(reset_after_claim_, watermark_too ? 2 : 1);
        return;
    }
    low_mark_ = low_mark_from_start(low_mark_);
    if (watermark_too) drain_watermark_.reset();
}

void relay_engine::apply_resets_after_claim() {
    if (reach_after_claim_) low_mark_ = low_mark_reaching(low_mark_, *std::exchange(reach_after_claim_, std::nullopt));
    if (reset_after_claim_ == 0) return;
    low_mark_ = low_mark_from_start(low_mark_);
    if (reset_after_claim_ == 2) drain_watermark_.reset();
    reset_after_claim_ = 0;
}

// How many events to hold and claim at once (see core/claim_capacity.hpp).
void relay_engine::fit_capacity() {
    const auto c = capacity_for(cfg_.concurrency, delivery_rate_.per_second(clock_.steady()),
                                cfg_.lease - longest_attempt_, largest_claim);
    dispatch_.resize(c.slots, c.batch);
}

// Starts claimed events, oldest first, while delivery slots are free.
void relay_engine::pump() {
    if (pumping_) return;  // called again by finished() inside deliver()
    pumping_ = true;
    while (sending_ < cfg_.concurrency && !ready_.empty() && !finishing_) {
        auto next = std::move(ready_.front());
        ready_.pop_front();
        if (!next.e->window_slot && clock_.steady() > next.lease_end - longest_attempt_) {
            // It waited behind requests that hung until their timeouts: an
            // attempt now might outlast the lease and race the relay that
            // claims it next. Not sent: handed back, due now, its attempt
            // not counted.
            log::warn("claimed event waited too long for a delivery slot; handed back unsent",
                      {{"event_id", str(next.e->id)}});
            hand_back(*next.e, milliseconds(0));
            (void)next_in_run(*next.e, false);
            flush_outcomes();
            start_claim(dispatch_.on_delivery_finished());
            continue;
        }
        ++sending_;
        deliver(std::move(next.e), next.lease_end);
    }
    pumping_ = false;
}

// The next-due timer: exact retries and delayed events. `replace` when the
// database's answer is authoritative; otherwise only ever earlier.
void relay_engine::arm_next_due(milliseconds in, bool replace, steady_time from) {
    // Nothing further than the next sweep needs a timer: the sweep claims
    // then anyway. Also keeps from + in from overflowing for an event due
    // centuries ahead.
    const auto when = from + std::clamp(in, milliseconds(0), cfg_.sweep_interval);
    if (!replace && next_due_armed_ && next_due_at_ <= when) return;
    next_due_armed_ = true;
    next_due_at_ = when;
    arm(relay_timer::next_due, when);
}

void relay_engine::sweep() {
    if (dispatch_.stopping()) return;
    // What committed late behind the low mark: this claim starts from the
    // beginning of the index.
    reset_claim_marks(false);
    if (metrics_ != nullptr) metrics_->woken(wake_source::sweep);
    take_cursors();
    wake();
    if (cfg_.idempotency_retention.count() > 0) emit(housekeeping_command{housekeeping_job::idempotency_keys});
    emit(housekeeping_command{housekeeping_job::key_holds});
    emit(housekeeping_command{housekeeping_job::orphan_deliveries});
    if (cfg_.dead_letter_retention.count() > 0) emit(housekeeping_command{housekeeping_job::dead_letters});
    arm(relay_timer::sweep, clock_.steady() + cfg_.sweep_interval);
}

// One purge batch per job: a full one queues the next behind whatever
// outcomes are waiting, so a large purge never delays them for long.
void relay_engine::dead_letters_purged(bool more) {
    if (more && !dispatch_.stopping()) emit(housekeeping_command{housekeeping_job::dead_letters});
}

// ---- delivering --------------------------------------------------------------

void relay_engine::finished(bool slot_given_up) {
    if (slot_given_up) {
        --slow_in_flight_;
    } else {
        --sending_;
    }
    delivery_rate_.record(clock_.steady());
    flush_outcomes();
    pump();
    fit_capacity();
    if (!slot_given_up) start_claim(dispatch_.on_delivery_finished());
    pull_window();
    pump();
    maybe_finish();
}

void relay_engine::watch_slow(std::uint64_t send_id) {
    slow_watch_.emplace_back(clock_.steady() + slow_request_after, send_id);
    if (!slow_timer_armed_) {
        slow_timer_armed_ = true;
        arm(relay_timer::slow_requests, slow_watch_.front().first);
    }
}

void relay_engine::give_up_slots_of_slow_requests() {
    slow_timer_armed_ = false;
    const auto now = clock_.steady();
    while (!slow_watch_.empty() && slow_watch_.front().first <= now) {
        const auto id = slow_watch_.front().second;
        slow_watch_.pop_front();
        const auto it = sends_.find(id);
        if (it == sends_.end()) continue;  // answered in time
        auto& w = it->second;
        bool& given_up = w.direct ? w.direct->slot_given_up : w.owed->slot_given_up;
        if (given_up) continue;
        given_up = true;
        --sending_;
        ++slow_in_flight_;
        pump();
        start_claim(dispatch_.on_delivery_finished());
    }
    if (!slow_watch_.empty()) {
        // Not at the next deadline: in a drain that is a few microseconds
        // away, and every send would cost a timer syscall and a wake-up.
        slow_timer_armed_ = true;
        arm(relay_timer::slow_requests, std::max(slow_watch_.front().first, now + slow_check_interval));
    }
}

void relay_engine::deliver(std::shared_ptr<const event> e, steady_time lease_end) {
    const auto unix_now =
        std::chrono::duration_cast<std::chrono::seconds>(clock_.wall().time_since_epoch()).count();
    auto built = e->undecodable ? request_headers_result{{}, e->undecodable}
                                : build_request_headers(*e, unix_now, message_prefix_);
    if (e->destination) {
        if (built.error) {
            // Nothing about this event can change: dead-letter it there now.
            log::error("delivery cannot be sent; moving to dead letters",
                       {{"event_id", str(e->id)}, {"topic", e->topic}, {"destination", *e->destination},
                        {"attempt", str(e->attempt)}, {"error", *built.error}});
            report(*e->destination, delivery_result::dead, e->attempt, *e, lease_end);
            record_owed({e->id, *e->destination, e->attempt}, e->ordering_key.has_value(),
                        {0, {delivery_outcome::kind::dead, {}, *built.error}, std::nullopt, {}});
            finished();
            return;
        }
        deliver_owed(std::move(e), std::move(built.headers), unix_now, lease_end);
        return;
    }
    const lease_ref ref = lease_of(*e);
    const bool keyed = e->ordering_key.has_value();
    if (built.error) {
        bury_unsendable(*e, *built.error);
        return;
    }
    const auto targets = e->only_to.empty() ? routes_.match(e->topic) : named_destinations(e->only_to);
    if (targets.empty() && e->only_to.empty()) {
        unroutable(*e);
        return;
    }
    if (const auto why = impossible_destination(e->only_to)) {
        // A name no destination can have can never be delivered (and no
        // delivery row may carry it).
        bury_unsendable(*e, *why);
        return;
    }
    if (targets.size() < e->only_to.size()) {
        // A replayed event owed to destinations of which this relay does not
        // know some: each gets its own delivery row, where a relay that knows
        // it delivers it (and a destination nobody knows holds back its key
        // there only, as any stalled destination). Not an attempt.
        fan_out_item item{ref, {}, {}};
        for (const auto& name : e->only_to) item.owed.push_back({name, milliseconds(0), e->attempt - 1, {}});
        record_fan_out(*e, std::move(item));
        finished();
        return;
    }
    if (e->key_pending) {
        // Earlier events of this key still wait at some destination: this one
        // queues behind them, at each destination on its own.
        fan_out_item item{ref, {}, {}};
        for (const auto i : targets) item.owed.push_back({cfg_.destinations[i].name, milliseconds(0), 0, {}});
        record_fan_out(*e, std::move(item));
        finished();
        return;
    }
    auto state = std::make_shared<event_in_flight>(event_in_flight{ref, keyed, 0, {}, {}, false, e, lease_end});
    // A destination that cannot take a request now (its connections are all
    // busy, or its circuit is open) does not get to hold this event's
    // delivery slot: the event is handed to its own delivery row there, due
    // now but claimed only once that destination can take it; other
    // destinations, and other events, go on. Answers never come back inside
    // send(), so `waiting` is complete before the first one.
    // (A send changes only its own destination's lane and circuit, so which
    // targets can take it is decided before any is sent.)
    std::vector<std::size_t> sendable;
    for (const auto i : targets) {
        if (can_send(i)) {
            sendable.push_back(i);
        } else {
            state->deferred.push_back(i);
        }
    }
    state->waiting = sendable.size();
    if (sendable.empty()) {
        settle(*state);
        return;
    }
    // The headers are copied for all but the last target, which takes them.
    for (std::size_t k = 0; k + 1 < sendable.size(); ++k) {
        send(sendable[k], e, built.headers, unix_now, lease_end, {sendable[k], state, std::nullopt});
    }
    send(sendable.back(), std::move(e), std::move(built.headers), unix_now, lease_end,
         {sendable.back(), state, std::nullopt});
}

void relay_engine::deliver_owed(std::shared_ptr<const event> e, header_list headers, std::int64_t unix_now,
                                steady_time lease_end) {
    const delivery_ref ref{e->id, *e->destination, e->attempt};
    const bool keyed = e->ordering_key.has_value();
    const auto it = std::find_if(cfg_.destinations.begin(), cfg_.destinations.end(),
                                 [&](const destination_config& d) { return d.name == *e->destination; });
    if (it == cfg_.destinations.end()) {
        // Cannot happen: claims ask only for our destinations. Should it, the
        // delivery is not sent but handed back due now.
        log::warn("delivery for a destination this relay does not know; handed back",
                  {{"event_id", str(e->id)}, {"destination", *e->destination}});
        pending_.deliveries.retries.push_back(
            {ref, milliseconds(0), fmt::format("destination {} is not in this relay's configuration", *e->destination)});
        finished();
        return;
    }
    const auto i = static_cast<std::size_t>(it - cfg_.destinations.begin());
    if (!circuits_[i].allows_request(clock_.steady())) {
        hand_back_to_circuit(*e, i);
        return;
    }
    if (!lanes_[i].full()) {
        owed_item item{e, ref, keyed, {}, unix_now, lease_end};
        send(i, std::move(e), std::move(headers), unix_now, lease_end, {i, nullptr, std::move(item)});
        return;
    }
    owed_item item{std::move(e), ref, keyed, std::move(headers), unix_now, lease_end};
    // Claimed just before its destination filled up: wait here for a
    // connection, but only as long as the request still fits in the lease.
    lanes_[i].waiting.push_back(std::move(item));
}

// Signs and sends one request to destination `i` now (a free connection is
// the caller's business). The attempt ends a little before the lease does,
// so its outcome is recorded while the lease is still ours.
void relay_engine::send(std::size_t i, std::shared_ptr<const event> e, header_list headers, std::int64_t unix_now,
                        steady_time lease_end, send_waiter waiter) {
    const auto& d = cfg_.destinations[i];
    add_destination_headers(headers, d.headers);
    if (!d.signing_secrets.empty()) {
        // Signs exactly what is sent: the webhook-id and -timestamp and the body.
        headers.emplace_back("webhook-signature",
                             sign_webhook(d.signing_secrets, headers.front().second, unix_now, e->payload));
    }
    ++lanes_[i].busy;
    circuits_[i].on_request();
    const auto deadline = lease_end - std::min(cfg_.lease / 10, milliseconds(1000));
    const auto id = next_send_id_++;
    sends_.emplace(id, std::move(waiter));
    watch_slow(id);
    emit(send_command{id, i, std::move(e), std::move(headers), deadline});
}

void relay_engine::sent(std::uint64_t send_id, send_result result) {
    if (finishing_) return;  // shutdown timed out: the lease release covers this delivery
    const auto it = sends_.find(send_id);
    if (it == sends_.end()) return;
    auto waiter = std::move(it->second);
    sends_.erase(it);
    judge_health(waiter.destination, result);
    lane_freed(waiter.destination);
    if (waiter.direct) {
        on_event_result(*waiter.direct, waiter.destination, result);
    } else {
        on_owed_result(*waiter.owed, waiter.destination, result);
    }
}

void relay_engine::lane_freed(std::size_t i) {
    auto& lane = lanes_[i];
    const bool was_full = lane.full();
    --lane.busy;
    if (!lane.waiting.empty()) {
        auto next = std::move(lane.waiting.front());
        lane.waiting.pop_front();
        start_waiting(i, std::move(next));
    } else if (was_full && owes_delivery_claim()) {
        wake();
    }
}

// Whether a claim is owed to a destination's deliveries now: the last claim
// left them out (the destination had no free connection), it saw deliveries
// due, and a connection is free again. Only then: a lane that fills and
// frees again and again (a claim larger than the destination's connections,
// a relay claiming as its wake policy says) would otherwise start a claim at
// each first free connection, whatever its policy; under 32 producers that
// was 2 claims in 5, of fewer events each (bench/results/
// lane-wake-2026-12-04.md). A claim still running is judged when it comes
// back (claimed()): its answer may see deliveries due.
bool relay_engine::owes_delivery_claim() const {
    if (!deliveries_due_ || dispatch_.claiming()) return false;
    return std::any_of(lanes_.begin(), lanes_.end(), [](const lane& l) { return l.passed_over && !l.full(); });
}

bool relay_engine::can_send(std::size_t i) { return !lanes_[i].full() && circuits_[i].allows_request(clock_.steady()); }

std::size_t relay_engine::free_connections(std::size_t i) {
    if (lanes_[i].full() || !circuits_[i].allows_request(clock_.steady())) return 0;
    if (circuits_[i].state(clock_.steady()) == circuit_state::probing) return 1;
    return lanes_[i].limit - lanes_[i].busy;
}

// What the answer says of the destination's health (core/circuit_breaker.hpp).
void relay_engine::judge_health(std::size_t i, const send_result& r) {
    const auto now = clock_.steady();
    auto& circuit = circuits_[i];
    const auto before = circuit.state(now);
    const bool closed = circuit.on_answer(health_of(r.transport_error, r.status), now);
    const auto& name = cfg_.destinations[i].name;
    if (closed) {
        log::info("destination recovered; circuit closed, its waiting deliveries are due now",
                  {{"destination", name}});
        emit(circuit_changed_command{name, circuit_state::closed, 0});
        emit(release_deliveries_command{name, false});
        return;
    }
    if (const auto at = circuit.probe_at(); at && (before == circuit_state::closed || *at > now)) {
        if (before == circuit_state::closed) {
            log::warn("destination failing; circuit open: its deliveries wait in the outbox until a probe succeeds",
                      {{"destination", name},
                       {"failures", str(static_cast<std::int64_t>(circuit.consecutive_failures()))},
                       {"probe_in", format_duration(std::chrono::duration_cast<milliseconds>(*at - now))}});
            emit(circuit_changed_command{name, circuit_state::open, circuit.consecutive_failures()});
        }
        arm_probe();
    }
}

// The probe timer: at the earliest time an open circuit may probe.
void relay_engine::arm_probe() {
    if (dispatch_.stopping()) return;
    const auto now = clock_.steady();
    std::optional<steady_time> earliest;
    for (const auto& c : circuits_) {
        if (const auto at = c.probe_at(); at && *at > now && (!earliest || *at < *earliest)) earliest = at;
    }
    if (earliest) arm(relay_timer::circuit_probe, *earliest);
}

// Back to the outbox unsent, due after `delay`, the claim's attempt taken back.
void relay_engine::hand_back(const event& e, milliseconds delay) {
    // Not leased: nothing to give back; the cursor stays below it, so its
    // next reader sends it.
    if (e.window_slot) return;
    report(e.destination.value_or(""), delivery_result::handed_back, 0, e, {});
    if (e.destination) {
        pending_.deliveries_handed_back.push_back({{e.id, *e.destination, e.attempt}, delay, {}});
    } else {
        pending_.handed_back.push_back({lease_of(e), delay, {}});
    }
    pending_.unblocks_key = pending_.unblocks_key || e.ordering_key.has_value();
}

// A claimed delivery its destination's open circuit will not take (claimed
// just before it opened): due again when the circuit probes.
void relay_engine::hand_back_to_circuit(const event& e, std::size_t i) {
    const auto at = circuits_[i].probe_at().value_or(clock_.steady());
    hand_back(e, std::chrono::ceil<milliseconds>(std::max(at - clock_.steady(), steady_time::duration(0))));
    finished();
}

// A delivery that waited in its destination's lane gets a connection.
void relay_engine::start_waiting(std::size_t i, owed_item item) {
    const auto& d = cfg_.destinations[i];
    const bool circuit_open = !circuits_[i].allows_request(clock_.steady());
    if (circuit_open || clock_.steady() > item.lease_end - d.connect_timeout - d.request_timeout) {
        // Its circuit opened while it waited, or no connection came free
        // while the request would still fit in the lease: not sent.
        if (circuit_open) {
            hand_back_to_circuit(*item.e, i);
        } else {
            hand_back(*item.e, milliseconds(0));
            finished();
        }
        // The connection was not used: the next waiting delivery may take it.
        ++lanes_[i].busy;
        lane_freed(i);
        return;
    }
    auto e = item.e;
    auto headers = std::move(item.headers);  // the waiter needs only the rest
    const auto unix_now = item.unix_now;
    const auto lease_end = item.lease_end;
    send(i, std::move(e), std::move(headers), unix_now, lease_end, {i, nullptr, std::move(item)});
}

relay_engine::destination_result relay_engine::judge(std::size_t i, std::int32_t attempt, const send_result& r) {
    const attempt_report report{r.transport_error, r.status, r.error, r.retry_after, r.body_excerpt};
    auto outcome = classify_attempt(report, attempt, cfg_.destinations[i].retry, unit_(rng_), clock_.wall());
    // The response excerpt is kept only where it is written: in a dead letter.
    auto excerpt = outcome.what == delivery_outcome::kind::dead ? r.body_excerpt : std::string{};
    return {i, std::move(outcome), r.transport_error ? std::nullopt : std::optional<int>(static_cast<int>(r.status)),
            std::move(excerpt)};
}

void relay_engine::log_result(const event& e, const destination_result& res, std::int32_t attempt,
                              std::chrono::microseconds elapsed) const {
    // Per event: build the fields only when the line is written.
    if (res.outcome.what == delivery_outcome::kind::delivered && !log::enabled(log::level::debug)) return;
    const auto& name = cfg_.destinations[res.destination].name;
    const auto status = res.status ? str(*res.status) : std::string("none");
    switch (res.outcome.what) {
        case delivery_outcome::kind::delivered:
            log::debug("delivered", {{"event_id", str(e.id)}, {"topic", e.topic}, {"destination", name},
                                     {"attempt", str(attempt)}, {"status", status}, {"us", str(elapsed.count())}});
            break;
        case delivery_outcome::kind::retry:
            log::warn("delivery failed; will retry",
                      {{"event_id", str(e.id)}, {"topic", e.topic}, {"destination", name}, {"attempt", str(attempt)},
                       {"status", status}, {"retry_in", format_duration(res.outcome.retry_in)},
                       {"error", res.outcome.error}});
            break;
        case delivery_outcome::kind::dead:
            log::error("delivery failed for good; moving to dead letters",
                       {{"event_id", str(e.id)}, {"topic", e.topic}, {"destination", name}, {"attempt", str(attempt)},
                        {"status", status}, {"error", res.outcome.error}});
            break;
    }
}

void relay_engine::report(std::string_view destination, delivery_result r, std::int32_t attempt, const event& e,
                          steady_time lease_end) {
    if (metrics_ == nullptr) return;
    std::optional<std::chrono::microseconds> since_commit;
    if (r == delivery_result::delivered && e.age_at_claim) {
        // The claim's statement began at about lease_end - lease.
        since_commit = *e.age_at_claim + std::chrono::duration_cast<std::chrono::microseconds>(
                                             clock_.steady() - (lease_end - cfg_.lease));
    }
    metrics_->delivery(destination, r, attempt, since_commit);
}

// One destination answered for an event sent straight from `events`.
void relay_engine::on_event_result(event_in_flight& state, std::size_t i, const send_result& r) {
    auto res = judge(i, state.ref.attempt, r);
    log_result(*state.e, res, state.ref.attempt, r.elapsed);
    report(cfg_.destinations[i].name, result_of(res.outcome.what), state.ref.attempt, *state.e, state.lease_end);
    if (res.outcome.what != delivery_outcome::kind::delivered) state.failures.push_back(std::move(res));
    if (--state.waiting > 0) return;
    settle(state);
}

// One destination answered for a fanned-out delivery.
void relay_engine::on_owed_result(const owed_item& item, std::size_t i, const send_result& r) {
    auto res = judge(i, item.ref.attempt, r);
    log_result(*item.e, res, item.ref.attempt, r.elapsed);
    report(cfg_.destinations[i].name, result_of(res.outcome.what), item.ref.attempt, *item.e, item.lease_end);
    record_owed(item.ref, item.keyed, res);
    finished(item.slot_given_up);
}

// Every destination of a directly sent event has answered (or was deferred).
void relay_engine::settle(const event_in_flight& state) {
    const bool delivered = state.failures.empty() && state.deferred.empty();
    if (delivered) {
        record_delivered(*state.e, state.ref);
    } else {
        // From here each failed destination keeps its own schedule; the ones
        // that accepted the event are done with it for good.
        fan_out_item item{state.ref, {}, {}};
        for (const auto& f : state.failures) {
            const auto& name = cfg_.destinations[f.destination].name;
            if (f.outcome.what == delivery_outcome::kind::retry) {
                item.owed.push_back({name, f.outcome.retry_in, state.ref.attempt, f.outcome.error});
            } else {
                item.dead.push_back({name, state.ref.attempt, f.outcome.error, f.status, f.excerpt});
            }
        }
        for (const auto i : state.deferred) {
            // Not attempted there: the attempt count stays where it was.
            item.owed.push_back({cfg_.destinations[i].name, milliseconds(0), state.ref.attempt - 1, {}});
            report(cfg_.destinations[i].name, delivery_result::handed_back, 0, *state.e, state.lease_end);
        }
        for (const auto& o : item.owed) retry_after_flush(o.due_in);
        record_fan_out(*state.e, std::move(item));
    }
    // A window event's key is sequenced in memory, and a run's next event
    // is leased already: nothing to unblock.
    const bool run_goes_on = next_in_run(*state.e, delivered);
    if (!state.e->window_slot && !run_goes_on) pending_.unblocks_key = pending_.unblocks_key || state.keyed;
    finished(state.slot_given_up);
}

bool relay_engine::next_in_run(const event& e, bool delivered) {
    if (e.window_slot) return false;
    const auto it = runs_.find(e.run_head.value_or(e.id));
    if (it == runs_.end()) return false;
    auto& rest = it->second;
    if (delivered && !dispatch_.stopping()) {
        // In front: the run's next event goes out as this one's slot frees.
        ready_.push_front(std::move(rest.front()));
        rest.pop_front();
        if (rest.empty()) runs_.erase(it);
        return true;
    }
    // (A size the dispatcher answers is a claim it counts as started.)
    for (const auto& item : rest) {
        hand_back(*item.e, milliseconds(0));
        start_claim(dispatch_.on_delivery_finished());
    }
    runs_.erase(it);
    return false;
}

void relay_engine::hand_back_orphans(std::vector<ready_item>& orphans) {
    for (const auto& item : orphans) {
        hand_back(*item.e, milliseconds(0));
        start_claim(dispatch_.on_delivery_finished());
    }
    if (!orphans.empty()) flush_outcomes();
}

void relay_engine::record_owed(const delivery_ref& ref, bool keyed, const destination_result& res) {
    switch (res.outcome.what) {
        case delivery_outcome::kind::delivered:
            pending_.deliveries.delivered.push_back(ref);
            pending_.unblocks_key = pending_.unblocks_key || keyed;
            break;
        case delivery_outcome::kind::retry:
            retry_after_flush(res.outcome.retry_in);
            pending_.deliveries.retries.push_back({ref, res.outcome.retry_in, res.outcome.error});
            break;
        case delivery_outcome::kind::dead:
            pending_.deliveries.dead.push_back({ref, res.outcome.error, res.status, res.excerpt});
            pending_.unblocks_key = pending_.unblocks_key || keyed;
            break;
    }
}

// A retry is due in `in` once the pending outcomes are recorded.
void relay_engine::retry_after_flush(milliseconds in) {
    arm_due_after_flush_ = std::min(arm_due_after_flush_.value_or(in), in);
}

// Indices of the configured destinations with these names (a replayed event
// owed to some destinations only).
std::vector<std::size_t> relay_engine::named_destinations(const std::vector<std::string>& names) const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < cfg_.destinations.size(); ++i) {
        if (std::find(names.begin(), names.end(), cfg_.destinations[i].name) != names.end()) out.push_back(i);
    }
    return out;
}

// A whole event that can never be sent as it is: a dead letter now, with the
// reason; the rest of its key goes on.
void relay_engine::bury_unsendable(const event& e, const std::string& why) {
    log::error("event cannot be sent; moving to dead letters",
               {{"event_id", str(e.id)}, {"topic", e.topic}, {"attempt", str(e.attempt)}, {"error", why}});
    report("", delivery_result::dead, e.attempt, e, {});
    if (e.window_slot) {
        record_fan_out(e, {lease_of(e), {}, {{"", e.attempt, why, std::nullopt, {}}}});
    } else {
        pending_.dead.push_back({lease_of(e), why, std::nullopt, {}});
        pending_.unblocks_key = pending_.unblocks_key || e.ordering_key.has_value();
        (void)next_in_run(e, false);
    }
    finished();
}

// No route matches the topic. Not lost: the event stays in the outbox,
// retried on the [defaults.retry] schedule with the reason in last_error
// (shown by `outboxd status`), so a relay with a newer configuration picks it
// up; when the attempts run out it becomes a dead letter, to be replayed.
// With an ordering key it would hold back every later event of its key
// meanwhile: it becomes a dead letter at once instead.
void relay_engine::unroutable(const event& e) {
    const auto why = no_route_error(e.topic);
    if (e.window_slot) {
        // A window event has no row of its own to wait in (the cursor moves
        // past it): a dead letter at once, to be replayed.
        bury_unsendable(e, fmt::format("{}; dead-lettered at once (replay it once a route matches)", why));
        return;
    }
    if (e.ordering_key) {
        bury_unsendable(e, fmt::format("{}; dead-lettered at once so that it does not hold back the later events "
                                       "of its ordering key (replay it once a route matches)",
                                       why));
        return;
    }
    const auto outcome = classify_attempt({true, 0, why, {}, {}}, e.attempt, cfg_.default_retry, unit_(rng_),
                                          clock_.wall());
    log::warn("no route for event; it stays in the outbox",
              {{"event_id", str(e.id)}, {"topic", e.topic}, {"attempt", str(e.attempt)}});
    const lease_ref ref = lease_of(e);
    report("", result_of(outcome.what), e.attempt, e, {});
    if (outcome.what == delivery_outcome::kind::dead) {
        pending_.dead.push_back({ref, outcome.error, std::nullopt, {}});
    } else {
        retry_after_flush(outcome.retry_in);
        pending_.retries.push_back({ref, outcome.retry_in, outcome.error});
    }
    finished();
}

// ---- recording outcomes ------------------------------------------------------

bool relay_engine::write_outcomes_now() const {
    const bool more_coming = sending_ > 0 || slow_in_flight_ > 0 || !ready_.empty();
    return !more_coming || pending_.size() >= outcome_gather_size || pending_.unblocks_key || dispatch_.stopping();
}

void relay_engine::flush_outcomes(bool gathered) {
    if (writing_ || flush_backing_off_ || pending_.empty() || finishing_) return;
    if (!gathered && !write_outcomes_now()) {
        if (!gathering_) {
            gathering_ = true;
            arm(relay_timer::outcome_gather, clock_.steady() + outcome_gather_window);
        }
        return;
    }
    if (gathering_) {
        gathering_ = false;
        cancel(relay_timer::outcome_gather);
    }
    // A bounded write: one that grew without bound (a writer fallen behind a
    // fast destination) could outlast the statement timeout and, failing,
    // outlive the leases it records (every event then sent again).
    writing_ = std::make_shared<const outcome_batch>(pending_.size() > most_outcomes_per_write
                                                         ? pending_.take_front(most_outcomes_per_write)
                                                         : std::exchange(pending_, {}));
    writing_retry_in_ = std::exchange(arm_due_after_flush_, std::nullopt);
    writing_since_ = clock_.steady();
    emit(write_outcomes_command{writing_});
}

void relay_engine::outcomes_written(std::size_t fenced) {
    if (!writing_) return;
    const auto batch = std::exchange(writing_, nullptr);
    const auto retry_in = std::exchange(writing_retry_in_, std::nullopt);
    ledger_.recorded(*batch);
    ++flushes_recorded_;
    flush_backoff_.reset();
    if (fenced > 0) {
        log::warn("lease lost before the outcome was recorded; the event's new holder delivers it again",
                  {{"outcomes", str(static_cast<std::int64_t>(fenced))}});
    }
    // From when the write was issued: its statement set the retry's time
    // from its own now(), a little after that, never before.
    if (retry_in && !dispatch_.stopping()) arm_next_due(*retry_in, false, writing_since_);
    if (reader_ && !batch->parks.empty()) {
        // Recorded: those events settle, their keys' later events may go, and
        // their delivery rows are due (at their times) for the next claim.
        for (const auto& p : batch->parks) reader_->settled(p.id);
        deliveries_due_ = true;
        pull_window();
        pump();
    }
    // A keyed event finished: the next event of its key may be due, and may
    // be behind the drain watermark or the low mark (it was skipped while
    // blocked): the next claim starts from the beginning.
    if (batch->unblocks_key) reset_claim_marks(true);
    // Deliveries written due now: the next claim looks for them, and one
    // starts now.
    const bool owes_now = batch->owes_deliveries_now();
    if (owes_now) deliveries_due_ = true;
    start_claim(dispatch_.on_outcomes_recorded(batch->unblocks_key || owes_now));
    flush_outcomes();
    maybe_finish();
}

void relay_engine::outcomes_failed(const std::string& why) {
    if (!writing_) return;
    // Kept, in front of what finished meanwhile: outcomes are fenced and
    // idempotent, writing them again is safe.
    auto again = *std::exchange(writing_, nullptr);
    again.append(std::exchange(pending_, {}));
    pending_ = std::move(again);
    if (const auto retry_in = std::exchange(writing_retry_in_, std::nullopt)) retry_after_flush(*retry_in);
    const auto delay = flush_backoff_.next();
    log::warn("recording outcomes failed; retrying", {{"error", why}, {"retry_in", format_duration(delay)}});
    // Nothing is written before then, however many outcomes come in.
    flush_backing_off_ = true;
    arm(relay_timer::flush_retry, clock_.steady() + delay);
}

// ---- shutdown ------------------------------------------------------------------

void relay_engine::signalled(int signal_number) {
    if (dispatch_.stopping()) {
        log::warn("second signal: exiting now; unfinished leases expire on their own",
                  {{"signal", str(signal_number)}});
        emit(exit_now_command{});
        return;
    }
    log::info("shutting down: no new claims, finishing in-flight deliveries",
              {{"signal", str(signal_number)}, {"in_flight", str(static_cast<std::int64_t>(dispatch_.in_flight()))},
               {"timeout", format_duration(cfg_.shutdown_timeout)}});
    stop_claiming(false);
}

void relay_engine::reload_requested() {
    if (dispatch_.stopping()) return;
    log::info("reloading: no new claims until in-flight deliveries finish under the old configuration",
              {{"in_flight", str(static_cast<std::int64_t>(dispatch_.in_flight()))},
               {"timeout", format_duration(cfg_.shutdown_timeout)}});
    stop_claiming(true);
}

void relay_engine::stop_claiming(bool keep_listening) {
    dispatch_.on_stop();
    // Not started yet: handed back unsent, due now, their attempts not
    // counted (window events are simply not sent: their cursor stays below).
    for (; !ready_.empty(); ready_.pop_front()) {
        hand_back(*ready_.front().e, milliseconds(0));
        (void)dispatch_.on_delivery_finished();
    }
    for (const auto& [head, rest] : runs_) {
        for (const auto& item : rest) {
            hand_back(*item.e, milliseconds(0));
            (void)dispatch_.on_delivery_finished();
        }
    }
    runs_.clear();
    flush_outcomes();
    if (!keep_listening) emit(stop_listening_command{});
    cancel(relay_timer::sweep);
    cancel(relay_timer::next_due);
    cancel(relay_timer::claim_retry);
    cancel(relay_timer::takeover);
    cancel(relay_timer::checkpoint);
    arm(relay_timer::shutdown, clock_.steady() + cfg_.shutdown_timeout);
    maybe_finish();
}

// --once: see the header comment.
void relay_engine::check_drained() {
    if (mode_ != run_mode::once || dispatch_.stopping() || dispatch_.claiming() || dispatch_.in_flight() > 0 ||
        slow_in_flight_ > 0 || !ready_.empty() || writing_ || !pending_.empty() || claim_backing_off_ ||
        (reader_ && (reader_->queued() > 0 || reader_->in_flight() > 0 || taking_cursors_))) {
        return;
    }
    if (confirmed_empty_) {
        log::info("run --once: nothing left that is due; stopping");
        stop_claiming(false);
        return;
    }
    // What a drain watermark or low mark skipped, or deliveries the last
    // claim did not look for, are found by a claim from the beginning.
    reset_claim_marks(true);
    deliveries_due_ = true;
    confirming_ = true;
    start_claim(dispatch_.on_wake());
}

void relay_engine::maybe_finish() {
    check_drained();
    if (dispatch_.drained() && slow_in_flight_ == 0 && !writing_ && pending_.empty()) finish();
}

// Writes what is left, hands back every lease we still hold (due now, so the
// next relay need not wait for expiry), and stops.
void relay_engine::finish() {
    if (finishing_) return;
    finishing_ = true;
    cancel(relay_timer::shutdown);
    cancel(relay_timer::flush_retry);
    // A write still running (a timed-out shutdown) is written again with the
    // rest: writing an outcome twice changes nothing.
    outcome_batch last;
    if (writing_) last = *std::exchange(writing_, nullptr);
    last.append(std::exchange(pending_, {}));
    // Parks in `last` are not settled in the reader (not recorded yet): the
    // position stays below them, and their next reader settles them again.
    emit(finish_command{std::move(last), reader_ ? reader_->position() : std::nullopt});
}

// ---- windows -------------------------------------------------------------------

void relay_engine::take_cursors() {
    if (!reader_ || taking_cursors_ || dispatch_.stopping()) return;
    taking_cursors_ = true;
    emit(take_cursors_command{reader_->slots()});
}

// More than our share (another relay registered since we took them): the
// surplus goes back at a window boundary, where nothing of it is unsettled.
void relay_engine::shed_surplus_cursors() {
    if (!reader_ || dispatch_.stopping() || checkpointing_ || reader_->slots_held() <= cursor_share_) return;
    if (auto shed = reader_->shed(reader_->slots_held() - cursor_share_)) {
        log::info("handing window cursors over to share them with other relays",
                  {{"slots", str(static_cast<std::int64_t>(shed->slots.size()))}});
        emit(release_cursors_command{std::move(*shed)});
    }
}

void relay_engine::cursors_taken(std::vector<taken_cursor> cursors, std::size_t share) {
    taking_cursors_ = false;
    cursor_share_ = std::max<std::size_t>(share, 1);
    // A relay registered since we took ours: the other relay takes the
    // surplus at its next poll, so hand it over now rather than at our next
    // tick, a second later.
    shed_surplus_cursors();
    if (!reader_ || cursors.empty()) {
        maybe_finish();
        return;
    }
    reader_->hold(cursors);
    log::info("reading commit-ordered windows", {{"slots", str(static_cast<std::int64_t>(cursors.size()))}});
    confirming_ = false;  // a claim running now read no window
    if (!dispatch_.stopping()) wake();
    maybe_finish();
}

void relay_engine::cursors_take_failed(const std::string& why) {
    taking_cursors_ = false;
    log::warn("taking the window cursors failed; trying again", {{"error", why}});
    maybe_finish();
}

void relay_engine::write_checkpoint() {
    if (!reader_ || checkpointing_) return;
    auto position = reader_->checkpoint();
    if (!position) return;
    const auto now = clock_.steady();
    const bool due = checkpoint_pacing_.due(position->snap_b.value_or(position->snap_a), now);
    if (const bool spaced = checkpoint_pacing_.spaced_out(now); spaced != checkpoints_spaced_out_) {
        // Said once each way: what a crash meanwhile costs is the operator's
        // to know (`outboxd status` names the transaction).
        checkpoints_spaced_out_ = spaced;
        if (spaced) {
            log::info("a transaction running long spaces out the window cursor checkpoints until it ends (a relay "
                      "killed meanwhile hands over an older position, and what it sent since is sent again)",
                      {{"xmin", fmt::format("{}", checkpoint_pacing_.held_xmin().value_or(0))},
                       {"running_for_more_than",
                        format_duration(checkpoint_pacing::interval * checkpoint_pacing::age_divisor)},
                       {"apart_at_most", format_duration(checkpoint_pacing::max_interval)}});
        } else {
            log::info("the long transaction ended: window cursor checkpoints once a second again");
        }
    }
    if (!due) return;
    checkpoint_pacing_.written(now);
    checkpointing_ = true;
    emit(checkpoint_command{std::move(*position)});
}

void relay_engine::checkpointed(const cursor_checkpoint& position, std::size_t written) {
    checkpointing_ = false;
    if (!reader_) return;
    if (written < position.slots.size()) {
        // Another relay took them (ours looked dead to it): what was read
        // under them is its to send again; ours would be fenced out.
        log::error("window cursors were taken over by another relay; no longer reading them",
                   {{"slots", str(static_cast<std::int64_t>(position.slots.size() - written))}});
        reader_->lose();
        return;
    }
    reader_->checkpoint_written(position);
    if (!cleaning_windows_ && !dispatch_.stopping()) {
        cleaning_windows_ = true;
        emit(housekeeping_command{housekeeping_job::window_cleanup});
    }
}

void relay_engine::checkpoint_failed(const std::string& why) {
    checkpointing_ = false;
    log::warn("checkpointing the window cursors failed; trying again", {{"error", why}});
}

void relay_engine::window_cleanup_done(bool more) {
    if (more && !dispatch_.stopping()) {
        emit(housekeeping_command{housekeeping_job::window_cleanup});
        return;
    }
    cleaning_windows_ = false;
}

std::size_t relay_engine::queue_window_steps(std::size_t max) {
    if (!reader_ || finishing_ || dispatch_.stopping() || max == 0) return 0;
    auto steps = reader_->take(max);
    // A window event has no lease: its attempt must end within the lease
    // only as a bound on how long a request may run.
    const auto until = clock_.steady() + cfg_.lease;
    for (auto& s : steps) {
        if (!s.park) {
            ready_.push_back({std::move(s.e), until});
            continue;
        }
        // Parked without a request: deliver() fans it out (key_pending).
        auto parked = std::make_shared<event>(*s.e);
        parked->key_pending = true;
        ready_.push_back({std::move(parked), until});
    }
    return steps.size();
}

void relay_engine::pull_window() {
    if (!reader_) return;
    // Slots a running claim asked for are its own.
    const auto taken = dispatch_.in_flight() + (dispatch_.claiming() ? claim_wanted_ : 0);
    dispatch_.on_taken(queue_window_steps(dispatch_.slots() > taken ? dispatch_.slots() - taken : 0));
    if (window_read_deferred_ && reader_->queued() < window_queue_limit / 2 && !dispatch_.stopping()) {
        window_read_deferred_ = false;
        start_claim(dispatch_.on_wake());
    }
}

void relay_engine::record_delivered(const event& e, const lease_ref& ref) {
    if (e.window_slot) {
        if (reader_) reader_->sent_ok(e.id);
        return;
    }
    pending_.delivered.push_back(ref);
}

void relay_engine::record_fan_out(const event& e, fan_out_item item) {
    if (!e.window_slot) {
        pending_.unblocks_key = pending_.unblocks_key || e.ordering_key.has_value();
        pending_.fan_outs.push_back(std::move(item));
        (void)next_in_run(e, false);
        return;
    }
    if (!reader_) return;
    const auto epoch = reader_->epoch_of(*e.window_slot);
    reader_->parking(e.id);
    if (!epoch) return;  // the cursor is lost: its new owner reads the event again
    pending_.parks.push_back({e.id, *epoch, std::move(item.owed), std::move(item.dead)});
    // Written at once: the deliveries it makes are what the key waits for.
    pending_.unblocks_key = true;
}

}  // namespace outboxd
