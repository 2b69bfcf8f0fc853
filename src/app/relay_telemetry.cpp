#include "app/relay_telemetry.hpp"

#include <algorithm>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "core/circuit_breaker.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/log.hpp"

namespace outboxd::app {

namespace net = boost::asio;
using std::chrono::steady_clock;

namespace {

std::string_view outcome_name(delivery_result r) {
    switch (r) {
        case delivery_result::delivered: return "delivered";
        case delivery_result::retry: return "retry";
        case delivery_result::dead: return "dead";
        case delivery_result::handed_back: return "handed_back";
    }
    return "retry";
}

std::string_view source_name(wake_source s) {
    switch (s) {
        case wake_source::notify: return "notify";
        case wake_source::sweep: return "sweep";
        case wake_source::timer: return "timer";
        case wake_source::reconnect: return "reconnect";
    }
    return "timer";
}

const std::vector<double> latency_bounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                         2.5,   5,    10,    30,   60,  300,  1800, 3600};
const std::vector<double> attempt_bounds{1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50};
const std::vector<double> claim_bounds{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

}  // namespace

relay_telemetry::relay_telemetry(net::io_context& ioc, const std::unique_ptr<const config>& current_config,
                                 const std::unique_ptr<relay_engine>& current_engine, store_worker& stats_worker,
                                 std::string dsn, int needed_schema)
    : ioc_(ioc),
      config_(current_config),
      engine_ptr_(current_engine),
      stats_worker_(stats_worker),
      dsn_(std::move(dsn)),
      needed_schema_(needed_schema),
      deliveries_(registry_.add_counter(
          "outboxd_deliveries_total",
          "Results of deliveries by destination: delivered, retry (failed, will be retried), dead (moved to dead "
          "letters), handed_back (not sent, due again, no attempt counted). destination=\"\": the event as a whole "
          "(no route, cannot be sent, or handed back before a destination was chosen).",
          {"destination", "outcome"})),
      latency_(registry_.add_histogram(
          "outboxd_delivery_latency_seconds",
          "From the event's created_at (its transaction's start, by the database's clock) to its delivery at the "
          "destination.",
          {"destination"}, latency_bounds)),
      attempts_(registry_.add_histogram("outboxd_delivery_attempts",
                                        "The attempt that ended a delivery (delivered or dead), by destination.",
                                        {"destination"}, attempt_bounds)),
      in_flight_(registry_.add_gauge("outboxd_in_flight", "Claimed events being sent now (delivery slots in use).")
                     .with({})),
      claimed_ahead_(registry_
                         .add_gauge("outboxd_claimed_ahead",
                                    "Claimed events waiting in this relay for a free delivery slot.")
                         .with({})),
      claims_(registry_.add_counter("outboxd_claims_total", "Claims that came back (events and deliveries).").with({})),
      claim_failures_(
          registry_.add_counter("outboxd_claim_failures_total", "Claims that failed (database errors).").with({})),
      claim_size_(registry_
                      .add_histogram("outboxd_claim_size", "Events and deliveries returned by one claim.", {},
                                     claim_bounds)
                      .with({})),
      wakes_(registry_.add_counter(
          "outboxd_wakes_total",
          "Reasons to claim: notify (a NOTIFY), sweep (the periodic sweep), timer (a retry or delayed event due, a "
          "claim retried, a circuit probe), reconnect (LISTEN re-established).",
          {"source"})),
      sweeps_(registry_.add_counter("outboxd_sweeps_total", "Periodic sweeps run.").with({})),
      reconnects_(registry_
                      .add_counter("outboxd_database_reconnects_total",
                                   "Times the LISTEN connection was re-established after it was lost (the claim and "
                                   "outcome connections reconnect with it).")
                      .with({})),
      circuit_(registry_.add_gauge("outboxd_circuit_state",
                                   "Circuit breaker of each destination: 0 closed, 1 open, 2 probing.",
                                   {"destination"})),
      takeovers_(registry_
                     .add_counter("outboxd_takeovers_total",
                                  "Relays found dead (database session gone) whose leases this relay handed back.")
                     .with({})),
      leases_taken_over_(registry_
                             .add_counter("outboxd_leases_taken_over_total",
                                          "Leases of dead relays handed back by this relay (due now).")
                             .with({})),
      backlog_(registry_
                   .add_gauge("outboxd_backlog",
                              fmt::format("Work not yet delivered (events not fanned out, plus per-destination "
                                          "deliveries), counted up to {} of each; read every {} s at most.",
                                          backlog_cap, stats_interval.count()))
                   .with({})),
      oldest_pending_(registry_
                          .add_gauge("outboxd_oldest_pending_age_seconds",
                                     "How long the oldest work that is due and not leased has been due.")
                          .with({})),
      ready_(registry_.add_gauge("outboxd_ready", "1 when /readyz answers 200, else 0.").with({})),
      stats_timer_(ioc),
      summary_timer_(ioc),
      last_summary_at_(steady_clock::now()) {
    // Every destination and outcome from the start, so rates begin at zero.
    for (const auto& d : cfg().destinations) {
        for (const auto r : {delivery_result::delivered, delivery_result::retry, delivery_result::dead,
                             delivery_result::handed_back}) {
            deliveries_.with({d.name, std::string(outcome_name(r))});
        }
        latency_.with({d.name});
        attempts_.with({d.name});
        circuit_.with({d.name});
    }
    for (const auto s : {wake_source::notify, wake_source::sweep, wake_source::timer, wake_source::reconnect}) {
        wake_counters_.at(static_cast<std::size_t>(s)) = &wakes_.with({std::string(source_name(s))});
    }
    registry_.add_gauge("outboxd_build_info", "The outboxd version, as a label; always 1.", {"version"})
        .with({OUTBOXD_VERSION})
        .set(1);
}

relay_telemetry::~relay_telemetry() {
    *alive_ = false;
    stop();
}

void relay_telemetry::start() {
    // Here, not in the constructor: relay.consume = "auto" is settled at
    // startup, before this (relay.cpp settle_consume_mode()).
    registry_
        .add_gauge("outboxd_consume_mode", "The mode this relay takes events in (relay.consume), as a label; always 1.",
                   {"mode"})
        .with({cfg().consume})
        .set(1);
    if (!cfg().admin_listen.empty()) {
        const auto at = parse_listen_address(cfg().admin_listen);
        admin_ = std::make_unique<http::admin_server>(ioc_, at, [this](std::string_view path) { return answer(path); });
        const auto where = fmt::format("{}:{}", at.host.find(':') != std::string::npos ? "[" + at.host + "]" : at.host,
                                       admin_->port());
        log::info("admin listener started", {{"address", where}});
        if (!at.loopback()) {
            log::warn("the admin listener is reachable from other machines: anyone who can reach it reads /metrics "
                      "(destination names, volumes); bind it to 127.0.0.1 or a private interface unless a firewall "
                      "or network policy covers it",
                      {{"address", where}});
        }
        refresh_stats({});
        arm_stats();
    }
    if (cfg().summary_interval.count() > 0) arm_summary();
}

void relay_telemetry::stopping() { stopping_ = true; }

void relay_telemetry::stop() {
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    if (admin_) admin_->stop();
    stats_timer_.cancel();
    summary_timer_.cancel();
}

std::uint16_t relay_telemetry::admin_port() const noexcept { return admin_ ? admin_->port() : 0; }

// ---- from the shell ----------------------------------------------------------

void relay_telemetry::notified() { wake_counters_.at(static_cast<std::size_t>(wake_source::notify))->inc(); }

void relay_telemetry::listen_lost(const std::string& why) {
    listening_ = false;
    listen_error_ = why;  // scrubbed and on one line (scrub_secrets)
}

void relay_telemetry::listen_restored() {
    listening_ = true;
    listen_error_.clear();
    reconnects_.inc();
    wake_counters_.at(static_cast<std::size_t>(wake_source::reconnect))->inc();
}

void relay_telemetry::taken_over(std::size_t relays, std::size_t leases) {
    takeovers_.inc(static_cast<double>(relays));
    leases_taken_over_.inc(static_cast<double>(leases));
}

// ---- from the engine ---------------------------------------------------------

relay_telemetry::destination_series& relay_telemetry::series(std::string_view destination) {
    if (const auto it = series_.find(destination); it != series_.end()) return it->second;
    const std::string name(destination);
    destination_series s;
    for (const auto r : {delivery_result::delivered, delivery_result::retry, delivery_result::dead,
                         delivery_result::handed_back}) {
        s.by_result.at(static_cast<std::size_t>(r)) = &deliveries_.with({name, std::string(outcome_name(r))});
    }
    if (!name.empty()) {
        s.latency = &latency_.with({name});
        s.attempts = &attempts_.with({name});
    }
    return series_.emplace(name, s).first->second;
}

void relay_telemetry::delivery(std::string_view destination, delivery_result result, std::int32_t attempt,
                               std::optional<std::chrono::microseconds> since_commit) {
    auto& s = series(destination);
    s.by_result.at(static_cast<std::size_t>(result))->inc();
    switch (result) {
        case delivery_result::delivered: totals_.delivered += 1; break;
        case delivery_result::retry: totals_.failed += 1; break;
        case delivery_result::dead:
            totals_.failed += 1;
            totals_.dead += 1;
            break;
        case delivery_result::handed_back: totals_.handed_back += 1; break;
    }
    if (s.latency == nullptr) return;  // the event as a whole: no destination's latency or attempts
    if (since_commit) s.latency->observe(std::chrono::duration<double>(*since_commit).count());
    if (result == delivery_result::delivered || result == delivery_result::dead) s.attempts->observe(attempt);
}

void relay_telemetry::claimed(std::size_t events) {
    claims_.inc();
    claim_size_.observe(static_cast<double>(events));
    claim_error_.reset();
}

void relay_telemetry::claim_failed(std::string_view why) {
    claim_failures_.inc();
    claim_error_ = why;  // scrubbed and on one line (scrub_secrets)
}

void relay_telemetry::woken(wake_source source) {
    wake_counters_.at(static_cast<std::size_t>(source))->inc();
    if (source == wake_source::sweep) sweeps_.inc();
}

// ---- answers -----------------------------------------------------------------

std::string relay_telemetry::not_ready_reason() const {
    if (stopping_) return "shutting down";
    if (!listening_) return fmt::format("LISTEN connection lost, reconnecting: {}", listen_error_);
    if (claim_error_) return fmt::format("claims failing: {}", *claim_error_);
    if (schema_version_ && *schema_version_ < needed_schema_) {
        return fmt::format("the outbox schema is at migration {}, this outboxd needs {}; run `outboxd migrate`",
                           *schema_version_, needed_schema_);
    }
    return {};
}

void relay_telemetry::sample_engine() {
    in_flight_.set(static_cast<double>(engine().sending()));
    claimed_ahead_.set(static_cast<double>(engine().ready()));
    for (std::size_t i = 0; i < cfg().destinations.size(); ++i) {
        double v = 0;
        switch (engine().circuit(i)) {
            case circuit_state::closed: v = 0; break;
            case circuit_state::open: v = 1; break;
            case circuit_state::probing: v = 2; break;
        }
        circuit_.with({cfg().destinations[i].name}).set(v);
    }
    ready_.set(not_ready_reason().empty() ? 1 : 0);
}

http::admin_response relay_telemetry::answer(std::string_view path) {
    if (path == "/metrics") {
        sample_engine();
        return {200, std::string(metrics::content_type), registry_.expose()};
    }
    if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
    if (path == "/readyz") {
        const auto why = not_ready_reason();
        if (why.empty()) return {200, "text/plain; charset=utf-8", "ready\n"};
        return {503, "text/plain; charset=utf-8", fmt::format("not ready: {}\n", why)};
    }
    return {404, "text/plain; charset=utf-8", "not found: try /metrics, /healthz or /readyz\n"};
}

// ---- the stats query and the summary -------------------------------------------

void relay_telemetry::refresh_stats(std::function<void()> then) {
    if (then) after_stats_.push_back(std::move(then));
    if (stats_running_) return;
    stats_running_ = true;
    stats_worker_.submit([this, alive = alive_, dsn = dsn_](pg::store& store) {
        std::optional<pg::store::stats> got;
        std::string error;
        try {
            got = store.read_stats(backlog_cap);
        } catch (const std::exception& e) {
            error = scrub_secrets(e.what(), dsn);
        }
        net::post(ioc_, [this, alive, got, error = std::move(error)] {
            if (!*alive) return;
            stats_running_ = false;
            if (got) {
                backlog_.set(static_cast<double>(got->backlog));
                oldest_pending_.set(got->oldest_pending_seconds);
                schema_version_ = got->schema_version;
                stats_error_.reset();
            } else {
                stats_error_ = error;  // scrubbed and on one line (scrub_secrets)
                log::debug("reading the outbox's figures failed", {{"error", *stats_error_}});
            }
            for (auto& f : std::exchange(after_stats_, {})) f();
        });
    });
}

void relay_telemetry::arm_stats() {
    if (stopped_) return;
    stats_timer_.expires_after(stats_interval);
    stats_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec || stopped_) return;
        refresh_stats({});
        arm_stats();
    });
}

void relay_telemetry::arm_summary() {
    if (stopped_) return;
    summary_timer_.expires_after(cfg().summary_interval);
    summary_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec || stopped_) return;
        refresh_stats([this] { summarise(); });
        arm_summary();
    });
}

void relay_telemetry::summarise() {
    if (stopped_) return;
    const auto now = steady_clock::now();
    const auto seconds = std::max(1e-3, std::chrono::duration<double>(now - last_summary_at_).count());
    const auto delivered = totals_.delivered - last_summary_.delivered;
    std::size_t open = 0;
    for (std::size_t i = 0; i < cfg().destinations.size(); ++i) {
        if (engine().circuit(i) != circuit_state::closed) ++open;
    }
    const auto count = [](double v) { return fmt::format("{}", static_cast<long long>(v)); };
    log::fields kv{{"delivered", count(delivered)},
                   {"delivered_per_s", fmt::format("{:.1f}", delivered / seconds)},
                   {"failures", count(totals_.failed - last_summary_.failed)},
                   {"dead", count(totals_.dead - last_summary_.dead)},
                   {"handed_back", count(totals_.handed_back - last_summary_.handed_back)},
                   {"in_flight", fmt::format("{}", engine().sending())},
                   {"open_circuits", fmt::format("{}", open)}};
    if (stats_error_) {
        kv.emplace_back("backlog", "unknown");
        kv.emplace_back("oldest_pending", "unknown");
    } else {
        kv.emplace_back("backlog", count(backlog_.value()));
        kv.emplace_back("oldest_pending",
                        format_duration(std::chrono::milliseconds(static_cast<long long>(oldest_pending_.value() * 1000))));
    }
    kv.emplace_back("interval", format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(now - last_summary_at_)));
    log::info("summary", kv);
    last_summary_ = totals_;
    last_summary_at_ = now;
}

}  // namespace outboxd::app
