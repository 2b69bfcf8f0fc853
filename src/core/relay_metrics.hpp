#pragma once
// What the relay engine reports as it goes, for metrics (src/app/relay_telemetry
// turns it into the families of /metrics). Optional: an engine without an
// observer reports nothing. Called on the engine's thread, synchronously;
// an implementation must not call back into the engine.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace outboxd {

enum class delivery_result {
    delivered,
    retry,        // failed, another attempt is scheduled
    dead,         // failed for good: a dead letter
    handed_back,  // not sent (circuit open, no free connection, waited too long, shutdown): due again, no attempt counted
};

enum class wake_source { notify, sweep, timer, reconnect };

class relay_metrics {
public:
    virtual ~relay_metrics() = default;
    // One destination's result for one event. destination: its name, or ""
    // for the event as a whole (no route matches it, it cannot be sent, or
    // it was handed back before any destination was chosen). attempt: the
    // attempt this was (0 for handed_back). since_commit: from the event's
    // created_at to now, for delivered results when the claim returned it.
    virtual void delivery(std::string_view destination, delivery_result result, std::int32_t attempt,
                          std::optional<std::chrono::microseconds> since_commit) = 0;
    // A claim came back with `events` (events and deliveries together).
    virtual void claimed(std::size_t events) = 0;
    virtual void claim_failed(std::string_view why) = 0;
    // A reason to claim, from the engine's own timers (the shell reports
    // notify and reconnect).
    virtual void woken(wake_source source) = 0;
};

}  // namespace outboxd
