#include "app/relay.hpp"

#include <utility>  // before Asio

#include <algorithm>
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
#include "app/store_worker.hpp"
#include "core/delivery_outcome.hpp"
#include "core/dispatcher.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/embedded_sql.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/sql_ident.hpp"
#include "core/webhook_request.hpp"
#include "http/webhook_client.hpp"
#include "pg/listener.hpp"
#include "pg/store.hpp"

namespace outboxd::app {

namespace net = boost::asio;
using std::chrono::milliseconds;

namespace {

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

// Outcomes waiting to be written. Written in batches by one job at a time;
// kept (and retried) until the database has them, since each write is fenced
// and idempotent.
struct outcome_batch {
    std::vector<pg::lease_ref> delivered;
    // A delivered or dead-lettered event had an ordering key: once recorded,
    // the next event of that key may be due.
    bool unblocks_key = false;
    std::vector<reschedule_item> retries;
    std::vector<bury_item> dead;

    [[nodiscard]] bool empty() const { return delivered.empty() && retries.empty() && dead.empty(); }
    void append(outcome_batch&& other) {
        delivered.insert(delivered.end(), other.delivered.begin(), other.delivered.end());
        unblocks_key = unblocks_key || other.unblocks_key;
        std::move(other.retries.begin(), other.retries.end(), std::back_inserter(retries));
        std::move(other.dead.begin(), other.dead.end(), std::back_inserter(dead));
    }
};

// Writes a batch; returns how many outcomes the database refused because the
// lease was no longer ours (another relay holds the event now).
std::size_t write_outcomes(pg::store& store, const outcome_batch& batch) {
    std::size_t fenced = 0;
    if (!batch.delivered.empty()) fenced += batch.delivered.size() - store.complete(batch.delivered).size();
    for (const auto& r : batch.retries) fenced += store.reschedule(r.ref, r.delay, r.error) ? 0 : 1;
    for (const auto& d : batch.dead) fenced += store.bury(d.ref, d.error, d.status, d.excerpt) ? 0 : 1;
    return fenced;
}

class relay {
public:
    explicit relay(const relay_options& o)
        : opts_(o),
          store_(o.dsn, o.schema, o.lease_owner, /*relay_session=*/true),
          worker_(store_),
          outcome_store_(o.dsn, o.schema, o.lease_owner, /*relay_session=*/true),
          outcome_worker_(outcome_store_),
          listener_(ioc_, worker_.executor(), o.dsn, notify_channel(o.schema),
                    {[this] { wake(); }, [this] { wake(); }, [](const std::string&) {}}),
          client_(ioc_, o.url,
                  http::client_options{o.concurrency, o.connect_timeout, o.request_timeout, 1024,
                                       fmt::format("outboxd/{}", OUTBOXD_VERSION)}),
          dispatch_(o.concurrency),
          signals_(ioc_, SIGINT, SIGTERM),
          sweep_timer_(ioc_),
          due_timer_(ioc_),
          claim_retry_timer_(ioc_),
          flush_retry_timer_(ioc_),
          shutdown_timer_(ioc_),
          rng_(std::random_device{}()) {}

    int run() {
        start();
        ioc_.run();
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
            outcome_store_.connect();
            listener_.connect_now();
        } catch (const fatal_error&) {
            throw;
        } catch (const pqxx::broken_connection& e) {
            throw database_unavailable(e, opts_.dsn);
        } catch (const std::exception& e) {
            throw fatal_error(exit_db_unavailable,
                              fmt::format("database error at startup: {}", scrub_secrets(e.what(), opts_.dsn)));
        }
        listener_.start();
        signals_.async_wait([this](const boost::system::error_code& ec, int sig) { on_signal(ec, sig); });
        arm_sweep();
        log::info("relay started", {{"schema", opts_.schema},
                                    {"url", fmt::format("{}://{}{}", opts_.url.scheme, opts_.url.host_header,
                                                        opts_.url.target)},
                                    {"concurrency", fmt::format("{}", opts_.concurrency)},
                                    {"lease", format_duration(opts_.lease)},
                                    {"sweep_interval", format_duration(opts_.sweep_interval)},
                                    {"lease_owner", opts_.lease_owner}});
        // LISTEN is active; now drain whatever was committed before it.
        wake();
    }

    void check_schema(std::optional<int> version) {
        const auto plan = plan_migrations(version, embedded::migrations());
        if (plan.database_is_newer) {
            throw fatal_error(exit_schema_too_new,
                              fmt::format("the outbox in schema {} is at migration {}, newer than this outboxd "
                                          "(knows up to {}); upgrade outboxd",
                                          quote_ident(opts_.schema), plan.database_version, plan.binary_version));
        }
        if (!version || !plan.pending.empty()) {
            throw fatal_error(exit_schema_missing,
                              fmt::format("the outbox in schema {} is {}; run `outboxd migrate` (or apply "
                                          "`outboxd sql`) first",
                                          quote_ident(opts_.schema),
                                          version ? fmt::format("at migration {} of {}", *version, plan.binary_version)
                                                  : std::string("not installed")));
        }
    }

    // ---- claiming ------------------------------------------------------

    void wake() { start_claim(dispatch_.on_wake()); }

    void start_claim(std::size_t n) {
        if (n == 0) return;
        worker_.submit([this, n, lease = opts_.lease](pg::store& store) {
            try {
                auto claimed = store.claim(n, lease);
                net::post(ioc_, [this, n, claimed = std::move(claimed)]() mutable {
                    on_claimed(std::move(claimed.events), n);
                    // Retries and delayed events fire on time, not at the next sweep.
                    on_next_due(claimed.next_due);
                });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, why = scrub_secrets(e.what(), opts_.dsn)] { on_claim_failed(why); });
            }
        });
    }

    void on_claimed(std::vector<event> claimed, std::size_t asked) {
        claim_backoff_.reset();
        if (!claimed.empty()) log::debug("claimed", {{"count", fmt::format("{}", claimed.size())}});
        // Count the batch as in flight before delivering any of it: an event
        // that cannot be sent finishes inside deliver().
        const auto next = dispatch_.on_claimed(claimed.size(), asked);
        for (auto& e : claimed) deliver(std::move(e));
        start_claim(next);
        maybe_finish();
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

    void on_next_due(std::optional<milliseconds> due) {
        if (dispatch_.stopping() || !due) return;
        arm_due(*due, true);
    }

    // The next-due timer: exact retries and delayed events. `replace` when
    // the database's answer is authoritative; otherwise only ever earlier.
    void arm_due(milliseconds in, bool replace) {
        const auto when = std::chrono::steady_clock::now() + in;
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
        sweep_timer_.expires_after(opts_.sweep_interval);
        sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec || dispatch_.stopping()) return;
            wake();
            arm_sweep();
        });
    }

    // ---- delivering ----------------------------------------------------

    void deliver(event e) {
        const auto unix_now = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
        auto built = build_request_headers(e, unix_now);
        if (built.error) {
            // Nothing about this event can change: dead-letter it now.
            log::error("event cannot be sent; moving to dead letters",
                       {{"event_id", fmt::format("{}", e.id)}, {"error", *built.error}});
            pending_.dead.push_back({{e.id, e.attempt}, *built.error, std::nullopt, {}});
            pending_.unblocks_key = pending_.unblocks_key || e.ordering_key.has_value();
            flush_outcomes();
            start_claim(dispatch_.on_delivery_finished());
            return;
        }
        if (!opts_.signing_secrets.empty()) {
            // Signs exactly what is sent: the webhook-id and -timestamp above and the body.
            built.headers.emplace_back("webhook-signature",
                                       sign_webhook(opts_.signing_secrets, built.headers.front().second, unix_now, e.payload));
        }
        const pg::lease_ref ref{e.id, e.attempt};
        const bool keyed = e.ordering_key.has_value();
        client_.post(http::outgoing_request{std::move(e.payload), std::move(built.headers)},
                     [this, ref, keyed](http::response_summary r) { on_delivered(ref, keyed, r); });
    }

    void on_delivered(pg::lease_ref ref, bool keyed, const http::response_summary& r) {
        if (finishing_) return;  // shutdown timed out: the lease release covers this event
        const attempt_report report{r.transport_error, r.status, r.error, r.retry_after, r.body_excerpt};
        const auto outcome = classify_attempt(report, ref.attempt, opts_.retry, unit_(rng_),
                                              std::chrono::system_clock::now());
        const auto id = fmt::format("{}", ref.id);
        switch (outcome.what) {
            case delivery_outcome::kind::delivered:
                log::debug("delivered", {{"event_id", id}, {"status", fmt::format("{}", r.status)},
                                         {"us", fmt::format("{}", r.elapsed.count())}});
                pending_.delivered.push_back(ref);
                pending_.unblocks_key = pending_.unblocks_key || keyed;
                break;
            case delivery_outcome::kind::retry:
                log::warn("delivery failed; will retry",
                          {{"event_id", id}, {"attempt", fmt::format("{}", ref.attempt)},
                           {"retry_in", format_duration(outcome.retry_in)}, {"error", outcome.error}});
                pending_.retries.push_back({ref, outcome.retry_in, outcome.error});
                break;
            case delivery_outcome::kind::dead:
                log::error("delivery failed for good; moving to dead letters",
                           {{"event_id", id}, {"attempt", fmt::format("{}", ref.attempt)}, {"error", outcome.error}});
                pending_.unblocks_key = pending_.unblocks_key || keyed;
                pending_.dead.push_back({ref, outcome.error,
                                         r.transport_error ? std::nullopt : std::optional<int>(static_cast<int>(r.status)),
                                         r.body_excerpt});
                break;
        }
        flush_outcomes();
        start_claim(dispatch_.on_delivery_finished());
        maybe_finish();
    }

    // ---- recording outcomes --------------------------------------------

    void flush_outcomes() {
        if (flushing_ || pending_.empty() || finishing_) return;
        flushing_ = true;
        auto batch = std::make_shared<outcome_batch>(std::move(pending_));
        pending_ = {};
        outcome_worker_.submit([this, batch](pg::store& store) {
            try {
                const auto fenced = write_outcomes(store, *batch);
                net::post(ioc_, [this, batch, fenced] { on_flushed(*batch, fenced); });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, batch, why = scrub_secrets(e.what(), opts_.dsn)] {
                    on_flush_failed(std::move(*batch), why);
                });
            }
        });
    }

    void on_flushed(const outcome_batch& batch, std::size_t fenced) {
        flushing_ = false;
        flush_backoff_.reset();
        if (fenced > 0) {
            log::warn("lease lost before the outcome was recorded; the event's new holder delivers it again",
                      {{"events", fmt::format("{}", fenced)}});
        }
        if (!batch.retries.empty() && !dispatch_.stopping()) {
            const auto soonest = std::min_element(batch.retries.begin(), batch.retries.end(),
                                                  [](const auto& a, const auto& b) { return a.delay < b.delay; });
            arm_due(soonest->delay, false);
        }
        // A keyed event left the table: the next event of its key may be due.
        start_claim(dispatch_.on_outcomes_recorded(batch.unblocks_key));
        flush_outcomes();
        maybe_finish();
    }

    void on_flush_failed(outcome_batch batch, const std::string& why) {
        flushing_ = false;
        // Keep them: outcomes are fenced and idempotent, writing them again is safe.
        batch.append(std::move(pending_));
        pending_ = std::move(batch);
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
                   {"timeout", format_duration(opts_.shutdown_timeout)}});
        dispatch_.on_stop();
        listener_.stop();
        sweep_timer_.cancel();
        due_timer_.cancel();
        claim_retry_timer_.cancel();
        signals_.async_wait([this](const boost::system::error_code& e, int s) { on_signal(e, s); });
        shutdown_timer_.expires_after(opts_.shutdown_timeout);
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
        client_.close();
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
    net::io_context ioc_;
    // Claims and outcome writes run on connections (and threads) of their
    // own, so a claim never queues behind a batch of acknowledgements.
    pg::store store_;
    store_worker worker_;
    pg::store outcome_store_;
    store_worker outcome_worker_;
    pg::listener listener_;
    http::webhook_client client_;
    dispatcher dispatch_;
    net::signal_set signals_;
    net::steady_timer sweep_timer_;
    net::steady_timer due_timer_;
    net::steady_timer claim_retry_timer_;
    net::steady_timer flush_retry_timer_;
    net::steady_timer shutdown_timer_;
    bool due_armed_ = false;
    bool flushing_ = false;
    bool finishing_ = false;
    outcome_batch pending_;
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
