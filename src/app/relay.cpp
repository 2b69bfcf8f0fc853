#include "app/relay.hpp"

#include <utility>  // before Asio

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <variant>
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
#include "core/claim_sequence.hpp"
#include "core/clock.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/embedded_sql.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/relay_engine.hpp"
#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "nats/subject.hpp"
#include "pg/listener.hpp"
#include "pg/store.hpp"

// The shell around the relay engine (core/relay_engine.hpp): it owns the
// event loop, the database connections and their threads, the LISTEN
// connection, the sinks, the timers and the signals, carries out the
// engine's commands with them and feeds back what came of each. Every
// decision is the engine's; the engine is only ever touched on the event
// loop's thread.

namespace outboxd::app {

namespace net = boost::asio;

namespace {

// The store's two claim statements, as the claim sequence calls them.
class store_claims final : public claim_port {
public:
    explicit store_claims(pg::store& store) : store_(store) {}
    claim_result claim_events(std::size_t size, std::chrono::milliseconds lease,
                              const std::optional<claim_watermark>& after,
                              const std::optional<std::string>& low_mark) override {
        return store_.claim(size, lease, after, low_mark);
    }
    std::vector<event> claim_deliveries(std::size_t size, std::chrono::milliseconds lease,
                                        std::span<const std::string> destinations) override {
        return store_.claim_deliveries(size, lease, destinations);
    }

private:
    pg::store& store_;
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

send_result to_send_result(http::response_summary&& r) {
    return {r.transport_error, r.status, std::move(r.error), std::move(r.retry_after), std::move(r.body_excerpt),
            r.elapsed};
}

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
          engine_(cfg_, clock_, std::random_device{}()),
          store_(o.dsn, cfg_.schema, o.lease_owner, /*relay_session=*/true, /*plan_once=*/true,
                 cfg_.db_statement_timeout, configured_destination_names(cfg_)),
          worker_(store_),
          outcome_store_(o.dsn, cfg_.schema, o.lease_owner, /*relay_session=*/true, /*plan_once=*/false,
                         cfg_.db_statement_timeout),
          outcome_worker_(outcome_store_),
          listener_(ioc_, worker_.executor(), o.dsn, notify_channel(cfg_.schema),
                    {[this] { wake(); }, [this] { wake(); }, [this](const std::string&) { reconnect_stores(); }},
                    cfg_.db_keepalive_timeout),
          signals_(ioc_, SIGINT, SIGTERM),
          timers_{net::steady_timer(ioc_), net::steady_timer(ioc_), net::steady_timer(ioc_),
                  net::steady_timer(ioc_), net::steady_timer(ioc_), net::steady_timer(ioc_)} {
        for (const auto& d : cfg_.destinations) {
            try {
                sinks_.push_back(d.kind == transport::stdout_lines ? make_stdout_sink(ioc_)
                                 : d.kind == transport::nats
                                     ? make_nats_sink(ioc_, d)
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
        wait_for_signal();
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
        feed([this](relay_engine& e) { e.start(message_prefix_); });
    }

    static std::string describe(const destination_config& d) {
        if (d.kind == transport::stdout_lines) return "stdout";
        if (d.kind == transport::nats) return nats::loggable_servers(d.nats.servers);
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

    void wake() {
        feed([](relay_engine& e) { e.wake(); });
    }

    void wait_for_signal() {
        signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
            if (ec) return;
            wait_for_signal();  // a second signal forces the exit
            feed([sig](relay_engine& e) { e.signalled(sig); });
        });
    }

    // ---- carrying out the engine's commands ------------------------------

    // Gives the engine one input (on the event loop), then does what it
    // says. An input given while commands are being carried out (a callback
    // that runs at once) only adds commands; the outer call carries them out.
    template <typename Input>
    void feed(Input&& input) {
        input(engine_);
        if (feeding_) return;
        feeding_ = true;
        for (auto commands = engine_.take_commands(); !commands.empty(); commands = engine_.take_commands()) {
            for (auto& c : commands) std::visit([this](auto& command) { run(command); }, c);
        }
        feeding_ = false;
    }

    void run(claim_command& c) {
        worker_.submit([this, request = std::move(c.request)](pg::store& store) {
            try {
                store_claims port(store);
                const auto started = std::chrono::steady_clock::now();
                auto outcome = run_claim(port, request);
                outcome.started = started;
                outcome.done = std::chrono::steady_clock::now();
                net::post(ioc_, [this, outcome = std::move(outcome)]() mutable {
                    feed([&](relay_engine& e) { e.claimed(std::move(outcome)); });
                });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, why = scrub_secrets(e.what(), opts_.dsn)] {
                    feed([&](relay_engine& en) { en.claim_failed(why); });
                });
            }
        });
    }

    void run(send_command& c) {
        sinks_[c.destination]->send(*c.e, std::move(c.headers), c.deadline,
                                    [this, id = c.send_id](http::response_summary r) {
                                        feed([&](relay_engine& e) { e.sent(id, to_send_result(std::move(r))); });
                                    });
    }

    void run(write_outcomes_command& c) {
        outcome_worker_.submit([this, batch = c.batch](pg::store& store) {
            try {
                const auto fenced = write_outcomes(store, *batch);
                net::post(ioc_, [this, fenced] { feed([&](relay_engine& e) { e.outcomes_written(fenced); }); });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, why = scrub_secrets(e.what(), opts_.dsn)] {
                    feed([&](relay_engine& en) { en.outcomes_failed(why); });
                });
            }
        });
    }

    void run(arm_timer_command& c) {
        auto& timer = timers_[static_cast<std::size_t>(c.timer)];
        timer.expires_at(c.at);
        timer.async_wait([this, which = c.timer, gen = c.generation](const boost::system::error_code& ec) {
            if (!ec) feed([&](relay_engine& e) { e.timer_fired(which, gen); });
        });
    }

    void run(cancel_timer_command& c) { timers_[static_cast<std::size_t>(c.timer)].cancel(); }

    void run(housekeeping_command& c) {
        switch (c.job) {
            case housekeeping_job::idempotency_keys:
                housekeeping("purging idempotency keys", [retention = cfg_.idempotency_retention](pg::store& s) {
                    if (const auto purged = s.purge_idempotency_keys(retention); purged > 0) {
                        log::debug("forgot idempotency keys", {{"count", fmt::format("{}", purged)}});
                    }
                });
                break;
            case housekeeping_job::key_holds:
                housekeeping("forgetting expired key holds", [](pg::store& s) { (void)s.forget_expired_key_holds(); });
                break;
            case housekeeping_job::orphan_deliveries:
                housekeeping("checking for orphaned deliveries", [](pg::store& s) {
                    for (const auto& d : s.bury_orphan_deliveries()) {
                        log::error("a delivery had lost its event row (payload gone); moved to dead letters",
                                   {{"event_id", fmt::format("{}", d.id)}, {"destination", d.destination}});
                    }
                });
                break;
            case housekeeping_job::dead_letters:
                housekeeping("purging dead letters", [this, retention = cfg_.dead_letter_retention](pg::store& s) {
                    constexpr std::size_t batch = 1000;
                    const auto purged = s.purge_dead_letters(retention, batch);
                    if (purged > 0) {
                        log::info("purged dead letters past their retention",
                                  {{"count", fmt::format("{}", purged)}, {"retention", format_duration(retention)}});
                    }
                    net::post(ioc_, [this, more = purged == batch] {
                        feed([&](relay_engine& e) { e.dead_letters_purged(more); });
                    });
                });
                break;
        }
    }

    // On the outcome connection, off the claim path; a failure is only logged.
    void housekeeping(std::string_view task, std::function<void(pg::store&)> job) {
        outcome_worker_.submit([this, task, job = std::move(job)](pg::store& store) {
            try {
                job(store);
            } catch (const std::exception& e) {
                log::warn(fmt::format("{} failed", task), {{"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
        });
    }

    void run(release_deliveries_command& c) {
        outcome_worker_.submit([this, destination = std::move(c.destination)](pg::store& store) {
            try {
                const auto released = store.release_waiting_deliveries(destination);
                log::info("released waiting deliveries", {{"destination", destination},
                                                          {"count", fmt::format("{}", released)}});
            } catch (const std::exception& e) {
                // They stay on their own schedule.
                log::warn("releasing waiting deliveries failed",
                          {{"destination", destination}, {"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
            net::post(ioc_, [this] { wake(); });
        });
    }

    void run(stop_listening_command&) { listener_.stop(); }

    void run(finish_command& c) {
        for (auto& s : sinks_) s->close();
        outcome_worker_.submit([this, batch = std::make_shared<outcome_batch>(std::move(c.last))](pg::store& store) {
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

    void run(exit_now_command&) {
        exit_code_ = exit_forced;
        ioc_.stop();
    }

    relay_options opts_;
    const config& cfg_;
    system_clock_source clock_;
    relay_engine engine_;
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
    net::signal_set signals_;
    std::array<net::steady_timer, relay_timer_count> timers_;  // indexed by relay_timer
    bool feeding_ = false;
    int exit_code_ = exit_ok;
};

}  // namespace

int run_relay(const relay_options& options) {
    relay r(options);
    return r.run();
}

}  // namespace outboxd::app
