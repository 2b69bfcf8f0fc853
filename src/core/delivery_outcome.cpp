#include "core/delivery_outcome.hpp"

#include <fmt/format.h>

namespace outboxd {
namespace {

std::string describe(const attempt_report& report) {
    if (report.transport_error) return std::string(report.error);
    if (report.body_excerpt.empty()) return fmt::format("HTTP {}", report.status);
    return fmt::format("HTTP {}: {}", report.status, report.body_excerpt);
}

}  // namespace

delivery_outcome classify_attempt(const attempt_report& report, int attempt, const retry_policy& policy,
                                  double unit_random, std::chrono::system_clock::time_point now) {
    delivery_outcome out;
    if (!report.transport_error && report.status >= 200 && report.status < 300) {
        out.what = delivery_outcome::kind::delivered;
        return out;
    }
    out.error = describe(report);
    if (!report.transport_error && policy.is_permanent(report.status)) {
        out.what = delivery_outcome::kind::dead;
        out.error = fmt::format("permanent failure: {}", out.error);
        return out;
    }
    if (policy.exhausted(attempt)) {
        out.what = delivery_outcome::kind::dead;
        out.error = fmt::format("gave up after {} attempts: {}", attempt, out.error);
        return out;
    }
    out.what = delivery_outcome::kind::retry;
    out.retry_in = policy.backoff(attempt, unit_random);
    if (!report.transport_error && policy.is_throttle(report.status)) {
        if (auto wait = parse_retry_after(report.retry_after, now)) out.retry_in = *wait;
    }
    return out;
}

}  // namespace outboxd
