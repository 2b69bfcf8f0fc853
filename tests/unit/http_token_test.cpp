#include "core/http_token.hpp"

#include <doctest/doctest.h>

#include <string>

using outboxd::is_http_token;

TEST_CASE("http_token: RFC 9110 token characters and nothing else") {
    CHECK(is_http_token("X-Env"));
    CHECK(is_http_token("Authorization"));
    CHECK(is_http_token("a1!#$%&'*+-.^_`|~"));
    CHECK(is_http_token("0"));

    CHECK_FALSE(is_http_token(""));
    CHECK_FALSE(is_http_token("Bad Name"));         // space
    CHECK_FALSE(is_http_token("X-Token: value"));   // a whole header line
    CHECK_FALSE(is_http_token("X\tY"));
    CHECK_FALSE(is_http_token("X\r\nY"));
    CHECK_FALSE(is_http_token(std::string("X\0Y", 3)));
    CHECK_FALSE(is_http_token("\x7f"));
    for (const char c : std::string("\"(),/:;<=>?@[\\]{}")) {
        CAPTURE(c);
        CHECK_FALSE(is_http_token(std::string("X") + c));
    }
    CHECK_FALSE(is_http_token("caf\xc3\xa9"));  // UTF-8 is not a token character
}
