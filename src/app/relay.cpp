#include "app/relay.hpp"

#include <utility>  // before Asio

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <variant>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/except>

#include "app/exit_codes.hpp"
#include "app/relay_telemetry.hpp"
#include "app/sink.hpp"
#include "app/store_worker.hpp"
#include "app/wal_wake_checks.hpp"
#include "core/claim_sequence.hpp"
#include "core/clock.hpp"
#include "core/consume_choice.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/embedded_sql.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/pgoutput.hpp"
#include "core/pre_window_park.hpp"
#include "core/relay_engine.hpp"
#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "core/wake_policy.hpp"
#include "core/window_safety.hpp"
#include "nats/subject.hpp"
#include "pg/listener.hpp"
#include "pg/store.hpp"
#include "pg/wal_listener.hpp"

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
// followed: see pg::store::claim.
class store_claims final : public claim_port {
public:
    store_claims(pg::store& store, bool followed) : store_(store), followed_(followed) {}
    claim_result claim_events(std::size_t size, std::chrono::milliseconds lease,
                              const std::optional<claim_watermark>& after,
                              const std::optional<std::string>& low_mark, bool unkeyed) override {
        return store_.claim(size, lease, after, low_mark, followed_, unkeyed);
    }
    std::vector<event> claim_deliveries(std::size_t size, std::chrono::milliseconds lease,
                                        std::span<const std::string> destinations) override {
        return store_.claim_deliveries(size, lease, destinations);
    }
    std::size_t release_untracked(const held_leases& keep) override { return store_.release_untracked(keep); }
    window_read_result read_window(const window_read_request& request) override {
        return store_.read_window_page(request);
    }

private:
    pg::store& store_;
    bool followed_;
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
    for (const auto& h : batch.handed_back) fenced += store.hand_back(h.ref, h.delay) ? 0 : 1;
    for (const auto& h : batch.deliveries_handed_back) fenced += store.hand_back_delivery(h.ref, h.delay) ? 0 : 1;
    // A park that wrote nothing was written before, or its cursor is lost
    // (the next checkpoint says which): not counted as fenced.
    if (!batch.parks.empty()) (void)store.write_parks(batch.parks);
    return fenced;
}

send_result to_send_result(http::response_summary&& r) {
    return {r.transport_error, r.status, std::move(r.error), std::move(r.retry_after), std::move(r.body_excerpt),
            r.elapsed};
}

// One timer per relay_timer (steady_timer has no default constructor).
template <std::size_t... I>
std::array<net::steady_timer, sizeof...(I)> timers_on(net::io_context& ioc, std::index_sequence<I...> /*unused*/) {
    return {((void)I, net::steady_timer(ioc))...};
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
          config_(std::make_unique<const config>(opts_.settings)),
          engine_(std::make_unique<relay_engine>(*config_, clock_, std::random_device{}())),
          store_(o.dsn, cfg().schema, o.lease_owner, /*relay_session=*/true, /*plan_once=*/true,
                 cfg().db_statement_timeout, configured_destination_names(cfg())),
          worker_(store_),
          outcome_store_(o.dsn, cfg().schema, o.lease_owner, /*relay_session=*/true, /*plan_once=*/false,
                         cfg().db_statement_timeout),
          outcome_worker_(outcome_store_),
          telemetry_(ioc_, config_, engine_, outcome_worker_, o.dsn,
                     plan_migrations(std::nullopt, embedded::migrations()).binary_version),
          wake_(wake_settings(cfg())),
          wake_timer_(ioc_),
          listener_(ioc_, worker_.executor(), o.dsn, notify_channel(cfg().schema),
                    {[this] {
                         telemetry_.notified();
                         feed_wake([](wake_policy& w, auto now) { return w.notified(now); });
                     },
                     [this] {
                         telemetry_.listen_restored();
                         wake();
                         feed_wake([](wake_policy& w, auto now) { return w.listening(now); });
                     },
                     [this](const std::string& why) {
                         telemetry_.listen_lost(why);
                         reconnect_stores();
                     }},
                    cfg().db_keepalive_timeout),
          wal_listener_(ioc_, o.dsn, cfg().schema,
                        {[this](std::string xids) {
                             telemetry_.notified();
                             feed_wake([&](wake_policy& w, auto now) { return w.committed(xids, now); });
                         },
                         [this](bool resumed) {
                             // A reconnect, not the start or the end of a pause.
                             if (wal_streamed_ && !resumed) telemetry_.listen_restored();
                             wal_streamed_ = true;
                             feed_wake([](wake_policy& w, auto now) { return w.stream_up(now); });
                         },
                         [this](const std::string& why) {
                             telemetry_.listen_lost("WAL stream: " + why);
                             feed_wake([](wake_policy& w, auto now) { return w.stream_down(now); });
                         }},
                        cfg().db_keepalive_timeout),
          signals_(ioc_, SIGINT, SIGTERM),
          hangup_(ioc_, SIGHUP),
          timers_{timers_on(ioc_, std::make_index_sequence<relay_timer_count>{})} {
        engine_->observe(&telemetry_);
        sinks_ = make_sinks(cfg());
        if (cfg().db_transaction_pooling && cfg().live_leases) {
            // A session advisory lock means nothing through a transaction pooler.
            throw fatal_error(exit_usage, "database.transaction_pooling needs relay.live_leases = false");
        }
        if (cfg().consume == "windows" && !cfg().live_leases) {
            // Window cursors belong to registered relays (sql/0006).
            throw fatal_error(exit_usage, "relay.consume = \"windows\" needs relay.live_leases = true");
        }
        store_.set_transaction_pooling(cfg().db_transaction_pooling);
        store_.set_consume_windows(cfg().consume == "windows");
        outcome_store_.set_transaction_pooling(cfg().db_transaction_pooling);
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
        if (refusal_) throw *refusal_;
        return exit_code_;
    }

private:
    // ---- startup -------------------------------------------------------

    void start() {
        bool trigger_installed = true;
        // Fail fast on the first connection: a wrong URL or password is an
        // operator error to report, not an outage to wait out.
        try {
            store_.connect();
            check_schema(store_.schema_version());
            message_prefix_ = store_.message_prefix();
            settle_consume_mode();
            // Before anything is written (a standby refuses writes with a
            // message that does not say why).
            if (cfg().consume == "windows") store_.check_window_server();
            if (cfg().live_leases) {
                store_.bind_leases_to_session();
                refuse_beside_relays_consuming_otherwise();
            }
            if (cfg().consume == "windows") {
                if (!store_.windows_set_up()) {
                    throw fatal_error(exit_schema_missing,
                                      "relay.consume = \"windows\": the outbox is not set up for windows (new events "
                                      "do not record their transaction id); run `outboxd consume-setup windows`");
                }
                park_pre_window_events();
            }
            outcome_store_.connect();
            if (wake_.listens()) {
                listener_.connect_now();
                trigger_installed = store_.wake_trigger_installed();
            }
            if (wake_.streams_wal()) {
                check_wal_wake(store_.wal_wake_readiness(pgoutput::publication_name(cfg().schema)), cfg().schema);
                if (store_.wake_trigger_installed()) {
                    log::warn("relay.wake = \"wal\" needs no trigger, and the events table still has one: producers "
                              "read relay_wake at every insert for nothing (run `outboxd wake-setup wal`)");
                }
                try {
                    wal_listener_.connect_now();
                } catch (const pg::wal_connect_error& e) {
                    throw wal_connect_failure(e, opts_.dsn);
                }
            }
        } catch (const fatal_error&) {
            throw;
        } catch (const window_unsafe& e) {
            throw fatal_error(exit_window_unsafe, e.what());
        } catch (const pqxx::broken_connection& e) {
            throw database_unavailable(e, opts_.dsn);
        } catch (const pqxx::insufficient_privilege& e) {
            throw permission_denied(primary_message(e.what()));
        } catch (const std::exception& e) {
            throw fatal_error(exit_db_unavailable,
                              fmt::format("database error at startup: {}", scrub_secrets(e.what(), opts_.dsn)));
        }
        if (wake_.listens()) listener_.start();
        if (wake_.streams_wal()) wal_listener_.start();
        try {
            telemetry_.start();
        } catch (const boost::system::system_error& e) {
            throw fatal_error(exit_usage, fmt::format("admin.listen: cannot listen on {}: {}", cfg().admin_listen,
                                                      e.code().message()));
        }
        wait_for_signal();
        wait_for_hangup();
        log_started();
        // LISTEN is active; now drain whatever was committed before it. The
        // wake-up declaration first: it goes ahead of the drain on the claim
        // connection, so the drain and the watch that follows it see every
        // commit that read "no relay idle" (core/wake_policy.hpp).
        feed_wake([](wake_policy& w, auto now) { return w.started(now); });
        if (wake_.listens()) {
            feed_wake([&](wake_policy& w, auto now) { return trigger_installed ? w.listening(now) : w.no_trigger(now); });
        }
        feed([this](relay_engine& e) { e.start(message_prefix_, opts_.mode); });
    }

    // relay.consume = "auto" (the default): the mode this relay runs in,
    // from the database (core/consume_choice.hpp). The engine is rebuilt for
    // it before it is given anything: from here on the configuration holds
    // the mode chosen. Two relays that choose at once see each other in
    // refuse_beside_relays_consuming_otherwise() below.
    void settle_consume_mode() {
        const bool windows_set_up = store_.windows_set_up();
        if (cfg().consume == "auto") {
            consume_facts facts;
            facts.live_leases = cfg().live_leases;
            facts.windows_set_up = windows_set_up;
            if (facts.live_leases) {
                for (auto& r : store_.live_relays()) facts.live_relay_modes.push_back(std::move(r.consume));
            }
            const auto chosen = outboxd::choose_consume_mode(facts);
            consume_reason_ = outboxd::describe(chosen.why);
            auto settings = cfg();
            settings.consume = chosen.mode;
            replace_engine(std::make_unique<const config>(std::move(settings)));
            store_.set_consume_windows(cfg().consume == "windows");
            if (chosen.why == consume_choice::because::joins_live_relays) {
                if (cfg().consume == "claims" && windows_set_up) {
                    log::info("relay.consume = \"auto\" claims beside the claiming relays already running; the "
                              "outbox is set up for windows, and its relays read windows once every relay has "
                              "stopped and one starts again");
                }
                return;
            }
        }
        // A relay that claims by choice, not to join relays that claim,
        // beside the txid default and index nobody reads.
        if (cfg().consume == "claims" && windows_set_up) {
            log::warn("relay.consume = \"claims\" on an outbox set up for windows: producers pay one index entry "
                      "per event that no relay reads (run `outboxd consume-setup claims` to drop it, once no "
                      "relay reads windows)");
        }
    }

    // A claiming relay and a windows relay side by side both send what the
    // windows relay reads (sql/0015): twice, and a key's two copies may
    // interleave out of order. Asked after our registration committed, so
    // of two relays of different modes starting together at least one
    // refuses. Relays without live leases register nowhere and are not seen.
    void refuse_beside_relays_consuming_otherwise() {
        const auto others = store_.relays_consuming_otherwise();
        if (!others.empty()) throw mode_conflict(others, "");
    }

    [[nodiscard]] fatal_error mode_conflict(const std::vector<pg::store::registered_relay>& others,
                                            std::string_view when) const {
        return fatal_error(
            exit_db_unsuitable,
            fmt::format("relay.consume = \"{}\": {} relay(s) with relay.consume = \"{}\" are running on this outbox "
                        "(lease owner {}){}; every relay of one outbox must use the same mode (side by side they send "
                        "events twice, a key's events possibly out of order): stop them first, or start this one "
                        "with relay.consume = \"{}\"{}",
                        cfg().consume, others.size(), others.front().consume, others.front().lease_owner, when,
                        others.front().consume,
                        opts_.settings.consume == "auto" ? " (relay.consume = \"auto\" joins them when started again)"
                                                         : ""));
    }

    // Events written before `outboxd consume-setup windows` are in no window:
    // each is parked into `deliveries` (core/pre_window_park.hpp), where they
    // drain in id order ahead of the window events of their keys. Behind the
    // takeover of dead relays, whose leases would keep theirs from moving.
    // What a relay still running holds (a lease, a key's hold) cannot move:
    // a claiming relay beside a windows relay sends events twice, so the
    // relay refuses to start until those relays are stopped.
    void park_pre_window_events() {
        if (store_.pre_window_events() == 0) return;
        if (cfg().live_leases) (void)store_.take_over_dead_relays();
        const route_table routes(cfg());
        constexpr std::size_t page_size = 1000;
        std::size_t parked = 0;
        std::size_t dead = 0;
        for (std::int64_t after = 0;;) {
            const auto page = store_.pre_window_page(after, page_size);
            if (page.empty()) break;
            std::vector<window_park> parks;
            parks.reserve(page.size());
            for (const auto& e : page) {
                parks.push_back(park_pre_window(e, routes, cfg().destinations));
                if (!parks.back().dead.empty()) {
                    log::error("event written before windows cannot be sent; moving to dead letters",
                               {{"event_id", fmt::format("{}", e.id)},
                                {"topic", e.topic},
                                {"error", parks.back().dead.front().error}});
                    ++dead;
                }
            }
            parked += store_.write_pre_window_parks(parks);
            after = page.back().id;
        }
        if (const auto left = store_.pre_window_events(); left > 0) {
            throw fatal_error(
                exit_db_unsuitable,
                fmt::format("relay.consume = \"windows\": {} events written before `outboxd consume-setup windows` "
                            "are being sent by a relay that claims (a lease or its key's hold is running); every "
                            "relay of one outbox must use the same mode: stop the claiming relays (their leases "
                            "are handed back), then start again",
                            left));
        }
        log::info("events written before windows moved to deliveries, ahead of the window events of their keys",
                  {{"events", fmt::format("{}", parked)}, {"dead_lettered", fmt::format("{}", dead)}});
    }

    static wake_policy::settings wake_settings(const config& c) {
        wake_policy::settings s;
        s.mode = parse_wake_mode(c.wake);
        s.poll_interval = c.poll_interval;
        s.busy_gap = c.busy_gap;
        s.refresh_interval = c.sweep_interval;
        return s;
    }

    // ---- wake-up (core/wake_policy.hpp) ----------------------------------

    // A declaration counts this long: a relay that stopped refreshing it
    // (every sweep) is presumed dead.
    [[nodiscard]] std::chrono::milliseconds declaration_validity() const { return 3 * cfg().sweep_interval; }

    // Gives the wake policy one input, f(policy, now), and does what it says.
    template <typename F>
    void feed_wake(F&& f) {
        apply(f(wake_, std::chrono::steady_clock::now()));
    }

    void apply(const wake_policy::actions& a) {
        if (a.claim_from_start) {
            feed([](relay_engine& e) { e.wake_from_start(); });
        } else if (a.claim_since) {
            feed([since = *a.claim_since](relay_engine& e) { e.wake_since(since); });
        } else if (a.claim) {
            wake();
        }
        if (a.declare || a.read_in_progress) {
            // On the claim connection, in order with the claims: a producer
            // that read "busy" before this commit is in progress at the read
            // that follows, or committed before the claims that follow.
            worker_.submit([this, declare = a.declare, read = a.read_in_progress,
                            valid = declaration_validity()](pg::store& store) {
                std::vector<xact_in_progress> xacts;
                bool ok = true;
                try {
                    if (declare) store.declare_wake(*declare, valid);
                    if (read) xacts = store.transactions_in_progress();
                } catch (const std::exception& e) {
                    ok = false;
                    log::warn(declare ? "declaring the relay idle or busy failed"
                                      : "reading the transactions in progress failed",
                              {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
                net::post(ioc_, [this, ok, read, xacts = std::move(xacts)]() mutable {
                    if (ok && read) {
                        feed_wake([&](wake_policy& w, auto now) { return w.declared_idle(std::move(xacts), now); });
                    } else {
                        feed_wake([&](wake_policy& w, auto now) { return w.declared(ok, now); });
                    }
                });
            });
        }
        if (a.watch) {
            worker_.submit([this, xids = wake_.in_progress()](pg::store& store) {
                std::string remaining = xids;
                try {
                    remaining = store.still_in_progress(xids);
                } catch (const std::exception& e) {
                    log::warn("reading transactions in progress failed",
                              {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
                net::post(ioc_, [this, remaining = std::move(remaining)]() mutable {
                    feed_wake([&](wake_policy& w, auto now) { return w.watched(std::move(remaining), now); });
                });
            });
        }
        if (a.check_visible) {
            // On the claim connection, ahead of the claim it may lead to: a
            // commit visible to this check is visible to that claim.
            worker_.submit([this, xids = wake_.unseen()](pg::store& store) {
                std::string remaining;
                try {
                    remaining = store.not_yet_visible(xids);
                } catch (const std::exception& e) {
                    log::warn("checking whether streamed commits are visible failed; claiming anyway",
                              {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
                net::post(ioc_, [this, remaining = std::move(remaining)] {
                    feed_wake([&](wake_policy& w, auto now) { return w.visible(remaining, now); });
                });
            });
        }
        if (a.pause_stream) wal_listener_.pause();
        if (a.resume_stream) wal_listener_.resume();
        if (a.self_notify) {
            outcome_worker_.submit([this, channel = notify_channel(cfg().schema)](pg::store& store) {
                try {
                    store.notify(channel);
                } catch (const std::exception& e) {
                    log::warn("the notification self-test could not notify",
                              {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
            });
        }
        if (const auto at = wake_.next_timer()) {
            wake_timer_.expires_at(*at);
            wake_timer_.async_wait([this](const boost::system::error_code& ec) {
                if (!ec && !stopped_waking_) feed_wake([](wake_policy& w, auto now) { return w.timer(now); });
            });
        } else {
            wake_timer_.cancel();
        }
    }

    void log_started() {
        for (const auto& d : cfg().destinations) {
            if (d.kind == transport::webhook && d.url.is_tls() && !d.tls.verify) {
                log::warn("INSECURE: TLS certificate verification is off for this destination; anyone on the "
                          "network path can impersonate it and read every event",
                          {{"destination", d.name}, {"url", describe(d)}});
            }
        }
        std::string destinations;
        for (const auto& d : cfg().destinations) {
            destinations += fmt::format("{}{}={}", destinations.empty() ? "" : " ", d.name, describe(d));
        }
        log::info("relay started", {{"schema", cfg().schema},
                                    {"destinations", destinations},
                                    {"concurrency", fmt::format("{}", cfg().concurrency)},
                                    {"lease", format_duration(cfg().lease)},
                                    {"sweep_interval", format_duration(cfg().sweep_interval)},
                                    {"wake", cfg().wake},
                                    {"consume", cfg().consume},
                                    {"consume_because", std::string(consume_reason_)},
                                    {"lease_owner", opts_.lease_owner},
                                    {"mode", opts_.mode == run_mode::once ? "once" : "serve"}});
    }

    [[nodiscard]] const config& cfg() const noexcept { return *config_; }

    // One sink per destination, same index.
    std::vector<std::unique_ptr<sink>> make_sinks(const config& c) {
        std::vector<std::unique_ptr<sink>> out;
        for (const auto& d : c.destinations) {
            try {
                out.push_back(d.kind == transport::stdout_lines ? make_stdout_sink(ioc_)
                              : d.kind == transport::nats
                                  ? make_nats_sink(ioc_, d)
                                  : make_webhook_sink(ioc_, d, c.block_private_addresses));
            } catch (const std::invalid_argument& e) {
                throw fatal_error(exit_usage, fmt::format("destination {}: {}", d.name, e.what()));
            }
        }
        return out;
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
                                          quote_ident(cfg().schema), plan.database_version, plan.binary_version));
        }
        if (!version || !plan.pending.empty()) {
            throw fatal_error(exit_schema_missing,
                              fmt::format("the outbox in schema {} is {}; run `outboxd migrate` (or apply "
                                          "`outboxd sql`) first",
                                          quote_ident(cfg().schema),
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
            if (next_config_ && !terminating_) {
                // A reload is draining the old engine: stop once it is done
                // instead of starting the new one. A further signal forces.
                terminating_ = true;
                log::info("shutting down: the reload under way finishes its in-flight deliveries first",
                          {{"signal", fmt::format("{}", sig)}});
                return;
            }
            terminating_ = true;
            feed([sig](relay_engine& e) { e.signalled(sig); });
        });
    }

    // ---- reload (SIGHUP) -------------------------------------------------
    // The engine's per-destination state (lanes, circuits, requests in
    // flight, the sinks and their pools) is indexed by the configuration it
    // was built with. A reload therefore drains the running engine as a
    // shutdown does (no new claims; what is claimed but not started is
    // handed back due now, attempt not counted; what is being sent finishes
    // under the old configuration and its outcome is written), then starts a
    // new engine and new sinks with the new configuration on the same
    // process, database connections, LISTEN and lease owner. Nothing in
    // flight is dropped; claims pause for as long as the slowest request
    // (at most relay.shutdown_timeout). An invalid file changes nothing.

    void wait_for_hangup() {
        hangup_.async_wait([this](const boost::system::error_code& ec, int) {
            if (ec) return;
            wait_for_hangup();
            reload();
        });
    }

    void reload() {
        if (terminating_ || engine_->finished_running() || (engine_->stopping() && !next_config_)) {
            log::warn("SIGHUP ignored: the relay is stopping");
            return;
        }
        if (!opts_.reload) {
            log::warn("SIGHUP ignored: this relay cannot read its configuration again");
            return;
        }
        std::unique_ptr<config> fresh;
        try {
            fresh = std::make_unique<config>(opts_.reload());
        } catch (const std::exception& e) {
            log::error("reload refused: the configuration is not valid; running on with the current one",
                       {{"error", e.what()}});
            return;
        }
        // relay.consume "auto" was settled at startup into the mode running
        // now (cfg()): it needs no restart; naming another mode does.
        if (fresh->consume == "auto") fresh->consume = cfg().consume;
        if (const auto why = needs_restart(cfg(), *fresh)) {
            log::error("reload refused: a setting changed that only a restart applies; running on with the "
                       "current configuration",
                       {{"setting", *why}});
            return;
        }
        const bool draining = next_config_ != nullptr;
        next_config_ = std::move(fresh);
        if (draining) return;  // the newest file wins when the drain ends
        feed([](relay_engine& e) { e.reload_requested(); });
    }

    // The settings the process was built on: its connections, LISTEN, lease
    // binding and log sinks stay across a reload.
    static std::optional<std::string> needs_restart(const config& now, const config& next) {
        if (now.database_url != next.database_url) return "database.url";
        if (now.schema != next.schema) return "schema";
        if (now.db_statement_timeout != next.db_statement_timeout) return "database.statement_timeout";
        if (now.db_connect_timeout != next.db_connect_timeout) return "database.connect_timeout";
        if (now.db_keepalive_timeout != next.db_keepalive_timeout) return "database.keepalive_timeout";
        if (now.live_leases != next.live_leases) return "relay.live_leases";
        if (now.consume != next.consume) return "relay.consume";
        if (now.wake != next.wake) return "relay.wake";
        if (now.poll_interval != next.poll_interval) return "relay.poll_interval";
        if (now.busy_gap != next.busy_gap) return "relay.busy_gap";
        if (now.db_transaction_pooling != next.db_transaction_pooling) return "database.transaction_pooling";
        return std::nullopt;
    }

    // A new engine on `next`, before it is given anything; the old one first
    // (it holds a reference to the configuration it was built on).
    void replace_engine(std::unique_ptr<const config> next) {
        engine_.reset();
        config_ = std::move(next);
        engine_ = std::make_unique<relay_engine>(*config_, clock_, std::random_device{}());
        engine_->observe(&telemetry_);
    }

    // The old engine is done (its finish_command ran): start the new one.
    void swap_engine() {
        ++epoch_;  // whatever the old engine still had on its way is ignored
        for (auto& t : timers_) t.cancel();
        for (auto& s : sinks_) retired_sinks_.push_back(std::move(s));
        auto next = std::move(next_config_);
        try {
            sinks_ = make_sinks(*next);
        } catch (const fatal_error& e) {
            // Checked by the configuration already; should a sink still
            // refuse, keep the old configuration rather than stop.
            log::error("reload failed; running on with the previous configuration", {{"error", e.what()}});
            next = std::make_unique<const config>(cfg());
            sinks_ = make_sinks(*next);
        }
        replace_engine(std::move(next));
        // Ahead of the new engine's first claim, on the same connection.
        worker_.submit([this, names = configured_destination_names(cfg())](pg::store& s) {
            try {
                s.set_destinations(names);
            } catch (const std::exception& e) {
                // Its claims then see other destinations' deliveries as due
                // (an extra claim now and then); the next connection is right.
                log::warn("preparing the claims for the new destinations failed",
                          {{"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
        });
        if (cfg().live_leases) {
            outcome_worker_.submit([this](pg::store& s) {
                try {
                    s.reset_circuits();
                } catch (const std::exception& e) {
                    log::warn("publishing circuits failed", {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
            });
        }
        log::info("reloaded");
        log_started();
        feed([this](relay_engine& e) { e.start(message_prefix_, opts_.mode); });
    }

    // ---- carrying out the engine's commands ------------------------------

    // Gives the engine one input (on the event loop), then does what it
    // says. An input given while commands are being carried out (a callback
    // that runs at once) only adds commands; the outer call carries them out.
    template <typename Input>
    void feed(Input&& input) {
        input(*engine_);
        if (feeding_) return;
        feeding_ = true;
        for (auto commands = engine_->take_commands(); !commands.empty(); commands = engine_->take_commands()) {
            for (auto& c : commands) std::visit([this](auto& command) { run(command); }, c);
        }
        feeding_ = false;
    }

    // An answer to a command of the engine that ran at `epoch`: ignored when
    // a reload has replaced that engine since.
    template <typename Input>
    void feed_from(std::uint64_t epoch, Input&& input) {
        if (epoch == epoch_) feed(std::forward<Input>(input));
    }

    void run(claim_command& c) {
        worker_.submit([this, epoch = epoch_, request = std::move(c.request),
                        followed = wake_.claims_back_to_back()](pg::store& store) {
            try {
                store_claims port(store, followed);
                const auto started = std::chrono::steady_clock::now();
                auto outcome = run_claim(port, request);
                outcome.started = started;
                outcome.done = std::chrono::steady_clock::now();
                net::post(ioc_, [this, epoch, outcome = std::move(outcome)]() mutable {
                    // Window events read count as claimed for the wake-up policy.
                    const auto got = outcome.events.size() + (outcome.window ? outcome.window->events.size() : 0);
                    const auto full = outcome.full || (outcome.window && outcome.window->full);
                    feed_from(epoch, [&](relay_engine& e) { e.claimed(std::move(outcome)); });
                    if (epoch == epoch_ && !engine_->stopping()) {
                        feed_wake([&](wake_policy& w, auto now) { return w.claimed(got, full, now); });
                    }
                });
            } catch (const window_unsafe& e) {
                net::post(ioc_, [this, why = std::string(e.what())] { refuse(exit_window_unsafe, why); });
            } catch (const pg::store::consume_mode_conflict& e) {
                // Re-registered after a lost connection beside relays of the
                // other mode (store.hpp): the claim was not run.
                net::post(ioc_, [this, conflict = mode_conflict(e.others, " (found when this relay registered again "
                                                                          "after its connection was lost)")] {
                    refuse(conflict.code, conflict.what());
                });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, epoch, why = scrub_secrets(e.what(), opts_.dsn)] {
                    feed_from(epoch, [&](relay_engine& en) { en.claim_failed(why); });
                });
            }
        });
    }

    void run(send_command& c) {
        sinks_[c.destination]->send(*c.e, std::move(c.headers), c.deadline,
                                    [this, epoch = epoch_, id = c.send_id](http::response_summary r) {
                                        feed_from(epoch, [&](relay_engine& e) {
                                            e.sent(id, to_send_result(std::move(r)));
                                        });
                                    });
    }

    void run(write_outcomes_command& c) {
        outcome_worker_.submit([this, epoch = epoch_, batch = c.batch](pg::store& store) {
            try {
                const auto fenced = write_outcomes(store, *batch);
                net::post(ioc_, [this, epoch, fenced] {
                    feed_from(epoch, [&](relay_engine& e) { e.outcomes_written(fenced); });
                });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, epoch, why = scrub_secrets(e.what(), opts_.dsn)] {
                    feed_from(epoch, [&](relay_engine& en) { en.outcomes_failed(why); });
                });
            }
        });
    }

    void run(arm_timer_command& c) {
        auto& timer = timers_[static_cast<std::size_t>(c.timer)];
        timer.expires_at(c.at);
        timer.async_wait([this, epoch = epoch_, which = c.timer, gen = c.generation](const boost::system::error_code& ec) {
            if (!ec) feed_from(epoch, [&](relay_engine& e) { e.timer_fired(which, gen); });
        });
    }

    void run(cancel_timer_command& c) { timers_[static_cast<std::size_t>(c.timer)].cancel(); }

    void run(housekeeping_command& c) {
        switch (c.job) {
            case housekeeping_job::idempotency_keys:
                housekeeping("purging idempotency keys", [retention = cfg().idempotency_retention](pg::store& s) {
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
                housekeeping("purging dead letters", [this, epoch = epoch_,
                                                      retention = cfg().dead_letter_retention](pg::store& s) {
                    constexpr std::size_t batch = 1000;
                    const auto purged = s.purge_dead_letters(retention, batch);
                    if (purged > 0) {
                        log::info("purged dead letters past their retention",
                                  {{"count", fmt::format("{}", purged)}, {"retention", format_duration(retention)}});
                    }
                    net::post(ioc_, [this, epoch, more = purged == batch] {
                        feed_from(epoch, [&](relay_engine& e) { e.dead_letters_purged(more); });
                    });
                });
                break;
            case housekeeping_job::window_cleanup:
                housekeeping("deleting delivered window events", [this, epoch = epoch_](pg::store& s) {
                    constexpr std::size_t batch = 5000;
                    bool more = false;
                    try {
                        more = s.cleanup_window_events(batch) == batch;
                    } catch (...) {
                        net::post(ioc_, [this, epoch] {
                            feed_from(epoch, [&](relay_engine& e) { e.window_cleanup_done(false); });
                        });
                        throw;
                    }
                    net::post(ioc_, [this, epoch, more] {
                        feed_from(epoch, [&](relay_engine& e) { e.window_cleanup_done(more); });
                    });
                });
                break;
            case housekeeping_job::dead_relays:
                housekeeping("taking over the leases of dead relays", [this, epoch = epoch_](pg::store& s) {
                    const auto taken = s.take_over_dead_relays();
                    if (taken.relays.empty()) return;
                    std::string owners;
                    for (const auto& o : taken.relays) owners += (owners.empty() ? "" : " ") + o;
                    log::info("took over the leases of relays whose database session is gone",
                              {{"relays", owners}, {"leases", fmt::format("{}", taken.leases)}});
                    net::post(ioc_, [this, epoch, n = taken.leases, relays = taken.relays.size()] {
                        telemetry_.taken_over(relays, n);
                        feed_from(epoch, [&](relay_engine& e) { e.relays_taken_over(n); });
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
        outcome_worker_.submit([this, destination = std::move(c.destination), just_one = c.just_one](pg::store& store) {
            try {
                if (just_one) {
                    (void)store.release_one_waiting_delivery(destination);
                } else {
                    const auto released = store.release_waiting_deliveries(destination);
                    log::info("released waiting deliveries",
                              {{"destination", destination}, {"count", fmt::format("{}", released)}});
                }
            } catch (const std::exception& e) {
                // They stay on their own schedule.
                log::warn("releasing waiting deliveries failed",
                          {{"destination", destination}, {"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
            net::post(ioc_, [this] { wake(); });
        });
    }

    // On the outcome connection, behind the takeover of dead relays (their
    // rows would count in the share while it holds their locks). Cursors
    // belong to the lease owner, whose session lock the claim connection
    // holds.
    void run(take_cursors_command& c) {
        outcome_worker_.submit([this, epoch = epoch_, held = std::move(c.held)](pg::store& store) {
            try {
                net::post(ioc_, [this, epoch, got = store.take_free_cursors(held)]() mutable {
                    feed_from(epoch, [&](relay_engine& e) { e.cursors_taken(std::move(got.taken), got.share); });
                });
            } catch (const window_unsafe& e) {
                net::post(ioc_, [this, why = std::string(e.what())] { refuse(exit_window_unsafe, why); });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, epoch, why = scrub_secrets(e.what(), opts_.dsn)] {
                    feed_from(epoch, [&](relay_engine& en) { en.cursors_take_failed(why); });
                });
            }
        });
    }

    void run(release_cursors_command& c) {
        outcome_worker_.submit([this, position = std::move(c.position)](pg::store& store) {
            try {
                (void)store.checkpoint_cursors(position);
                (void)store.release_cursors(position);
            } catch (const std::exception& e) {
                // Still ours: another relay takes them once our session is gone.
                log::warn("handing window cursors over failed", {{"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
        });
    }

    // On the outcome connection, behind the outcomes written before it.
    void run(checkpoint_command& c) {
        outcome_worker_.submit([this, epoch = epoch_, position = std::move(c.position)](pg::store& store) {
            try {
                const auto written = store.checkpoint_cursors(position);
                net::post(ioc_, [this, epoch, position, written] {
                    feed_from(epoch, [&](relay_engine& e) { e.checkpointed(position, written); });
                });
            } catch (const std::exception& e) {
                net::post(ioc_, [this, epoch, why = scrub_secrets(e.what(), opts_.dsn)] {
                    feed_from(epoch, [&](relay_engine& en) { en.checkpoint_failed(why); });
                });
            }
        });
    }

    void run(stop_listening_command&) {
        listener_.stop();
        wal_listener_.stop();
        telemetry_.stopping();
        stopped_waking_ = true;
        wake_timer_.cancel();
    }

    void run(finish_command& c) {
        // A reload's old engine finishing: the process, its admin listener
        // (health probes) and its timers go on with the next engine.
        if (!next_config_ || terminating_) telemetry_.stop();
        for (auto& s : sinks_) s->close();
        outcome_worker_.submit([this, batch = std::make_shared<outcome_batch>(std::move(c.last)),
                                cursors = std::move(c.cursors)](pg::store& store) {
            try {
                (void)write_outcomes(store, *batch);
            } catch (const std::exception& e) {
                log::error("could not record the last outcomes; those events are delivered again after their lease",
                           {{"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
            if (cursors) {
                // Where the next reader starts, then free for it at once; and
                // what that leaves delivered behind every cursor goes now
                // (a bounded amount: the rest goes with the next relay).
                try {
                    (void)store.checkpoint_cursors(*cursors);
                    (void)store.release_cursors(*cursors);
                    constexpr std::size_t batch = 5000;
                    for (int i = 0; i < 4 && store.cleanup_window_events(batch) == batch; ++i) {
                    }
                } catch (const std::exception& e) {
                    log::error("could not hand over the window cursors; the next relay resumes from their last "
                               "checkpoint once this one's session is gone",
                               {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
            }
            // Release on the claim connection, after any claim still running
            // there (a timed-out shutdown may have one): what it took is
            // released too.
            worker_.submit([this](pg::store& claim_store) {
                if (wake_.listens() && !(next_config_ && !terminating_)) {
                    try {
                        claim_store.forget_wake();
                    } catch (const std::exception& e) {
                        log::warn("could not withdraw the relay's wake-up declaration; it expires on its own",
                                  {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                    }
                }
                try {
                    const auto released = claim_store.release();
                    log::info(next_config_ && !terminating_ ? "old configuration stopped" : "stopped",
                              {{"released", fmt::format("{}", released)}});
                } catch (const std::exception& e) {
                    log::error("could not release leases; they expire on their own",
                               {{"error", scrub_secrets(e.what(), opts_.dsn)}});
                }
                net::post(ioc_, [this] {
                    if (next_config_ && !terminating_) {
                        swap_engine();
                    } else {
                        ioc_.stop();
                    }
                });
            });
        });
    }

    void run(circuit_changed_command& c) {
        if (!cfg().live_leases) return;  // no relays row to publish on
        nlohmann::json state{{"state", c.state == circuit_state::open ? "open" : "closed"},
                             {"failures", c.failures}};
        outcome_worker_.submit([this, destination = std::move(c.destination), state = state.dump()](pg::store& s) {
            try {
                s.publish_circuit(destination, state);
            } catch (const std::exception& e) {
                log::warn("publishing a circuit's state failed",
                          {{"destination", destination}, {"error", scrub_secrets(e.what(), opts_.dsn)}});
            }
        });
    }

    // A window must not be read against this server (core/window_safety.hpp),
    // or relays of the other consume mode run beside this one: stop at once
    // and take nothing more. What is in flight is not recorded: it is sent
    // again later (at-least-once).
    void refuse(int code, const std::string& why) {
        if (refusal_) return;
        refusal_.emplace(code, why);
        ioc_.stop();
    }

    void run(exit_now_command&) {
        exit_code_ = exit_forced;
        ioc_.stop();
    }

    relay_options opts_;
    // The configuration the engine and sinks run on; replaced by a reload.
    std::unique_ptr<const config> config_;
    system_clock_source clock_;
    std::unique_ptr<relay_engine> engine_;
    // Which engine commands belong to: a reload starts a new epoch.
    std::uint64_t epoch_ = 0;
    // Set while a reload drains the old engine: the configuration to start next.
    std::unique_ptr<const config> next_config_;
    bool terminating_ = false;  // SIGINT/SIGTERM received
    // What this outbox's webhook-ids start with (read at startup, sql/0005).
    std::string message_prefix_;
    net::io_context ioc_;
    // Claims and outcome writes run on connections (and threads) of their
    // own, so a claim never queues behind a batch of acknowledgements.
    pg::store store_;
    store_worker worker_;
    pg::store outcome_store_;
    store_worker outcome_worker_;
    relay_telemetry telemetry_;  // metrics, the admin listener, the summary line
    wake_policy wake_;
    net::steady_timer wake_timer_;
    bool stopped_waking_ = false;
    pg::listener listener_;
    pg::wal_listener wal_listener_;  // relay.wake = "wal" only
    bool wal_streamed_ = false;      // the WAL stream has run once
    std::vector<std::unique_ptr<sink>> sinks_;  // one per destination, same index
    // Sinks of configurations a reload replaced: closed, kept until exit so
    // that a request still on its way (a timed-out drain) completes safely.
    std::vector<std::unique_ptr<sink>> retired_sinks_;
    net::signal_set signals_;
    net::signal_set hangup_;
    std::array<net::steady_timer, relay_timer_count> timers_;  // indexed by relay_timer
    bool feeding_ = false;
    int exit_code_ = exit_ok;
    std::optional<fatal_error> refusal_;  // refuse()
    std::string_view consume_reason_ = "configured";  // why cfg().consume (settle_consume_mode())
};

}  // namespace

int run_relay(const relay_options& options) {
    relay r(options);
    return r.run();
}

}  // namespace outboxd::app
