#include "app/relay.hpp"

#include <utility>  // before Asio

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <pqxx/except>

#include "app/exit_codes.hpp"
#include "app/sink.hpp"
#include "app/store_worker.hpp"
#include "core/claim_capacity.hpp"
#include "core/delivery_outcome.hpp"
#include "core/dispatcher.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/embedded_sql.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/rate_meter.hpp"
#include "core/routing.hpp"
#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "core/webhook_request.hpp"
#include "pg/listener.hpp"
#include "pg/store.hpp"

namespace outboxd::app {

namespace net = boost::asio;
using std::chrono::milliseconds;

namespace {

struct claim_timing {
    std::chrono::steady_clock::time_point asked, started, done;
};

// Backoff for our own database trouble (claims or outcome writes failing):
// quick first retry, then patient, never hammering a recovering server.
class db_backoff {
public:
    milliseconds next() {
        delay_ = delay_.count() == 0 ? milliseconds(100) : std::min(delay_ * 2, milliseconds(5'000));
        return delay_;
    }
    void reset() { delay_ = milliseconds(0); }

private:
    milliseconds delay_{0};
};

struct reschedule_item {
    pg::lease_ref ref;
    milliseconds delay;
    std::string error;
};

struct bury_item {
    pg::lease_ref ref;
    std::string error;
    std::optional<int> status;
    std::string excerpt;
};

struct fan_out_item {
    pg::lease_ref ref;
    std::vector<pg::owed_delivery> owed;
    std::vector<pg::dead_delivery> dead;
};

// Outcomes waiting to be written. Written in batches by one job at a time;
// kept (and retried) until the database has them, since each write is fenced
// and idempotent.
struct outcome_batch {
    // Events sent straight from `events` and accepted by every destination.
    std::vector<pg::lease_ref> delivered;
    // Whole events: no route matched, or they cannot be sent at all.
    std::vector<reschedule_item> retries;
    std::vector<bury_item> dead;
    // Events some destination failed (or that must queue behind their key).
    std::vector<fan_out_item> fan_outs;
    // One destination's delivery of a fanned-out event.
    pg::delivery_outcomes deliveries;
    // Something keyed finished (delivered or dead) or was fanned out: the
    // next event of that key may be due once this is recorded.
    bool unblocks_key = false;

    [[nodiscard]] bool empty() const {
        return delivered.empty() && retries.empty() && dead.empty() && fan_outs.empty() && deliveries.empty();
    }
    void append(outcome_batch&& other) {
        auto move_all = [](auto& to, auto& from) { std::move(from.begin(), from.end(), std::back_inserter(to)); };
        move_all(delivered, other.delivered);
        move_all(retries, other.retries);
        move_all(dead, other.dead);
        move_all(fan_outs, other.fan_outs);
        move_all(deliveries.delivered, other.deliveries.delivered);
        move_all(deliveries.retries, other.deliveries.retries);
        move_all(deliveries.dead, other.deliveries.dead);
        unblocks_key = unblocks_key || other.unblocks_key;
    }
};

// Writes a batch; returns how many outcomes the database refused because the
// lease was no longer ours (another relay holds the event now).
std::size_t write_outcomes(pg::store& store, const outcome_batch& batch) {
    std::size_t fenced = 0;
    if (!batch.delivered.empty()) fenced += batch.delivered.size() - store.complete(batch.delivered).size();
    for (const auto& r : batch.retries) fenced += store.reschedule(r.ref, r.delay, r.error) ? 0 : 1;
    for (const auto& d : batch.dead) fenced += store.bury(d.ref, d.error, d.status, d.excerpt) ? 0 : 1;
    for (const auto& f : batch.fan_outs) fenced += store.fan_out(f.ref, f.owed, f.dead) ? 0 : 1;
    fenced += store.finish_deliveries(batch.deliveries);
    return fenced;
}

// What one destination made of one attempt.
struct destination_result {
    std::size_t destination;
    delivery_outcome outcome;
    std::optional<int> status;  // nullopt: no HTTP status (transport error)
    std::string excerpt;
};

// An event sent straight to every destination its topic routes to: its
// outcome is known once all of them have answered.
struct event_in_flight {
    pg::lease_ref ref;
    bool keyed = false;
    std::size_t waiting = 0;
    std::vector<destination_result> failures;
    // Destinations that had no free connection: not attempted, handed to
    // their own delivery rows to wait for one (see deliver()).
    std::vector<std::size_t> deferred;
};

// A destination's share of this relay: requests in flight, and deliveries
// claimed for it that wait for one of its connections.
struct destination_lane {
    std::size_t busy = 0;
    std::size_t limit = 1;
    std::deque<std::function<void()>> waiting;
    [[nodiscard]] bool full() const noexcept { return busy >= limit; }
};

std::vector<std::string> configured_destination_names(const config& cfg) {
    std::vector<std::string> names;
    for (const auto& d : cfg.destinations) names.push_back(d.name);
    return names;
}

class relay {
public:
    explicit relay(const relay_options& o)
        : opts_(o),
          cfg_(opts_.settings),
          routes_(cfg_),
          store_(o.dsn, cfg_.schema, o.lease_owner, /*relay_session=*/true, /*plan_once=*/true,
                 cfg_.db_statement_timeout, configured_destination_names(cfg_)),
          worker_(store_),
          outcome_store_(o.dsn, cfg_.schema, o.lease_owner, /*relay_session=*/true, /*plan_once=*/false,
                         cfg_.db_statement_timeout),
          outcome_worker_(outcome_store_),
          listener_(ioc_, worker_.executor(), o.dsn, notify_channel(cfg_.schema),
                    {[this] { wake(); }, [this] { wake(); }, [this](const std::string&) { reconnect_stores(); }},
                    cfg_.db_keepalive_timeout),
          dispatch_(cfg_.concurrency),
          signals_(ioc_, SIGINT, SIGTERM),
          sweep_timer_(ioc_),
          due_timer_(ioc_),
          claim_retry_timer_(ioc_),
          flush_retry_timer_(ioc_),
          shutdown_timer_(ioc_),
          rng_(std::random_device{}()) {
        for (const auto& d : cfg_.destinations) {
            longest_attempt_ = std::max(longest_attempt_, d.connect_timeout + d.request_timeout);
            lanes_.push_back({0, std::max<std::size_t>(1, d.max_concurrency), {}});
            try {
                sinks_.push_back(d.kind == transport::stdout_lines
                                     ? make_stdout_sink(ioc_)
                                     : make_webhook_sink(ioc_, d, cfg_.block_private_addresses));
            } catch (const std::invalid_argument& e) {
                throw fatal_error(exit_usage, fmt::format("destination {}: {}", d.name, e.what()));
            }
        }
    }

    int run() {
        start();
        ioc_.run();
        if (exit_code_ == exit_forced) {
            // The second signal: exit now, without joining the database
            // threads, which may be blocked in libpq on a silent database for
            // as long as their deadline. Safe: nothing is written that the
            // database needs; every lease we hold expires on its own and its
            // event is claimed again (at-least-once), and the outbox is the
            // truth. stdout (the stdout sink) is flushed first.
            std::fflush(nullptr);
            std::_Exit(exit_forced);
        }
        outcome_worker_.stop();
        worker_.stop();
        return exit_code_;
    }

private:
    // ---- startup -------------------------------------------------------

    void start() {
        // Fail fast on the first connection: a wrong URL or password is an
        // operator error to report, not an outage to wait out.
        try {
            store_.connect();
            check_schema(store_.schema_version());
            message_prefix_ = store_.message_prefix();
            outcome_store_.connect();
            listener_.connect_now();
        } catch (const fatal_error&) {
            throw;
        } catch (const pqxx::broken_connection& e) {
            throw database_unavailable(e, opts_.dsn);
        } catch (const pqxx::insufficient_privilege& e) {
            throw permission_denied(primary_message(e.what()));
        } catch (const std::exception& e) {
            throw fatal_error(exit_db_unavailable,
                              fmt::format("database error at startup: {}", scrub_secrets(e.what(), opts_.dsn)));
        }
        listener_.start();
        signals_.async_wait([this](const boost::system::error_code& ec, int sig) { on_signal(ec, sig); });
        arm_sweep();
        for (const auto& d : cfg_.destinations) {
            if (d.kind == transport::webhook && d.url.is_tls() && !d.tls.verify) {
                log::warn("INSECURE: TLS certificate verification is off for this destination; anyone on the "
                          "network path can impersonate it and read every event",
                          {{"destination", d.name}, {"url", describe(d)}});
            }
        }
        std::string destinations;
        for (const auto& d : cfg_.destinations) {
            destinations += fmt::format("{}{}={}", destinations.empty() ? "" : " ", d.name, describe(d));
        }
        log::info("relay started", {{"schema", cfg_.schema},
                                    {"destinations", destinations},
                                    {"concurrency", fmt::format("{}", cfg_.concurrency)},
                                    {"lease", format_duration(cfg_.lease)},
                                    {"sweep_interval", format_duration(cfg_.sweep_interval)},
                                    {"lease_owner", opts_.lease_owner}});
        // LISTEN is active; now drain whatever was committed before it.
        wake();
    }

    static std::string describe(const destination_config& d) {
        if (d.kind == transport::stdout_lines) return "stdout";
        return loggable_url(d.url);
    }

    void check_schema(std::optional<int> version) {
        const auto plan = plan_migrations(version, embedded::migrations());
        if (plan.database_is_newer) {
            throw fatal_error(exit_schema_too_new,
                              fmt::format("the outbox in schema {} is at migration {}, newer than this outboxd "
                                          "(knows up to {}); upgrade outboxd",
                                          quote_ident(cfg_.schema), plan.database_version, plan.binary_version));
        }
        if (!version || !plan.pending.empty()) {
            throw fatal_error(exit_schema_missing,
                              fmt::format("the outbox in schema {} is {}; run `outboxd migrate` (or apply "
                                          "`outboxd sql`) first",
                                          quote_ident(cfg_.schema),
                                          version ? fmt::format("at migration {} of {}", *version, plan.binary_version)
                                                  : std::string("not installed")));
        }
    }

    // The LISTEN connection died: the database restarted, failed over or
    // went out of reach, and the other two connections are most likely dead
    // too. Their next call starts on a new connection instead of waiting out
    // its deadline on the old one (a call running now still does).
    void reconnect_stores() {
        worker_.submit([](pg::store& s) { s.disconnect(); });
        outcome_worker_.submit([](pg::store& s) { s.disconnect(); });
    }

    // ---- claiming ------------------------------------------------------

    void wake() { start_claim(dispatch_.on_wake()); }

    void start_claim(std::size_t n) {
        if (n == 0) return;
        // Deliveries are claimed only for destinations with a free connection here.
        std::vector<std::string> open;
        for (std::size_t i = 0; i < lanes_.size(); ++i) {
            if (!lanes_[i].full()) open.push_back(cfg_.destinations[i].name);
        }
        // When the claim was asked for, started on the claim thread and done:
        // the debug log's breakdown of where a claim's time goes.
        claim_timing timing{std::chrono::steady_clock::now(), {}, {}};
        // Outcomes recorded before this claim began: if more are recorded
        // before it returns, its snapshot may predate them (see on_next_due).
        const auto flushes_before = flushes_recorded_;
        worker_.submit([this, n, lease = cfg_.lease, open = std::move(open), timing,
                        flushes_before](pg::store& store) mutable {
            timing.started = std::chrono::steady_clock::now();
            try {
                // Deliveries first when the last claim saw some due (retries
                // of a failed destination are older than new events); the
                // event claim then says whether any are due now.
                std::vector<event> got;
                // Whether a statement came back full: then more may be due.
                bool full = false;
                const bool tried_deliveries = deliveries_due_ && !open.empty();
                if (tried_deliveries) {
                    const auto limit = pg::claim_size(n);
                    got = store.claim_deliveries(limit, lease, open);
                    full = got.size() == limit;
                }
                // Events come in prepared sizes (powers of two), at most what is left.
                const auto size = pg::claim_size(n - got.size());
                auto claimed = store.claim(size, lease, drain_watermark_, low_mark_);
                // Whether the claim that started at or before the low mark
                // came back less than full: then its own low mark holds.
                bool took_all = claimed.picked < size;
                // Whether the last statement came back full (judged on the
                // rows it picked), and the last row it picked.
                bool events_full = size > 0 && claimed.picked == size;
                auto last_picked = claimed.last;
                if (drain_watermark_ && !events_full) {
                    // The drain reached its end: look once more from the
                    // low mark (or the start), for what committed late
                    // behind the watermark (its NOTIFY came and went while
                    // we were draining).
                    drain_watermark_.reset();
                    const auto rest = pg::claim_size(size - claimed.events.size());
                    auto behind = store.claim(rest, lease, std::nullopt, low_mark_);
                    took_all = behind.picked < rest;
                    events_full = rest > 0 && behind.picked == rest;
                    last_picked = behind.last;
                    std::move(behind.events.begin(), behind.events.end(), std::back_inserter(claimed.events));
                    claimed.next_due = behind.next_due;
                    claimed.deliveries_due = behind.deliveries_due;
                    claimed.low_mark = std::move(behind.low_mark);
                }
                // A full claim means a backlog: the next one starts behind
                // this one. Anything less ends the drain mode.
                if (events_full) {
                    drain_watermark_ = last_picked;
                } else if (size > 0) {
                    drain_watermark_.reset();
                }
                if (size > 0 && took_all) low_mark_ = std::move(claimed.low_mark);
                full = full || events_full;
                std::move(claimed.events.begin(), claimed.events.end(), std::back_inserter(got));
                if (!tried_deliveries && claimed.deliveries_due && !open.empty() && got.size() < n) {
                    const auto limit = pg::claim_size(n - got.size());
                    auto more = store.claim_deliveries(limit, lease, open);
                    full = full || more.size() == limit;
                    std::move(more.begin(), more.end(), std::back_inserter(got));
                }
                deliveries_due_ = claimed.deliveries_due;
                // The dispatcher reads "got as many as asked" as "more may be due".
                const auto asked = full ? got.size() : got.size() + 1;
                timing.done = std::chrono::steady_clock::now();
                net::post(ioc_, [this, asked, got = std::move(got), next_due = claimed.next_due, timing,
                                 flushes_before]() mutable {
                    on_claimed(std::move(got), asked, timing);
                    // Retries and delayed events fire on time, not at the next sweep.
                    on_next_due(next_due, flushes_recorded_ == flushes_before);
                });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, why = scrub_secrets(e.what(), opts_.dsn)] { on_claim_failed(why); });
            }
        });
    }

    void on_claimed(std::vector<event> claimed, std::size_t asked, const claim_timing& timing) {
        claim_backoff_.reset();
        if (!claimed.empty() && log::enabled(log::level::debug)) {
            const auto us = [](auto from, auto to) {
                return fmt::format("{}", std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
            };
            // queued: waiting for the claim thread; claim: the statements'
            // round trips; handoff: back to the event loop.
            log::debug("claimed", {{"count", fmt::format("{}", claimed.size())},
                                   {"queued_us", us(timing.asked, timing.started)},
                                   {"claim_us", us(timing.started, timing.done)},
                                   {"handoff_us", us(timing.done, std::chrono::steady_clock::now())}});
        }
        fit_capacity();
        // Count the batch as in flight before delivering any of it: an event
        // that cannot be sent finishes inside deliver().
        const auto next = dispatch_.on_claimed(claimed.size(), asked);
        // From when the claim began, not when it came back: the database's
        // lease started at its statement's now(), and the statements (which
        // may wait on another claim's key hold) and the hand-off take time.
        const auto lease_end = timing.started + cfg_.lease;
        for (auto& e : claimed) ready_.push_back({std::move(e), lease_end});
        pump();
        start_claim(next);
        maybe_finish();
    }

    // Claiming ahead while a backlog drains (see core/claim_capacity.hpp):
    // in a 100k drain, claims of 128 rows instead of 14 took PostgreSQL's
    // CPU per event from 60 to 38 us.
    void fit_capacity() {
        const auto c = capacity_for(cfg_.concurrency, delivery_rate_.per_second(std::chrono::steady_clock::now()),
                                    cfg_.lease - longest_attempt_, pg::largest_claim);
        dispatch_.resize(c.slots, c.batch);
    }

    // Starts claimed events, oldest first, while delivery slots are free.
    void pump() {
        if (pumping_) return;  // called again by finished() inside deliver()
        pumping_ = true;
        while (sending_ < cfg_.concurrency && !ready_.empty() && !finishing_) {
            auto next = std::move(ready_.front());
            ready_.pop_front();
            if (std::chrono::steady_clock::now() > next.lease_end - longest_attempt_) {
                // It waited behind requests that hung until their timeouts:
                // an attempt now might outlast the lease and race the relay
                // that claims it next. Not sent; the lease runs out and the
                // event is claimed again (by us or another relay).
                log::warn("claimed event waited too long for a delivery slot; left for its lease to expire",
                          {{"event_id", fmt::format("{}", next.e.id)}});
                start_claim(dispatch_.on_delivery_finished());
                continue;
            }
            ++sending_;
            deliver(std::move(next.e), next.lease_end);
        }
        pumping_ = false;
    }

    void on_claim_failed(const std::string& why) {
        (void)dispatch_.on_claim_failed();
        const auto delay = claim_backoff_.next();
        log::warn("claim failed; retrying", {{"error", why}, {"retry_in", format_duration(delay)}});
        maybe_finish();
        if (dispatch_.stopping()) return;
        claim_retry_timer_.expires_after(delay);
        claim_retry_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (!ec) wake();
        });
    }

    // `current`: no outcome was recorded while the claim ran. Otherwise its
    // snapshot may predate a retry just recorded (it saw that row still
    // leased, due at the lease's end), so its answer may only bring the
    // timer forward, never push the retry's timer back.
    void on_next_due(std::optional<milliseconds> due, bool current) {
        if (dispatch_.stopping() || !due) return;
        arm_due(*due, current);
    }

    // The next-due timer: exact retries and delayed events. `replace` when
    // the database's answer is authoritative; otherwise only ever earlier.
    void arm_due(milliseconds in, bool replace) {
        // Nothing further than the next sweep needs a timer: the sweep claims
        // then anyway. Also keeps now() + in from overflowing for an event
        // due centuries ahead (it made the timer fire at once, in a loop).
        const auto when = std::chrono::steady_clock::now() + std::clamp(in, milliseconds(0), cfg_.sweep_interval);
        if (!replace && due_armed_ && due_timer_.expiry() <= when) return;
        due_armed_ = true;
        due_timer_.expires_at(when);
        due_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec) return;
            due_armed_ = false;
            wake();
        });
    }

    void arm_sweep() {
        sweep_timer_.expires_after(cfg_.sweep_interval);
        sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec || dispatch_.stopping()) return;
            // What committed late behind the low mark: this claim starts
            // from the beginning of the index.
            worker_.submit([this](pg::store&) { low_mark_.reset(); });
            wake();
            purge_idempotency_keys();
            bury_orphan_deliveries();
            purge_dead_letters();
            arm_sweep();
        });
    }

    // Housekeeping runs on the outcome connection, off the claim path, one
    // job per task; a failure is only logged (the next sweep tries again).
    void housekeeping(std::string_view task, std::function<void(pg::store&)> job) {
        outcome_worker_.submit([this, task, job = std::move(job)](pg::store& store) {
            try {
                job(store);
            } catch (const std::exception& e) {
                log::warn(fmt::format("{} failed", task), {{"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
        });
    }

    void purge_idempotency_keys() {
        if (cfg_.idempotency_retention.count() == 0) return;
        housekeeping("purging idempotency keys", [retention = cfg_.idempotency_retention](pg::store& store) {
            if (const auto purged = store.purge_idempotency_keys(retention); purged > 0) {
                log::debug("forgot idempotency keys", {{"count", fmt::format("{}", purged)}});
            }
        });
    }

    void bury_orphan_deliveries() {
        housekeeping("forgetting expired key holds", [](pg::store& store) { (void)store.forget_expired_key_holds(); });
        housekeeping("checking for orphaned deliveries", [](pg::store& store) {
            for (const auto& d : store.bury_orphan_deliveries()) {
                log::error("a delivery had lost its event row (payload gone); moved to dead letters",
                           {{"event_id", fmt::format("{}", d.id)}, {"destination", d.destination}});
            }
        });
    }

    // One batch per job: a full batch queues the next behind whatever
    // outcomes are waiting, so a large purge never delays them for long.
    void purge_dead_letters() {
        if (cfg_.dead_letter_retention.count() == 0) return;
        housekeeping("purging dead letters", [this, retention = cfg_.dead_letter_retention](pg::store& store) {
            constexpr std::size_t batch = 1000;
            const auto purged = store.purge_dead_letters(retention, batch);
            if (purged > 0) {
                log::info("purged dead letters past their retention",
                          {{"count", fmt::format("{}", purged)}, {"retention", format_duration(retention)}});
            }
            if (purged == batch) {
                net::post(ioc_, [this] {
                    if (!dispatch_.stopping()) purge_dead_letters();
                });
            }
        });
    }

    // ---- delivering ----------------------------------------------------

    // Every claimed item ends in exactly one call of finished(), which frees
    // its delivery slot.
    void finished() {
        --sending_;
        delivery_rate_.record(std::chrono::steady_clock::now());
        flush_outcomes();
        pump();
        fit_capacity();
        start_claim(dispatch_.on_delivery_finished());
        maybe_finish();
    }

    void deliver(event e, std::chrono::steady_clock::time_point lease_end) {
        const auto unix_now = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
        auto built = e.undecodable ? request_headers_result{{}, e.undecodable} : build_request_headers(e, unix_now, message_prefix_);
        if (e.destination) {
            deliver_owed(std::move(e), std::move(built), unix_now, lease_end);
            return;
        }
        const pg::lease_ref ref{e.id, e.attempt};
        const bool keyed = e.ordering_key.has_value();
        if (built.error) {
            bury_unsendable(e, *built.error);
            return;
        }
        const auto targets = e.only_to.empty() ? routes_.match(e.topic) : named_destinations(e.only_to);
        if (targets.empty() && e.only_to.empty()) {
            unroutable(e);
            return;
        }
        if (const auto bad = std::find_if_not(e.only_to.begin(), e.only_to.end(), valid_destination_name);
            bad != e.only_to.end()) {
            // events.destinations is written by replays, but nothing stops
            // other writers: a name no destination can have can never be
            // delivered (and no delivery row may carry it).
            bury_unsendable(e, fmt::format("the event names a destination that cannot exist: '{}'", *bad));
            return;
        }
        if (targets.size() < e.only_to.size()) {
            // A replayed event owed to destinations of which this relay does
            // not know some: each gets its own delivery row, where a relay
            // that knows it delivers it (and a destination nobody knows
            // holds back its key there only, as any stalled destination).
            // Not an attempt.
            fan_out_item item{ref, {}, {}};
            for (const auto& name : e.only_to) item.owed.push_back({name, milliseconds(0), e.attempt - 1, {}});
            pending_.fan_outs.push_back(std::move(item));
            pending_.unblocks_key = pending_.unblocks_key || keyed;
            finished();
            return;
        }
        if (e.key_pending) {
            // Earlier events of this key still wait at some destination: this
            // one queues behind them, at each destination on its own.
            fan_out_item item{ref, {}, {}};
            for (const auto i : targets) item.owed.push_back({cfg_.destinations[i].name, milliseconds(0), 0, {}});
            pending_.fan_outs.push_back(std::move(item));
            pending_.unblocks_key = true;
            finished();
            return;
        }
        auto state = std::make_shared<event_in_flight>(event_in_flight{ref, keyed, 0, {}, {}});
        // A destination whose connections are all busy here (stalled, or
        // just slow) does not get to hold this event's delivery slot: the
        // event is handed to its own delivery row there, due now but claimed
        // only while that destination has a free connection; other
        // destinations, and other events, go on.
        for (const auto i : targets) {
            if (lanes_[i].full()) {
                state->deferred.push_back(i);
            } else {
                ++state->waiting;
            }
        }
        if (state->waiting == 0) {
            settle(*state);
            return;
        }
        for (const auto i : targets) {
            if (std::find(state->deferred.begin(), state->deferred.end(), i) != state->deferred.end()) continue;
            send(i, e, built.headers, unix_now, lease_end, [this, state, i](const http::response_summary& r) {
                on_event_result(*state, i, r);
            });
        }
    }

    // Signs and sends one request to destination `i` now (a free connection
    // is the caller's business). The attempt ends a little before the lease
    // does, so its outcome is recorded while the lease is still ours.
    void send(std::size_t i, const event& e, header_list headers, std::int64_t unix_now,
              std::chrono::steady_clock::time_point lease_end,
              std::function<void(const http::response_summary&)> done) {
        const auto& d = cfg_.destinations[i];
        add_destination_headers(headers, d.headers);
        if (!d.signing_secrets.empty()) {
            // Signs exactly what is sent: the webhook-id and -timestamp and the body.
            headers.emplace_back("webhook-signature",
                                 sign_webhook(d.signing_secrets, headers.front().second, unix_now, e.payload));
        }
        ++lanes_[i].busy;
        const auto deadline = lease_end - std::min(cfg_.lease / 10, milliseconds(1000));
        sinks_[i]->send(e, std::move(headers), deadline, [this, i, done = std::move(done)](http::response_summary r) {
            if (finishing_) return;  // shutdown timed out: the lease release covers this delivery
            lane_freed(i);
            done(r);
        });
    }

    void lane_freed(std::size_t i) {
        auto& lane = lanes_[i];
        const bool was_full = lane.full();
        --lane.busy;
        if (!lane.waiting.empty()) {
            auto next = std::move(lane.waiting.front());
            lane.waiting.pop_front();
            next();
        } else if (was_full) {
            // Deliveries to it were left unclaimed while it was full.
            wake();
        }
    }

    destination_result judge(std::size_t i, std::int32_t attempt, const http::response_summary& r) {
        const attempt_report report{r.transport_error, r.status, r.error, r.retry_after, r.body_excerpt};
        return {i,
                classify_attempt(report, attempt, cfg_.destinations[i].retry, unit_(rng_),
                                 std::chrono::system_clock::now()),
                r.transport_error ? std::nullopt : std::optional<int>(static_cast<int>(r.status)), r.body_excerpt};
    }

    void log_result(std::int64_t id, const destination_result& res, std::int32_t attempt, std::size_t us) {
        // Per event: build the fields only when the line is written.
        if (res.outcome.what == delivery_outcome::kind::delivered && !log::enabled(log::level::debug)) return;
        const auto& name = cfg_.destinations[res.destination].name;
        const auto event_id = fmt::format("{}", id);
        switch (res.outcome.what) {
            case delivery_outcome::kind::delivered:
                log::debug("delivered", {{"event_id", event_id}, {"destination", name}, {"us", fmt::format("{}", us)}});
                break;
            case delivery_outcome::kind::retry:
                log::warn("delivery failed; will retry",
                          {{"event_id", event_id}, {"destination", name}, {"attempt", fmt::format("{}", attempt)},
                           {"retry_in", format_duration(res.outcome.retry_in)}, {"error", res.outcome.error}});
                break;
            case delivery_outcome::kind::dead:
                log::error("delivery failed for good; moving to dead letters",
                           {{"event_id", event_id}, {"destination", name}, {"attempt", fmt::format("{}", attempt)},
                            {"error", res.outcome.error}});
                break;
        }
    }

    // One destination answered for an event sent straight from `events`.
    void on_event_result(event_in_flight& state, std::size_t i, const http::response_summary& r) {
        auto res = judge(i, state.ref.attempt, r);
        log_result(state.ref.id, res, state.ref.attempt, static_cast<std::size_t>(r.elapsed.count()));
        if (res.outcome.what != delivery_outcome::kind::delivered) state.failures.push_back(std::move(res));
        if (--state.waiting > 0) return;
        settle(state);
    }

    // Every destination of a directly sent event has answered (or was deferred).
    void settle(event_in_flight& state) {
        if (state.failures.empty() && state.deferred.empty()) {
            pending_.delivered.push_back(state.ref);
        } else {
            // From here each failed destination keeps its own schedule; the
            // ones that accepted the event are done with it for good.
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
            }
            for (const auto& o : item.owed) retry_after_flush(o.due_in);
            pending_.fan_outs.push_back(std::move(item));
        }
        pending_.unblocks_key = pending_.unblocks_key || state.keyed;
        finished();
    }

    // One destination's delivery of a fanned-out event.
    void deliver_owed(event e, request_headers_result built, std::int64_t unix_now,
                      std::chrono::steady_clock::time_point lease_end) {
        const pg::delivery_ref ref{e.id, *e.destination, e.attempt};
        const bool keyed = e.ordering_key.has_value();
        const auto it = std::find_if(cfg_.destinations.begin(), cfg_.destinations.end(),
                                     [&](const destination_config& d) { return d.name == *e.destination; });
        if (built.error) {
            // Nothing about this event can change: dead-letter it there now.
            log::error("delivery cannot be sent; moving to dead letters",
                       {{"event_id", fmt::format("{}", e.id)}, {"destination", *e.destination},
                        {"error", *built.error}});
            record_owed(ref, keyed, {0, {delivery_outcome::kind::dead, {}, *built.error}, std::nullopt, {}});
            finished();
            return;
        }
        if (it == cfg_.destinations.end()) {
            // Cannot happen: claims ask only for our destinations. Should it,
            // the delivery is not sent but handed back due now.
            log::warn("delivery for a destination this relay does not know; handed back",
                      {{"event_id", fmt::format("{}", e.id)}, {"destination", *e.destination}});
            pending_.deliveries.retries.push_back(
                {ref, milliseconds(0), fmt::format("destination {} is not in this relay's configuration", *e.destination)});
            finished();
            return;
        }
        const auto i = static_cast<std::size_t>(it - cfg_.destinations.begin());
        auto on_result = [this, ref, keyed, i](const http::response_summary& r) {
            auto res = judge(i, ref.attempt, r);
            log_result(ref.id, res, ref.attempt, static_cast<std::size_t>(r.elapsed.count()));
            record_owed(ref, keyed, std::move(res));
            finished();
        };
        if (!lanes_[i].full()) {
            send(i, e, std::move(built.headers), unix_now, lease_end, std::move(on_result));
            return;
        }
        // Claimed just before its destination filled up: wait here for a
        // connection, but only as long as the request still fits in the lease.
        const auto& d = cfg_.destinations[i];
        const auto start_by = lease_end - d.connect_timeout - d.request_timeout;
        lanes_[i].waiting.push_back([this, i, start_by, lease_end, e = std::move(e), headers = std::move(built.headers),
                                     unix_now, on_result = std::move(on_result)]() mutable {
            if (std::chrono::steady_clock::now() > start_by) {
                http::response_summary r;
                r.transport_error = true;
                r.error = fmt::format("no free connection to destination {} within the lease",
                                      cfg_.destinations[i].name);
                on_result(r);
                // The slot was not used: the next waiting delivery may take it.
                ++lanes_[i].busy;
                lane_freed(i);
                return;
            }
            send(i, e, std::move(headers), unix_now, lease_end, std::move(on_result));
        });
    }

    void record_owed(const pg::delivery_ref& ref, bool keyed, destination_result res) {
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
    void retry_after_flush(milliseconds in) {
        arm_due_after_flush_ = std::min(arm_due_after_flush_.value_or(in), in);
    }

    // Indices of the configured destinations with these names (a replayed
    // event owed to some destinations only).
    [[nodiscard]] std::vector<std::size_t> named_destinations(const std::vector<std::string>& names) const {
        std::vector<std::size_t> out;
        for (std::size_t i = 0; i < cfg_.destinations.size(); ++i) {
            if (std::find(names.begin(), names.end(), cfg_.destinations[i].name) != names.end()) out.push_back(i);
        }
        return out;
    }

    // A whole event that can never be sent as it is: a dead letter now, with
    // the reason; the rest of its key goes on.
    void bury_unsendable(const event& e, const std::string& why) {
        log::error("event cannot be sent; moving to dead letters",
                   {{"event_id", fmt::format("{}", e.id)}, {"topic", e.topic}, {"error", why}});
        pending_.dead.push_back({pg::lease_ref{e.id, e.attempt}, why, std::nullopt, {}});
        pending_.unblocks_key = pending_.unblocks_key || e.ordering_key.has_value();
        finished();
    }

    // No route matches the topic. Not lost: the event stays in the outbox,
    // retried on the [defaults.retry] schedule with the reason in last_error
    // (shown by `outboxd status`), so a relay with a newer configuration
    // picks it up; when the attempts run out it becomes a dead letter, to be
    // replayed. With an ordering key it would hold back every later event of
    // its key meanwhile: it becomes a dead letter at once instead.
    void unroutable(const event& e) {
        const pg::lease_ref ref{e.id, e.attempt};
        const auto why = fmt::format("no route matches topic '{}'", e.topic);
        if (e.ordering_key) {
            bury_unsendable(e, fmt::format("{}; dead-lettered at once so that it does not hold back the later "
                                           "events of its ordering key (replay it once a route matches)",
                                           why));
            return;
        }
        const auto outcome = classify_attempt({true, 0, why, {}, {}}, e.attempt, cfg_.default_retry, unit_(rng_),
                                              std::chrono::system_clock::now());
        log::warn("no route for event; it stays in the outbox",
                  {{"event_id", fmt::format("{}", e.id)}, {"topic", e.topic}, {"attempt", fmt::format("{}", e.attempt)}});
        if (outcome.what == delivery_outcome::kind::dead) {
            pending_.dead.push_back({ref, outcome.error, std::nullopt, {}});
            pending_.unblocks_key = pending_.unblocks_key || e.ordering_key.has_value();
        } else {
            retry_after_flush(outcome.retry_in);
            pending_.retries.push_back({ref, outcome.retry_in, outcome.error});
        }
        finished();
    }

    // ---- recording outcomes --------------------------------------------

    void flush_outcomes() {
        if (flushing_ || pending_.empty() || finishing_) return;
        flushing_ = true;
        auto batch = std::make_shared<outcome_batch>(std::move(pending_));
        pending_ = {};
        auto retry_in = std::exchange(arm_due_after_flush_, std::nullopt);
        outcome_worker_.submit([this, batch, retry_in](pg::store& store) {
            try {
                const auto fenced = write_outcomes(store, *batch);
                net::post(ioc_, [this, batch, fenced, retry_in] { on_flushed(*batch, fenced, retry_in); });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, batch, retry_in, why = scrub_secrets(e.what(), opts_.dsn)] {
                    on_flush_failed(std::move(*batch), retry_in, why);
                });
            }
        });
    }

    void on_flushed(const outcome_batch& batch, std::size_t fenced, std::optional<milliseconds> retry_in) {
        flushing_ = false;
        ++flushes_recorded_;
        flush_backoff_.reset();
        if (fenced > 0) {
            log::warn("lease lost before the outcome was recorded; the event's new holder delivers it again",
                      {{"outcomes", fmt::format("{}", fenced)}});
        }
        if (retry_in && !dispatch_.stopping()) arm_due(*retry_in, false);
        if (batch.unblocks_key) {
            // The next event of that key may be behind the drain watermark
            // (it was skipped while blocked): the next claim scans from the
            // start. Queued before that claim, on the claim thread.
            worker_.submit([this](pg::store&) {
                drain_watermark_.reset();
                low_mark_.reset();
            });
        }
        // A keyed event finished: the next event of its key may be due.
        start_claim(dispatch_.on_outcomes_recorded(batch.unblocks_key));
        flush_outcomes();
        maybe_finish();
    }

    void on_flush_failed(outcome_batch batch, std::optional<milliseconds> retry_in, const std::string& why) {
        flushing_ = false;
        // Keep them: outcomes are fenced and idempotent, writing them again is safe.
        batch.append(std::move(pending_));
        pending_ = std::move(batch);
        if (retry_in) retry_after_flush(*retry_in);
        const auto delay = flush_backoff_.next();
        log::warn("recording outcomes failed; retrying", {{"error", why}, {"retry_in", format_duration(delay)}});
        flush_retry_timer_.expires_after(delay);
        flush_retry_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (!ec) flush_outcomes();
        });
    }

    // ---- shutdown --------------------------------------------------------

    void on_signal(const boost::system::error_code& ec, int sig) {
        if (ec) return;
        if (dispatch_.stopping()) {
            log::warn("second signal: exiting now; unfinished leases expire on their own",
                      {{"signal", fmt::format("{}", sig)}});
            exit_code_ = exit_forced;
            ioc_.stop();
            return;
        }
        log::info("shutting down: no new claims, finishing in-flight deliveries",
                  {{"signal", fmt::format("{}", sig)}, {"in_flight", fmt::format("{}", dispatch_.in_flight())},
                   {"timeout", format_duration(cfg_.shutdown_timeout)}});
        dispatch_.on_stop();
        // Not started yet: not sent at all. finish() releases their leases.
        for (; !ready_.empty(); ready_.pop_front()) (void)dispatch_.on_delivery_finished();
        listener_.stop();
        sweep_timer_.cancel();
        due_timer_.cancel();
        claim_retry_timer_.cancel();
        signals_.async_wait([this](const boost::system::error_code& e, int s) { on_signal(e, s); });
        shutdown_timer_.expires_after(cfg_.shutdown_timeout);
        shutdown_timer_.async_wait([this](const boost::system::error_code& e) {
            if (e) return;
            log::warn("shutdown timeout: releasing deliveries still in flight",
                      {{"in_flight", fmt::format("{}", dispatch_.in_flight())}});
            finish();
        });
        maybe_finish();
    }

    void maybe_finish() {
        if (dispatch_.drained() && !flushing_ && pending_.empty()) finish();
    }

    // Writes what is left, hands back every lease we still hold (due now, so
    // the next relay need not wait for expiry), and stops the loop.
    void finish() {
        if (finishing_) return;
        finishing_ = true;
        shutdown_timer_.cancel();
        flush_retry_timer_.cancel();
        for (auto& s : sinks_) s->close();
        auto batch = std::make_shared<outcome_batch>(std::move(pending_));
        pending_ = {};
        outcome_worker_.submit([this, batch](pg::store& store) {
            try {
                (void)write_outcomes(store, *batch);
            } catch (const std::exception& e) {
                log::error("could not record the last outcomes; those events are delivered again after their lease",
                           {{"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
            // Release on the claim connection, after any claim still running
            // there (a timed-out shutdown may have one): what it took is
            // released too.
            worker_.submit([this](pg::store& claim_store) {
                try {
                    const auto released = claim_store.release();
                    log::info("stopped", {{"released", fmt::format("{}", released)}});
                } catch (const std::exception& e) {
                    log::error("could not release leases; they expire on their own",
                               {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
                net::post(ioc_, [this] { ioc_.stop(); });
            });
        });
    }

    relay_options opts_;
    const config& cfg_;
    route_table routes_;
    // What this outbox's webhook-ids start with (read at startup, sql/0005).
    std::string message_prefix_;
    net::io_context ioc_;
    // Claims and outcome writes run on connections (and threads) of their
    // own, so a claim never queues behind a batch of acknowledgements.
    pg::store store_;
    store_worker worker_;
    pg::store outcome_store_;
    store_worker outcome_worker_;
    pg::listener listener_;
    std::vector<std::unique_ptr<sink>> sinks_;  // one per destination, same index
    std::vector<destination_lane> lanes_;       // one per destination, same index
    // Claimed events waiting for a delivery slot (see pump()), with the end
    // of their lease; sending_ events are being delivered (<= concurrency).
    struct ready_event {
        event e;
        std::chrono::steady_clock::time_point lease_end;
    };
    std::deque<ready_event> ready_;
    std::size_t sending_ = 0;
    bool pumping_ = false;
    // The longest one attempt may take at any destination (connect + request).
    milliseconds longest_attempt_{0};
    // Events finished per second (delivered or not), for claiming ahead.
    rate_meter delivery_rate_;
    // Whether the last claim saw deliveries due. Only the claim worker's
    // thread touches it (its jobs run one at a time).
    bool deliveries_due_ = true;
    // Where a backlog drain continues (see the claim in queries.sql); same thread.
    std::optional<pg::claim_watermark> drain_watermark_;
    // Where claims outside a drain start (see the claim in queries.sql);
    // claim thread only, like drain_watermark_.
    std::optional<std::string> low_mark_;
    dispatcher dispatch_;
    net::signal_set signals_;
    net::steady_timer sweep_timer_;
    net::steady_timer due_timer_;
    net::steady_timer claim_retry_timer_;
    net::steady_timer flush_retry_timer_;
    net::steady_timer shutdown_timer_;
    bool due_armed_ = false;
    // Outcome batches recorded so far: tells a claim whether one was
    // recorded while it ran (see on_next_due).
    std::uint64_t flushes_recorded_ = 0;
    bool flushing_ = false;
    bool finishing_ = false;
    outcome_batch pending_;
    // The soonest retry among pending_: the due timer is armed for it once
    // the retry is recorded (not before: an early claim would find nothing).
    std::optional<milliseconds> arm_due_after_flush_;
    db_backoff claim_backoff_;
    db_backoff flush_backoff_;
    std::mt19937_64 rng_;
    std::uniform_real_distribution<double> unit_{0.0, 1.0};
    int exit_code_ = exit_ok;
};

}  // namespace

int run_relay(const relay_options& options) {
    relay r(options);
    return r.run();
}

}  // namespace outboxd::app
