#include "core/webhook_request.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "core/event.hpp"

using outboxd::add_destination_headers;
using outboxd::build_request_headers;
using outboxd::event;
using outboxd::header_list;

namespace {

constexpr std::int64_t sent_at = 1'700'000'000;

event make_event(header_list headers = {}) {
    event e;
    e.id = 42;
    e.topic = "orders.created";
    e.payload = R"({"order":7})";
    e.headers = std::move(headers);
    e.attempt = 3;
    return e;
}

const header_list mandatory{
    {"webhook-id", "42"},
    {"webhook-timestamp", "1700000000"},
    {"outbox-topic", "orders.created"},
    {"outbox-attempt", "3"},
};

bool contains(std::string_view haystack, std::string_view needle) {
    return haystack.find(needle) != std::string_view::npos;
}

}  // namespace

TEST_CASE("webhook_request: the mandatory headers, in order, with their values") {
    const auto r = build_request_headers(make_event(), sent_at);
    CHECK_FALSE(r.error.has_value());
    CHECK(r.headers == mandatory);
}

TEST_CASE("webhook_request: values are formatted exactly") {
    event e = make_event();
    e.id = std::numeric_limits<std::int64_t>::max();
    e.attempt = 0;
    const auto r = build_request_headers(e, 0);
    REQUIRE(r.headers.size() == 4);
    CHECK(r.headers[0] == std::pair<std::string, std::string>{"webhook-id", "9223372036854775807"});
    CHECK(r.headers[1] == std::pair<std::string, std::string>{"webhook-timestamp", "0"});
    CHECK(r.headers[3] == std::pair<std::string, std::string>{"outbox-attempt", "0"});
}

TEST_CASE("webhook_request: the ordering key header only when the event has one") {
    event e = make_event();
    e.ordering_key = "customer-7";
    const auto with = build_request_headers(e, sent_at);
    CHECK_FALSE(with.error.has_value());
    header_list expected = mandatory;
    expected.emplace_back("outbox-ordering-key", "customer-7");
    CHECK(with.headers == expected);

    const auto without = build_request_headers(make_event(), sent_at);
    for (const auto& [name, value] : without.headers) CHECK(name != "outbox-ordering-key");

    // an empty key is still a key
    e.ordering_key = "";
    const auto empty = build_request_headers(e, sent_at);
    REQUIRE(empty.headers.size() == 5);
    CHECK(empty.headers[4] == std::pair<std::string, std::string>{"outbox-ordering-key", ""});
}

TEST_CASE("webhook_request: the event's headers follow, in order and as written") {
    event e = make_event({{"X-Tenant", "acme"}, {"Authorization", "Bearer abc"}, {"x-empty", ""},
                          {"X-Tab", "a\tb"}, {"X-Utf8", "caf\xC3\xA9"}, {"X-Tenant", "second"}});
    e.ordering_key = "k";
    const auto r = build_request_headers(e, sent_at);
    CHECK_FALSE(r.error.has_value());
    header_list expected = mandatory;
    expected.emplace_back("outbox-ordering-key", "k");
    expected.emplace_back("X-Tenant", "acme");
    expected.emplace_back("Authorization", "Bearer abc");
    expected.emplace_back("x-empty", "");
    expected.emplace_back("X-Tab", "a\tb");
    expected.emplace_back("X-Utf8", "caf\xC3\xA9");
    expected.emplace_back("X-Tenant", "second");
    CHECK(r.headers == expected);
}

TEST_CASE("webhook_request: every RFC 9110 token character is allowed in a name") {
    const auto r = build_request_headers(make_event({{"X!#$%&'*+-.^_`|~09azAZ", "v"}}), sent_at);
    CHECK_FALSE(r.error.has_value());
    REQUIRE(r.headers.size() == 5);
    CHECK(r.headers[4].first == "X!#$%&'*+-.^_`|~09azAZ");
}

TEST_CASE("webhook_request: reserved names are skipped, case-insensitively") {
    for (const std::string_view name :
         {"Host", "host", "HOST", "content-length", "Content-Length", "Content-Type", "Transfer-Encoding",
          "Connection", "Keep-Alive", "Upgrade", "TE", "te", "Trailer", "webhook-foo", "Webhook-Id",
          "WEBHOOK-TIMESTAMP", "webhook-signature", "Outbox-Topic", "outbox-attempt", "OUTBOX-ORDERING-KEY",
          "outbox-anything"}) {
        CAPTURE(name);
        const auto r = build_request_headers(make_event({{std::string(name), "evil"}}), sent_at);
        CHECK_FALSE(r.error.has_value());
        CHECK(r.headers == mandatory);
    }
}

TEST_CASE("webhook_request: reserved names do not stop the others") {
    const auto r = build_request_headers(
        make_event({{"X-A", "1"}, {"Host", "evil.example"}, {"X-B", "2"}, {"Outbox-Topic", "spoofed"}}), sent_at);
    CHECK_FALSE(r.error.has_value());
    header_list expected = mandatory;
    expected.emplace_back("X-A", "1");
    expected.emplace_back("X-B", "2");
    CHECK(r.headers == expected);
}

TEST_CASE("webhook_request: names that merely resemble reserved ones are kept") {
    for (const std::string_view name : {"X-Host", "Hosts", "Content-Length2", "webhook", "webhookfoo",
                                        "X-Webhook-Id", "outbox", "Outbox_Topic", "Tex"}) {
        CAPTURE(name);
        const auto r = build_request_headers(make_event({{std::string(name), "v"}}), sent_at);
        CHECK_FALSE(r.error.has_value());
        REQUIRE(r.headers.size() == 5);
        CHECK(r.headers[4].first == name);
    }
}

TEST_CASE("webhook_request: an invalid header name is an error") {
    for (const std::string_view name : {"X Tenant", "X:Tenant", "X-Tenant:", "", " X", "X\t", "X\r\nY",
                                        "(x)", "a/b", "a@b", "a,b", "a;b", "a=b", "a\"b", "{x}", "T\xC3\xA9nant"}) {
        CAPTURE(name);
        const auto r = build_request_headers(make_event({{std::string(name), "v"}}), sent_at);
        REQUIRE(r.error.has_value());
        CHECK(contains(*r.error, "not a valid HTTP token"));
    }
    // NUL in a name
    const auto nul = build_request_headers(make_event({{std::string("X\0Y", 3), "v"}}), sent_at);
    CHECK(nul.error.has_value());
}

TEST_CASE("webhook_request: a value with CR, LF, NUL or other controls is an error") {
    for (const std::string_view value :
         {std::string_view("a\rb"), std::string_view("a\nb"), std::string_view("a\r\nX-Injected: 1"),
          std::string_view("a\0b", 3), std::string_view("\x01"), std::string_view("a\x1f"),
          std::string_view("a\x7f"), std::string_view("\n")}) {
        CAPTURE(value.size());
        const auto r = build_request_headers(make_event({{"X-Tenant", std::string(value)}}), sent_at);
        REQUIRE(r.error.has_value());
        CHECK(contains(*r.error, "X-Tenant"));
        CHECK(contains(*r.error, "control characters"));
    }
    // even for a name that would have been skipped
    CHECK(build_request_headers(make_event({{"Host", "a\r\nb"}}), sent_at).error.has_value());
}

TEST_CASE("webhook_request: a topic or ordering key with CR/LF is an error") {
    for (const std::string_view topic :
         {std::string_view("orders\r\nX-Injected: 1"), std::string_view("orders\n"), std::string_view("\rorders"),
          std::string_view("or\0ders", 7)}) {
        CAPTURE(topic.size());
        event e = make_event();
        e.topic = std::string(topic);
        const auto r = build_request_headers(e, sent_at);
        REQUIRE(r.error.has_value());
        CHECK(contains(*r.error, "topic or ordering key"));
    }
    event e = make_event();
    e.ordering_key = "customer\r\n7";
    const auto r = build_request_headers(e, sent_at);
    REQUIRE(r.error.has_value());
    CHECK(contains(*r.error, "topic or ordering key"));

    // a topic with a tab or non-ASCII text is fine
    event ok = make_event();
    ok.topic = "orders\tcaf\xC3\xA9";
    CHECK_FALSE(build_request_headers(ok, sent_at).error.has_value());
}

TEST_CASE("destination headers replace event headers of the same name, never protocol headers") {
    event e = make_event();
    e.headers = {{"Authorization", "from-the-event"}, {"X-Tenant", "acme"}};
    auto r = build_request_headers(e, sent_at);
    REQUIRE_FALSE(r.error.has_value());
    add_destination_headers(r.headers, {{"authorization", "Bearer configured"},
                                        {"Webhook-Id", "spoofed"},
                                        {"Content-Length", "1"},
                                        {"X-Env", "prod"}});
    auto count = [&](std::string_view name) {
        return std::count_if(r.headers.begin(), r.headers.end(), [&](const auto& h) {
            return h.first.size() == name.size() &&
                   std::equal(h.first.begin(), h.first.end(), name.begin(),
                              [](char a, char b) { return std::tolower(a) == std::tolower(b); });
        });
    };
    CHECK(count("authorization") == 1);
    CHECK(count("webhook-id") == 1);
    CHECK(count("content-length") == 0);
    CHECK(r.headers.front() == std::pair<std::string, std::string>{"webhook-id", "42"});
    CHECK(std::find(r.headers.begin(), r.headers.end(),
                    std::pair<std::string, std::string>{"authorization", "Bearer configured"}) != r.headers.end());
    CHECK(std::find(r.headers.begin(), r.headers.end(),
                    std::pair<std::string, std::string>{"X-Tenant", "acme"}) != r.headers.end());
    CHECK(r.headers.back() == std::pair<std::string, std::string>{"X-Env", "prod"});
}
