#include "core/delivery_outcome.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <ctime>
#include <string>
#include <string_view>

using namespace std::chrono_literals;
using outboxd::attempt_report;
using outboxd::classify_attempt;
using outboxd::delivery_outcome;
using outboxd::retry_policy;
using kind = outboxd::delivery_outcome::kind;

namespace doctest {
template <>
struct StringMaker<kind> {
    static String convert(kind k) {
        switch (k) {
            case kind::delivered: return "delivered";
            case kind::retry: return "retry";
            case kind::dead: return "dead";
        }
        return "?";
    }
};
}  // namespace doctest

namespace {

// Sun, 06 Nov 1994 08:49:37 GMT: a fixed "now", never the real clock.
const auto now = std::chrono::system_clock::from_time_t(std::time_t{784'111'777});

const retry_policy policy;  // defaults: 5 s doubling, 20 attempts

attempt_report http(unsigned status, std::string_view retry_after = {}, std::string_view body = {}) {
    attempt_report r;
    r.status = status;
    r.retry_after = retry_after;
    r.body_excerpt = body;
    return r;
}

attempt_report transport(std::string_view error) {
    attempt_report r;
    r.transport_error = true;
    r.error = error;
    return r;
}

delivery_outcome classify(const attempt_report& r, int attempt = 1) {
    return classify_attempt(r, attempt, policy, 0.0, now);
}

}  // namespace

TEST_CASE("delivery_outcome: 2xx is delivered") {
    for (const unsigned status : {200U, 201U, 202U, 204U, 299U}) {
        CAPTURE(status);
        const auto o = classify(http(status, "", "ignored"));
        CHECK(o.what == kind::delivered);
        CHECK(o.error.empty());
        CHECK(o.retry_in.count() == 0);
    }
}

TEST_CASE("delivery_outcome: 2xx on the last allowed attempt is still delivered") {
    CHECK(classify(http(200), policy.max_attempts).what == kind::delivered);
    CHECK(classify(http(204), policy.max_attempts + 5).what == kind::delivered);
}

TEST_CASE("delivery_outcome: 3xx retries (redirects are not followed)") {
    for (const unsigned status : {300U, 301U, 302U, 307U, 308U}) {
        CAPTURE(status);
        const auto o = classify(http(status));
        CHECK(o.what == kind::retry);
        CHECK(o.retry_in.count() == 5'000);
        CHECK(o.error == "HTTP " + std::to_string(status));
    }
}

TEST_CASE("delivery_outcome: other 4xx and 5xx retry with backoff") {
    for (const unsigned status : {400U, 401U, 403U, 404U, 409U, 422U, 500U, 501U}) {
        CAPTURE(status);
        const auto o = classify(http(status));
        CHECK(o.what == kind::retry);
        CHECK(o.retry_in.count() == 5'000);
    }
    // the backoff grows with the attempt
    CHECK(classify(http(500), 2).retry_in.count() == 10'000);
    CHECK(classify(http(500), 3).retry_in.count() == 20'000);
    // and takes the jitter
    CHECK(classify_attempt(http(500), 1, policy, 0.5, now).retry_in.count() == 4'500);
}

TEST_CASE("delivery_outcome: statuses outside 2xx that are not errors still retry") {
    CHECK(classify(http(100)).what == kind::retry);
    CHECK(classify(http(199)).what == kind::retry);
    CHECK(classify(http(300)).what == kind::retry);
}

TEST_CASE("delivery_outcome: 410 Gone is dead at once") {
    const auto o = classify(http(410, "", "endpoint removed"));
    CHECK(o.what == kind::dead);
    CHECK(o.retry_in.count() == 0);
    CHECK(o.error == "permanent failure: HTTP 410: endpoint removed");

    CHECK(classify(http(410)).error == "permanent failure: HTTP 410");
    // 410 even with a Retry-After, and on the last attempt
    CHECK(classify(http(410, "2")).what == kind::dead);
    CHECK(classify(http(410), policy.max_attempts).error == "permanent failure: HTTP 410");
}

TEST_CASE("delivery_outcome: throttling statuses take their Retry-After") {
    for (const unsigned status : {429U, 502U, 503U, 504U}) {
        CAPTURE(status);
        const auto o = classify(http(status, "2"), 5);  // backoff would be 80 s
        CHECK(o.what == kind::retry);
        CHECK(o.retry_in.count() == 2'000);
    }
    // also as an HTTP-date, and "0" means now
    CHECK(classify(http(503, "Sun, 06 Nov 1994 08:50:37 GMT")).retry_in.count() == 60'000);
    CHECK(classify(http(429, "0"), 4).retry_in.count() == 0);
    // capped at a day
    CHECK(classify(http(429, "1000000")).retry_in.count() == 86'400'000);
}

TEST_CASE("delivery_outcome: throttling without a usable Retry-After backs off") {
    CHECK(classify(http(429)).retry_in.count() == 5'000);
    CHECK(classify(http(429), 3).retry_in.count() == 20'000);
    CHECK(classify(http(503, "soon")).retry_in.count() == 5'000);
    CHECK(classify(http(503, "")).what == kind::retry);
}

TEST_CASE("delivery_outcome: other statuses ignore Retry-After") {
    for (const unsigned status : {500U, 400U, 404U, 301U}) {
        CAPTURE(status);
        const auto o = classify(http(status, "2"), 3);
        CHECK(o.what == kind::retry);
        CHECK(o.retry_in.count() == 20'000);
    }
}

TEST_CASE("delivery_outcome: a transport error retries with its error text") {
    const auto o = classify(transport("connect: Connection refused"));
    CHECK(o.what == kind::retry);
    CHECK(o.retry_in.count() == 5'000);
    CHECK(o.error == "connect: Connection refused");

    // a status or Retry-After left in the report does not count without a response
    attempt_report r = transport("read: timed out");
    r.status = 503;
    r.retry_after = "2";
    const auto t = classify(r, 2);
    CHECK(t.what == kind::retry);
    CHECK(t.retry_in.count() == 10'000);
    CHECK(t.error == "read: timed out");

    r.status = 200;  // nor does a stale 2xx
    CHECK(classify(r).what == kind::retry);
}

TEST_CASE("delivery_outcome: the last allowed attempt that fails goes to dead letters") {
    const auto o = classify(http(500, "", "boom"), policy.max_attempts);
    CHECK(o.what == kind::dead);
    CHECK(o.retry_in.count() == 0);
    CHECK(o.error == "gave up after 20 attempts: HTTP 500: boom");

    const auto t = classify(transport("connection reset"), policy.max_attempts);
    CHECK(t.what == kind::dead);
    CHECK(t.error == "gave up after 20 attempts: connection reset");

    // throttled on the last attempt: no Retry-After extends it
    CHECK(classify(http(429, "2"), policy.max_attempts).what == kind::dead);
    // past the last one too
    CHECK(classify(http(500), policy.max_attempts + 1).what == kind::dead);
    // the one before still retries
    const auto before = classify(http(500), policy.max_attempts - 1);
    CHECK(before.what == kind::retry);
    CHECK(before.retry_in.count() == 21'600'000);

    retry_policy once;
    once.max_attempts = 1;
    const auto single = classify_attempt(http(503, "2"), 1, once, 0.0, now);
    CHECK(single.what == kind::dead);
    CHECK(single.error.starts_with("gave up after 1 attempt"));
    CHECK(single.error.ends_with(": HTTP 503"));
}

TEST_CASE("delivery_outcome: error text names the status and the body excerpt") {
    const auto o = classify(http(500, "", "{\"error\":\"database is down\"}"));
    CHECK(o.error == "HTTP 500: {\"error\":\"database is down\"}");
    CHECK(o.error.find("500") != std::string::npos);
    CHECK(o.error.find("database is down") != std::string::npos);

    CHECK(classify(http(404)).error == "HTTP 404");
    CHECK(classify(http(429, "2", "slow down")).error == "HTTP 429: slow down");
}

TEST_CASE("delivery_outcome: the permanent set comes from the policy") {
    retry_policy p;
    p.permanent_statuses = {404, 422};
    const auto gone = classify_attempt(http(404, "", "no such hook"), 1, p, 0.0, now);
    CHECK(gone.what == kind::dead);
    CHECK(gone.error == "permanent failure: HTTP 404: no such hook");
    CHECK(classify_attempt(http(422), 1, p, 0.0, now).what == kind::dead);
    // 410 is no longer permanent: an ordinary retry
    const auto g410 = classify_attempt(http(410), 1, p, 0.0, now);
    CHECK(g410.what == kind::retry);
    CHECK(g410.retry_in.count() == 5'000);

    p.permanent_statuses.clear();
    CHECK(classify_attempt(http(410), 1, p, 0.0, now).what == kind::retry);
}

TEST_CASE("delivery_outcome: the throttle set comes from the policy") {
    retry_policy p;
    p.throttle_statuses = {500};
    CHECK(classify_attempt(http(500, "2"), 3, p, 0.0, now).retry_in.count() == 2'000);
    CHECK(classify_attempt(http(429, "2"), 3, p, 0.0, now).retry_in.count() == 20'000);

    p.throttle_statuses.clear();
    CHECK(classify_attempt(http(503, "2"), 3, p, 0.0, now).retry_in.count() == 20'000);
}

TEST_CASE("delivery_outcome: 2xx is delivered whatever the sets say; permanent beats throttle") {
    retry_policy p;
    p.permanent_statuses = {200, 429};  // only possible by hand: parse_status_list refuses 2xx
    p.throttle_statuses = {204, 429};
    CHECK(classify_attempt(http(200), 1, p, 0.0, now).what == kind::delivered);
    CHECK(classify_attempt(http(204, "2"), 1, p, 0.0, now).what == kind::delivered);
    const auto both = classify_attempt(http(429, "2"), 1, p, 0.0, now);
    CHECK(both.what == kind::dead);
    CHECK(both.error == "permanent failure: HTTP 429");
}

TEST_CASE("delivery_outcome: a transport error is never permanent") {
    retry_policy p;
    p.permanent_statuses = {410};
    attempt_report r = transport("connection reset");
    r.status = 410;  // left over, no response was read
    const auto o = classify_attempt(r, 1, p, 0.0, now);
    CHECK(o.what == kind::retry);
    CHECK(o.error == "connection reset");
}
