#pragma once
// A destination's health as this relay sees it (the circuit breaker). Pure:
// the relay engine reports each answer and asks before each request.
//
//   closed     requests flow. `failures_to_open` consecutive failures of the
//              destination itself (transport errors, timeouts, 408, 429,
//              5xx) open it; a per-event answer (2xx, other 4xx) resets the
//              count: the destination is up, the event is the problem.
//   open       no requests: its work waits, untouched, in the outbox (no
//              attempts burned, no CPU spent on doomed requests), until
//              the probe time.
//   probing    one request at a time, a real delivery. Success closes the
//              circuit (and the relay releases the destination's waiting
//              deliveries at once); failure opens it again with the probe
//              interval doubled, from `first_probe` up to `longest_probe`.

#include <chrono>
#include <cstddef>
#include <optional>

namespace outboxd {

struct circuit_settings {
    std::size_t failures_to_open = 5;  // 0: never opens
    std::chrono::milliseconds first_probe{500};
    std::chrono::milliseconds longest_probe{1'000};
};

enum class circuit_state { closed, open, probing };

// What an answer says of the destination: healthy when it answered about the
// event (2xx, or a 4xx other than 408/429); failing for transport errors,
// timeouts, 408, 429 and 5xx.
enum class answer_health { healthy, failing };
[[nodiscard]] answer_health health_of(bool transport_error, unsigned status) noexcept;

class circuit_breaker {
public:
    using time_point = std::chrono::steady_clock::time_point;

    explicit circuit_breaker(circuit_settings s = {}) noexcept : settings_(s) {}

    // May a request start now? In `probing`, only while none is out.
    [[nodiscard]] bool allows_request(time_point now) noexcept;
    // A request started (counted in probing: the one probe).
    void on_request() noexcept;
    // What came of a request. Returns true when this answer closed the circuit.
    bool on_answer(answer_health h, time_point now) noexcept;

    [[nodiscard]] circuit_state state(time_point now) const noexcept;
    // When an open circuit may probe (nullopt unless open).
    [[nodiscard]] std::optional<time_point> probe_at() const noexcept;
    [[nodiscard]] std::size_t consecutive_failures() const noexcept { return failures_; }

private:
    void open(time_point now) noexcept;

    circuit_settings settings_;
    bool open_ = false;  // open or probing, by the time
    time_point probe_at_{};
    std::chrono::milliseconds interval_{0};
    std::size_t failures_ = 0;
    std::size_t probes_out_ = 0;
};

}  // namespace outboxd
