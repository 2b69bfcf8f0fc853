#include "core/integer.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

using outboxd::parse_integer;

namespace {

std::string error_of(std::string_view text, std::int64_t lo, std::int64_t hi) {
    try {
        (void)parse_integer(text, lo, hi);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("integer: whole numbers within the bounds") {
    CHECK(parse_integer("1", 1, 1024) == 1);
    CHECK(parse_integer("1024", 1, 1024) == 1024);
    CHECK(parse_integer("-5", -10, 10) == -5);
    constexpr auto max = std::numeric_limits<std::int64_t>::max();
    CHECK(parse_integer("9223372036854775807", 1, max) == max);
}

TEST_CASE("integer: one message for everything else, the text quoted safely") {
    CHECK(error_of("0", 1, 1024) == "expected an integer from 1 to 1024, got \"0\"");
    CHECK(error_of("1025", 1, 1024) == "expected an integer from 1 to 1024, got \"1025\"");
    CHECK(error_of("x", 1, 1024) == "expected an integer from 1 to 1024, got \"x\"");
    CHECK(error_of("12abc", 1, 1024) == "expected an integer from 1 to 1024, got \"12abc\"");
    CHECK(error_of("", 1, 1024) == "expected an integer from 1 to 1024, got \"\"");
    CHECK(error_of(" 1", 1, 1024) == "expected an integer from 1 to 1024, got \" 1\"");
    CHECK(error_of("+1", 1, 1024) == "expected an integer from 1 to 1024, got \"+1\"");
    CHECK(error_of("1.5", 1, 1024) == "expected an integer from 1 to 1024, got \"1.5\"");
    CHECK(error_of("99999999999999999999", 1, 1024) ==
          "expected an integer from 1 to 1024, got \"99999999999999999999\"");
    CHECK(error_of("bad\nline", 1, 1024) == "expected an integer from 1 to 1024, got \"bad\\nline\"");
}
