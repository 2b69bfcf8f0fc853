#include "core/duration.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

using namespace std::chrono_literals;
using outboxd::format_duration;
using outboxd::parse_duration;

namespace {

// The message of the std::invalid_argument thrown for `text` ("" if none).
std::string error_of(std::string_view text) {
    try {
        (void)parse_duration(text);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return {};
}

}  // namespace

TEST_CASE("duration: every unit") {
    CHECK(parse_duration("250ms") == 250ms);
    CHECK(parse_duration("30s") == 30'000ms);
    CHECK(parse_duration("5m") == 300'000ms);
    CHECK(parse_duration("1h") == 3'600'000ms);
    CHECK(parse_duration("0ms") == 0ms);
    CHECK(parse_duration("0s") == 0ms);
    CHECK(parse_duration("0h") == 0ms);
    CHECK(parse_duration("1500ms") == 1'500ms);
    CHECK(parse_duration("48h") == 172'800'000ms);
    // leading zeros are just digits
    CHECK(parse_duration("007s") == 7'000ms);
}

TEST_CASE("duration: a bare number is refused, the message names the form") {
    const std::string message = error_of("30");
    CHECK_FALSE(message.empty());
    CHECK(message.find("'30'") != std::string::npos);
    CHECK(message.find("unit") != std::string::npos);
    CHECK_THROWS_AS((void)parse_duration("0"), std::invalid_argument);
}

TEST_CASE("duration: negatives and signs are refused") {
    CHECK_THROWS_AS((void)parse_duration("-5s"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_duration("-1ms"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_duration("-9223372036854775808ms"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_duration("+5s"), std::invalid_argument);
}

TEST_CASE("duration: unknown, misspelt or wrongly cased units are refused") {
    for (const std::string_view text : {"5d", "5sec", "5 s", "5S", "5MS", "5H", "5us", "5ns", "5mss", "5s ",
                                        " 5s", "5s5", "5.5s", "1e3ms", "5m30s"}) {
        CAPTURE(text);
        CHECK_THROWS_AS((void)parse_duration(text), std::invalid_argument);
    }
}

TEST_CASE("duration: garbage is refused") {
    for (const std::string_view text : {"", "s", "ms", "abc", "five seconds", "0x10s", "\xff" "s"}) {
        CAPTURE(text);
        CHECK_THROWS_AS((void)parse_duration(text), std::invalid_argument);
    }
    // an embedded NUL does not end the text early
    CHECK_THROWS_AS((void)parse_duration(std::string_view("5s\0x", 4)), std::invalid_argument);
}

TEST_CASE("duration: overflow is refused, the largest exact values are not") {
    constexpr auto max = std::numeric_limits<std::int64_t>::max();  // 9223372036854775807
    CHECK(parse_duration("9223372036854775807ms").count() == max);
    CHECK_THROWS_AS((void)parse_duration("9223372036854775808ms"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_duration("99999999999999999999999s"), std::invalid_argument);

    CHECK(parse_duration(std::to_string(max / 1'000) + "s").count() == (max / 1'000) * 1'000);
    CHECK_THROWS_AS((void)parse_duration(std::to_string(max / 1'000 + 1) + "s"), std::invalid_argument);

    CHECK(parse_duration(std::to_string(max / 60'000) + "m").count() == (max / 60'000) * 60'000);
    CHECK_THROWS_AS((void)parse_duration(std::to_string(max / 60'000 + 1) + "m"), std::invalid_argument);

    CHECK(parse_duration(std::to_string(max / 3'600'000) + "h").count() == (max / 3'600'000) * 3'600'000);
    CHECK_THROWS_AS((void)parse_duration(std::to_string(max / 3'600'000 + 1) + "h"), std::invalid_argument);
}

TEST_CASE("duration: format picks the shortest exact unit") {
    CHECK(format_duration(0ms) == "0ms");
    CHECK(format_duration(1ms) == "1ms");
    CHECK(format_duration(250ms) == "250ms");
    CHECK(format_duration(1'500ms) == "1500ms");
    CHECK(format_duration(1'000ms) == "1s");
    CHECK(format_duration(30'000ms) == "30s");
    CHECK(format_duration(90'000ms) == "90s");
    CHECK(format_duration(60'000ms) == "1m");
    CHECK(format_duration(300'000ms) == "5m");
    CHECK(format_duration(5'400'000ms) == "90m");
    CHECK(format_duration(3'600'000ms) == "1h");
    CHECK(format_duration(86'400'000ms) == "24h");
    CHECK(format_duration(3'600'001ms) == "3600001ms");
}

TEST_CASE("duration: format of a negative duration keeps the sign") {
    CHECK(format_duration(-250ms) == "-250ms");
    CHECK(format_duration(-1'000ms) == "-1s");
    CHECK(format_duration(-3'600'000ms) == "-1h");
}

TEST_CASE("duration: round trips") {
    for (const std::string_view text : {"0ms", "1ms", "999ms", "1001ms", "1s", "59s", "61s", "1m", "59m",
                                        "61m", "1h", "25h", "9223372036854775807ms"}) {
        CAPTURE(text);
        CHECK(format_duration(parse_duration(text)) == text);
    }
    for (const auto d : {0ms, 1ms, 999ms, 1'000ms, 45'000ms, 60'000ms, 3'600'000ms, 3'601'000ms,
                         std::chrono::milliseconds(std::numeric_limits<std::int64_t>::max())}) {
        CAPTURE(d.count());
        CHECK(parse_duration(format_duration(d)) == d);
    }
    // parsing normalises: different spellings of one duration format the same way
    CHECK(format_duration(parse_duration("60s")) == "1m");
    CHECK(format_duration(parse_duration("60m")) == "1h");
    CHECK(format_duration(parse_duration("3000ms")) == "3s");
}
