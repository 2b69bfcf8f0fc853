#pragma once
// What one delivery attempt means for the event: done, try again later, or
// give up. Pure: the transport reports what happened, this decides.

#include <chrono>
#include <string>
#include <string_view>

#include "core/retry_policy.hpp"

namespace outboxd {

struct attempt_report {
    bool transport_error = false;  // no HTTP status (connect, reset, timeout)
    unsigned status = 0;
    std::string_view error;        // transport error text
    std::string_view retry_after;  // raw header value
    std::string_view body_excerpt;
};

struct delivery_outcome {
    enum class kind { delivered, retry, dead };
    kind what = kind::delivered;
    std::chrono::milliseconds retry_in{0};  // for retry
    std::string error;                      // for retry and dead: why
};

// Status semantics (sets configurable in retry_policy): 2xx delivered.
// 410 Gone is permanent. 429/502/503/504 throttle: their Retry-After, when given, replaces the backoff (the peer
// knows its own load best; parse_retry_after caps it at a day). Everything
// else — other statuses, 3xx (redirects are not followed), transport errors —
// retries with exponential backoff. The last allowed attempt that fails goes
// to dead letters.
[[nodiscard]] delivery_outcome classify_attempt(const attempt_report& report, int attempt,
                                                const retry_policy& policy, double unit_random,
                                                std::chrono::system_clock::time_point now);

}  // namespace outboxd
