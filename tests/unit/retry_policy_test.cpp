#include "core/retry_policy.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace std::chrono_literals;
using outboxd::parse_retry_after;
using outboxd::parse_status_list;
using outboxd::retry_policy;

// Readable failure messages: libstdc++ 12 has no operator<< for durations.
namespace doctest {
template <>
struct StringMaker<std::chrono::milliseconds> {
    static String convert(std::chrono::milliseconds d) { return (std::to_string(d.count()) + "ms").c_str(); }
};
template <>
struct StringMaker<std::optional<std::chrono::milliseconds>> {
    static String convert(const std::optional<std::chrono::milliseconds>& d) {
        return d ? StringMaker<std::chrono::milliseconds>::convert(*d) : String("nullopt");
    }
};
}  // namespace doctest

namespace {

// Sun, 06 Nov 1994 08:49:37 GMT: a fixed "now", never the real clock.
constexpr std::time_t fixed_time = 784'111'777;
const auto now = std::chrono::system_clock::from_time_t(fixed_time);

constexpr double almost_one = 0.9999999999999999;  // the largest unit_random can be

}  // namespace

// ---- backoff ----------------------------------------------------------------

TEST_CASE("retry_policy: the defaults are the documented ones") {
    const retry_policy p;
    CHECK(p.base == 5'000ms);
    CHECK(p.cap == 6h);
    CHECK(p.max_attempts == 20);
    CHECK(p.jitter == doctest::Approx(0.2));
}

TEST_CASE("retry_policy: backoff doubles from the base") {
    const retry_policy p;
    CHECK(p.backoff(1, 0.0) == 5'000ms);
    CHECK(p.backoff(2, 0.0) == 10'000ms);
    CHECK(p.backoff(3, 0.0) == 20'000ms);
    CHECK(p.backoff(4, 0.0) == 40'000ms);
    CHECK(p.backoff(10, 0.0) == 2'560'000ms);
    CHECK(p.backoff(13, 0.0) == 20'480'000ms);  // the last one under the cap
}

TEST_CASE("retry_policy: backoff is capped") {
    const retry_policy p;
    CHECK(p.backoff(14, 0.0) == 6h);
    CHECK(p.backoff(19, 0.0) == 6h);
    CHECK(p.backoff(20, 0.0) == 6h);
    CHECK(p.backoff(64, 0.0) == 6h);

    retry_policy small;
    small.base = 100ms;
    small.cap = 1'000ms;
    small.jitter = 0.0;
    CHECK(small.backoff(1, 0.5) == 100ms);
    CHECK(small.backoff(2, 0.5) == 200ms);
    CHECK(small.backoff(3, 0.5) == 400ms);
    CHECK(small.backoff(4, 0.5) == 800ms);
    CHECK(small.backoff(5, 0.5) == 1'000ms);
    CHECK(small.backoff(6, 0.5) == 1'000ms);
}

TEST_CASE("retry_policy: jitter takes at most 20% off, never adds") {
    const retry_policy p;
    CHECK(p.backoff(1, 0.0) == 5'000ms);
    CHECK(p.backoff(1, 0.5) == 4'500ms);
    CHECK(p.backoff(1, almost_one) == 4'000ms);
    CHECK(p.backoff(3, 0.25) == 19'000ms);
    CHECK(p.backoff(30, 0.0) == 21'600'000ms);
    CHECK(p.backoff(30, almost_one) == 17'280'000ms);

    for (int attempt = 1; attempt <= 25; ++attempt) {
        const auto full = p.backoff(attempt, 0.0);
        for (const double r : {0.0, 0.1, 0.37, 0.5, 0.9, almost_one}) {
            CAPTURE(attempt);
            CAPTURE(r);
            const auto d = p.backoff(attempt, r);
            CHECK(d <= full);
            CHECK(d.count() >= static_cast<long long>(std::floor(static_cast<double>(full.count()) * 0.8)));
        }
    }
}

TEST_CASE("retry_policy: unit_random outside [0, 1) is clamped") {
    const retry_policy p;
    CHECK(p.backoff(1, -1.0) == 5'000ms);
    CHECK(p.backoff(1, 7.0) == 4'000ms);
}

TEST_CASE("retry_policy: attempt <= 0 is treated as the first") {
    const retry_policy p;
    CHECK(p.backoff(0, 0.0) == 5'000ms);
    CHECK(p.backoff(-1, 0.0) == 5'000ms);
    CHECK(p.backoff(-1'000'000, 0.0) == 5'000ms);
}

TEST_CASE("retry_policy: attempt == INT_MIN is treated as the first") {
    const retry_policy p;
    CHECK(p.backoff(std::numeric_limits<int>::min(), 0.0) == 5'000ms);
}

TEST_CASE("retry_policy: huge attempts do not overflow") {
    const retry_policy p;
    CHECK(p.backoff(1'000, 0.0) == 6h);
    CHECK(p.backoff(std::numeric_limits<int>::max(), 0.0) == 6h);
    CHECK(p.backoff(std::numeric_limits<int>::max(), almost_one) == 17'280'000ms);

    // an enormous cap: the doubling itself must stay finite and positive
    retry_policy uncapped;
    uncapped.cap = std::chrono::milliseconds(std::numeric_limits<std::int64_t>::max() / 2);
    uncapped.jitter = 0.0;
    const auto d = uncapped.backoff(std::numeric_limits<int>::max(), 0.0);
    CHECK(d > 0ms);
    CHECK(d <= uncapped.cap);
    CHECK(uncapped.backoff(2, 0.0) == 10'000ms);
}

TEST_CASE("retry_policy: exhausted once attempt reaches max_attempts") {
    const retry_policy p;
    CHECK_FALSE(p.exhausted(0));
    CHECK_FALSE(p.exhausted(1));
    CHECK_FALSE(p.exhausted(19));
    CHECK(p.exhausted(20));
    CHECK(p.exhausted(21));

    retry_policy once;
    once.max_attempts = 1;
    CHECK(once.exhausted(1));
    CHECK_FALSE(once.exhausted(0));
}

TEST_CASE("retry_policy: the default schedule spans about two days") {
    const retry_policy p;
    std::chrono::milliseconds longest{0};
    std::chrono::milliseconds shortest{0};
    // 19 waits between 20 attempts: after attempts 1..19
    for (int attempt = 1; attempt < p.max_attempts; ++attempt) {
        longest += p.backoff(attempt, 0.0);
        shortest += p.backoff(attempt, almost_one);
    }
    CHECK(longest >= 40h);
    CHECK(longest <= 56h);
    // 5 s * (2^13 - 1) uncapped + 6 waits of 6 h
    CHECK(longest == 170'555'000ms);
    // jitter takes off at most 20 %
    CHECK(shortest.count() == doctest::Approx(static_cast<double>(longest.count()) * 0.8).epsilon(1e-6));
}

// ---- status sets ------------------------------------------------------------

TEST_CASE("retry_policy: default status sets") {
    const retry_policy p;
    CHECK(p.permanent_statuses == std::vector<unsigned>{410});
    CHECK(p.throttle_statuses == std::vector<unsigned>{429, 502, 503, 504});
    CHECK(p.is_permanent(410));
    for (const unsigned status : {400U, 404U, 409U, 429U, 500U, 503U, 200U}) {
        CAPTURE(status);
        CHECK_FALSE(p.is_permanent(status));
    }
    for (const unsigned status : {429U, 502U, 503U, 504U}) {
        CAPTURE(status);
        CHECK(p.is_throttle(status));
    }
    for (const unsigned status : {410U, 500U, 501U, 505U, 408U, 200U}) {
        CAPTURE(status);
        CHECK_FALSE(p.is_throttle(status));
    }
}

TEST_CASE("retry_policy: custom and empty status sets") {
    retry_policy p;
    p.permanent_statuses = {404, 422};
    p.throttle_statuses = {};
    CHECK(p.is_permanent(404));
    CHECK(p.is_permanent(422));
    CHECK_FALSE(p.is_permanent(410));
    CHECK_FALSE(p.is_throttle(429));
}

TEST_CASE("parse_status_list: lists of statuses") {
    CHECK(parse_status_list("").empty());
    CHECK(parse_status_list("410") == std::vector<unsigned>{410});
    CHECK(parse_status_list("410,422") == std::vector<unsigned>{410, 422});
    CHECK(parse_status_list(" 410 , 422 ,  404") == std::vector<unsigned>{410, 422, 404});
    CHECK(parse_status_list("429,502,503,504") == std::vector<unsigned>{429, 502, 503, 504});
    // the whole range outside 2xx
    CHECK(parse_status_list("100,199,300,599") == std::vector<unsigned>{100, 199, 300, 599});
}

TEST_CASE("parse_status_list: bad items are refused and named") {
    auto error_of = [](std::string_view text) -> std::string {
        try {
            (void)parse_status_list(text);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return {};
    };
    CHECK(error_of("410,abc").find("'abc'") != std::string::npos);
    CHECK(error_of("99").find("'99'") != std::string::npos);
    CHECK(error_of("600").find("'600'") != std::string::npos);
    for (const std::string_view text : {"0", "1000", "-1", "+410", "41O", "410;422", "410 422", "4.1",
                                        "4294967706", "410,,422", ",410", " ", ","}) {
        CAPTURE(text);
        CHECK_THROWS_AS((void)parse_status_list(text), std::invalid_argument);
    }
}

TEST_CASE("parse_status_list: 2xx cannot be listed") {
    for (const std::string_view text : {"200", "204", "299", "410,200"}) {
        CAPTURE(text);
        std::string message;
        try {
            (void)parse_status_list(text);
        } catch (const std::invalid_argument& e) {
            message = e.what();
        }
        CHECK(message.find("2xx") != std::string::npos);
    }
}

TEST_CASE("parse_status_list: a trailing empty item is refused like the others") {
    // ",410" and "410,,422" are refused; "410," has the same empty item.
    CHECK_THROWS_AS((void)parse_status_list("410,"), std::invalid_argument);
}

// ---- parse_retry_after ------------------------------------------------------

TEST_CASE("retry_after: delay-seconds") {
    CHECK(parse_retry_after("2", now) == std::optional(2'000ms));
    CHECK(parse_retry_after("0", now) == std::optional(0ms));
    CHECK(parse_retry_after("120", now) == std::optional(120'000ms));
    CHECK(parse_retry_after("007", now) == std::optional(7'000ms));
    CHECK(parse_retry_after("86400", now) == std::optional(86'400'000ms));
}

TEST_CASE("retry_after: surrounding spaces are ignored") {
    CHECK(parse_retry_after(" 5", now) == std::optional(5'000ms));
    CHECK(parse_retry_after("5  ", now) == std::optional(5'000ms));
    CHECK(parse_retry_after("   30   ", now) == std::optional(30'000ms));
    CHECK(parse_retry_after("  Sun, 06 Nov 1994 08:49:47 GMT ", now) == std::optional(10'000ms));
}

TEST_CASE("retry_after: large delays are clamped to a day") {
    CHECK(parse_retry_after("86401", now) == std::optional(86'400'000ms));
    CHECK(parse_retry_after("31536000", now) == std::optional(86'400'000ms));
    CHECK(parse_retry_after("9223372036854775807", now) == std::optional(86'400'000ms));
}

TEST_CASE("retry_after: delays too large for 64 bits are clamped to a day too") {
    // still 1*DIGIT, so a valid delay-seconds: "larger values are clamped"
    CHECK(parse_retry_after("9223372036854775808", now) == std::optional(86'400'000ms));
    CHECK(parse_retry_after("99999999999999999999999999", now) == std::optional(86'400'000ms));
}

TEST_CASE("retry_after: IMF-fixdate in the future") {
    CHECK(parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now) == std::optional(60'000ms));
    CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:38 GMT", now) == std::optional(1'000ms));
    CHECK(parse_retry_after("Sun, 06 Nov 1994 09:49:37 GMT", now) == std::optional(3'600'000ms));
    CHECK(parse_retry_after("Mon, 07 Nov 1994 08:49:37 GMT", now) == std::optional(86'400'000ms));
    // more than a day ahead is clamped like delay-seconds
    CHECK(parse_retry_after("Tue, 08 Nov 1994 08:49:37 GMT", now) == std::optional(86'400'000ms));
    CHECK(parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", now) == std::optional(86'400'000ms));
    // `now` is kept to the millisecond
    CHECK(parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now + 250ms) == std::optional(59'750ms));
}

TEST_CASE("retry_after: IMF-fixdate now or in the past gives 0") {
    CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now) == std::optional(0ms));
    CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:36 GMT", now) == std::optional(0ms));
    CHECK(parse_retry_after("Sat, 05 Nov 1994 08:49:37 GMT", now) == std::optional(0ms));
    CHECK(parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now) == std::optional(0ms));
}

TEST_CASE("retry_after: garbage and the obsolete date forms give nullopt") {
    for (const std::string_view value :
         {"abc", "5s", "1.5", "-5", "+5", "5 5", "0x10", "1e3", "Sunday, 06-Nov-94 08:49:37 GMT",
          "Sun Nov  6 08:49:37 1994", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 06 Nov 1994 08:49:37",
          "Sun, 06 Nov 1994 08:49:37 GMT trailing", "Sun, 06 Nov 1994", "Sun, 32 Nov 1994 08:49:37 GMT",
          "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:49:37 GMT"}) {
        CAPTURE(value);
        CHECK_FALSE(parse_retry_after(value, now).has_value());
    }
}

TEST_CASE("retry_after: empty gives nullopt") {
    CHECK_FALSE(parse_retry_after("", now).has_value());
    CHECK_FALSE(parse_retry_after(" ", now).has_value());
    CHECK_FALSE(parse_retry_after("     ", now).has_value());
}
