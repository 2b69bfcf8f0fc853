#include "core/redact.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/url.hpp"

using outboxd::destination_config;
using outboxd::quotable_secrets;
using outboxd::redact;

namespace {

destination_config destination(const char* url, outboxd::header_list headers) {
    destination_config d;
    d.url = outboxd::parse_endpoint_url(url);
    d.headers = std::move(headers);
    return d;
}

}  // namespace

TEST_CASE("redact: header values, their long words, the query and its values; longest first") {
    const auto d = destination("https://h.example/hook?token=qry1234567&v=2",
                               {{"Authorization", "Bearer tok-abcdefgh"}, {"X-Env", "prod"}, {"X-Id", "ab"}});
    CHECK(quotable_secrets(d) == std::vector<std::string>{"token=qry1234567&v=2", "Bearer tok-abcdefgh",
                                                          "tok-abcdefgh", "qry1234567", "prod"});
    CHECK(quotable_secrets(destination("http://h/hook", {})).empty());
}

TEST_CASE("redact: a receiver quoting the credentials it refused") {
    const auto d = destination("https://h.example/hook?token=qry1234567",
                               {{"Authorization", "Bearer tok-abcdefgh"}, {"X-Api-Key", "key-0123456789"}});
    const auto secrets = quotable_secrets(d);
    CHECK(redact("invalid credentials: Bearer tok-abcdefgh key-0123456789 for /hook?token=qry1234567", secrets) ==
          "invalid credentials: <redacted> <redacted> for /hook?<redacted>");
    CHECK(redact("token tok-abcdefgh unknown; tok-abcdefgh again", secrets) ==
          "token <redacted> unknown; <redacted> again");
    CHECK(redact("nothing to hide", secrets) == "nothing to hide");
    CHECK(redact("", secrets).empty());
}

TEST_CASE("redact: short secrets are left alone, and a replacement is never searched again") {
    CHECK(redact("a b abc", {"a", "ab", "abc"}) == "a b abc");
    CHECK(redact("redacted redacted", {"redacted"}) == "<redacted> <redacted>");
}
