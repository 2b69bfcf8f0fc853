#pragma once
// What `outboxd run` tells about itself: the metrics of /metrics (a
// core/metrics registry fed by the relay engine's observer calls and by the
// shell), /healthz and /readyz on the admin listener (admin.listen), and
// the periodic summary line at info level (relay.summary_interval).
//
// Lives on the event loop's thread, beside the engine, whose figures (in
// flight, claimed ahead, circuits) it reads when scraped. The backlog and
// the oldest pending age come from one cheap query (relay_stats) on the
// outcome connection, never the claim connection: every 5 s while the
// admin listener is on, and before each summary; /metrics serves the last
// answer.
//
// Ready means: LISTEN is active, the last claim succeeded (the claim
// connection works), the schema is migrated at least as far as this binary
// needs (a newer one is fine: migrations run while old relays keep going),
// and no shutdown began.

#include <utility>  // before Asio

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "app/store_worker.hpp"
#include "core/config.hpp"
#include "core/metrics.hpp"
#include "core/relay_engine.hpp"
#include "core/relay_metrics.hpp"
#include "http/admin_server.hpp"

namespace outboxd::app {

class relay_telemetry final : public relay_metrics {
public:
    // Stats queries run on `stats_worker` (the outcome connection); errors
    // are cleaned of `dsn`'s password. needed_schema: the migration version
    // this binary needs at least.
    // cfg and engine: the relay's current ones (a SIGHUP reload replaces both).
    relay_telemetry(boost::asio::io_context& ioc, const std::unique_ptr<const config>& cfg,
                    const std::unique_ptr<relay_engine>& engine, store_worker& stats_worker, std::string dsn,
                    int needed_schema);
    ~relay_telemetry() override;

    // Opens the admin listener (if configured) and starts the timers.
    // Throws boost::system::system_error when the address cannot be bound.
    void start();
    // Shutdown began: not ready any more.
    void stopping();
    // Closes the listener, cancels the timers.
    void stop();
    // The admin listener's port (0 when off).
    [[nodiscard]] std::uint16_t admin_port() const noexcept;

    // ---- from the shell ----
    void notified();
    void listen_lost(const std::string& why);
    void listen_restored();
    void taken_over(std::size_t relays, std::size_t leases);

    // ---- relay_metrics (from the engine) ----
    void delivery(std::string_view destination, delivery_result result, std::int32_t attempt,
                  std::optional<std::chrono::microseconds> since_commit) override;
    void claimed(std::size_t events) override;
    void claim_failed(std::string_view why) override;
    void woken(wake_source source) override;

    // What /metrics, /healthz and /readyz answer (also for tests).
    [[nodiscard]] http::admin_response answer(std::string_view path);
    // Empty when ready, else why not (one line).
    [[nodiscard]] std::string not_ready_reason() const;

    // How many events and how many deliveries relay_stats counts at most.
    static constexpr std::int64_t backlog_cap = 100'000;
    static constexpr std::chrono::seconds stats_interval{5};

private:
    void refresh_stats(std::function<void()> then);
    void arm_stats();
    void arm_summary();
    void summarise();
    void sample_engine();

    boost::asio::io_context& ioc_;
    const std::unique_ptr<const config>& config_;
    [[nodiscard]] const config& cfg() const { return *config_; }
    const std::unique_ptr<relay_engine>& engine_ptr_;
    [[nodiscard]] const relay_engine& engine() const { return *engine_ptr_; }
    store_worker& stats_worker_;
    std::string dsn_;
    int needed_schema_;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // for what the stats thread posts back

    metrics::registry registry_;
    metrics::family<metrics::counter>& deliveries_;
    metrics::family<metrics::histogram>& latency_;
    metrics::family<metrics::histogram>& attempts_;
    // A destination's series, looked up once: delivery() runs per event.
    struct destination_series {
        std::array<metrics::counter*, 4> by_result{};  // indexed by delivery_result
        metrics::histogram* latency = nullptr;
        metrics::histogram* attempts = nullptr;
    };
    std::map<std::string, destination_series, std::less<>> series_;
    destination_series& series(std::string_view destination);
    metrics::gauge& in_flight_;
    metrics::gauge& claimed_ahead_;
    metrics::counter& claims_;
    metrics::counter& claim_failures_;
    metrics::histogram& claim_size_;
    metrics::family<metrics::counter>& wakes_;
    std::array<metrics::counter*, 4> wake_counters_{};  // by wake_source, looked up once
    metrics::counter& sweeps_;
    metrics::counter& reconnects_;
    metrics::family<metrics::gauge>& circuit_;
    metrics::counter& takeovers_;
    metrics::counter& leases_taken_over_;
    metrics::gauge& backlog_;
    metrics::gauge& oldest_pending_;
    metrics::gauge& ready_;

    std::unique_ptr<http::admin_server> admin_;
    boost::asio::steady_timer stats_timer_;
    boost::asio::steady_timer summary_timer_;
    bool stats_running_ = false;
    std::vector<std::function<void()>> after_stats_;
    bool stopped_ = false;

    // readiness
    bool listening_ = true;
    std::string listen_error_;
    std::optional<std::string> claim_error_;
    std::optional<int> schema_version_;  // from the last stats answer
    std::optional<std::string> stats_error_;
    bool stopping_ = false;

    // the summary: totals at the previous line
    struct totals {
        double delivered = 0, failed = 0, dead = 0, handed_back = 0;
    };
    totals totals_;
    totals last_summary_;
    std::chrono::steady_clock::time_point last_summary_at_;
};

}  // namespace outboxd::app
