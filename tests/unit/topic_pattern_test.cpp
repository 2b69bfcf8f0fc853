#include "core/topic_pattern.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <string_view>

using outboxd::topic_pattern;

namespace {

std::string error_of(std::string_view pattern) {
    try {
        (void)topic_pattern::parse(pattern);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return {};
}

struct match_case {
    std::string_view pattern;
    std::string_view topic;
    bool matches;
};

}  // namespace

TEST_CASE("topic_pattern: table of pattern x topic") {
    const match_case cases[] = {
        // literal: exactly itself, case-sensitive
        {"orders", "orders", true},
        {"orders", "Orders", false},
        {"orders", "orders.created", false},
        {"orders.created", "orders.created", true},
        {"orders.created", "orders.created.eu", false},
        {"orders.created", "orders", false},
        {"orders.created", "orders.createdx", false},
        // * is exactly one token
        {"*", "orders", true},
        {"*", "orders.created", false},
        {"orders.*", "orders.created", true},
        {"orders.*", "orders.eu.created", false},
        {"orders.*", "orders", false},
        {"orders.*", "orders.", false},      // empty last token
        {"orders.*", "billing.created", false},
        {"*.created", "orders.created", true},
        {"*.created", "orders.updated", false},
        {"*.*", "a.b", true},
        {"*.*", "a.b.c", false},
        {"*.*", "a", false},
        {"a.*.c", "a.b.c", true},
        {"a.*.c", "a.b.d", false},
        {"a.*.c", "a..c", false},            // * never matches an empty token
        // > is one or more tokens, at the end
        {">", "orders", true},
        {">", "orders.created.eu", true},
        {">", "", false},
        {">", "a..b", false},                // a topic with an empty token matches no wildcard
        {">", ".a", false},
        {">", "a.", false},
        {"orders.>", "orders.created", true},
        {"orders.>", "orders.eu.created", true},
        {"orders.>", "orders", false},       // one or more: not zero
        {"orders.>", "orders.", false},
        {"orders.>", "orders.a..b", false},
        {"orders.>", "ordersx.created", false},
        {"*.>", "a.b", true},
        {"*.>", "a", false},
        {"orders.*.>", "orders.eu.created.v2", true},
        {"orders.*.>", "orders.eu", false},
        // wildcards in the topic are plain characters
        {"orders.*", "orders.*", true},
        {"orders.x", "orders.*", false},
        {"a b.*", "a b.c", true},            // spaces are ordinary token characters
        {"*", "", false},
        {"*", ".", false},
    };
    for (const auto& c : cases) {
        CAPTURE(c.pattern);
        CAPTURE(c.topic);
        CHECK(topic_pattern::parse(c.pattern).matches(c.topic) == c.matches);
    }
}

TEST_CASE("topic_pattern: literal and text") {
    CHECK(topic_pattern::parse("orders.created").is_literal());
    CHECK_FALSE(topic_pattern::parse("orders.*").is_literal());
    CHECK_FALSE(topic_pattern::parse(">").is_literal());
    CHECK(topic_pattern::parse("a.*.>").text() == "a.*.>");
}

TEST_CASE("topic_pattern: a copied pattern still matches (tokens do not point into the original)") {
    auto original = topic_pattern::parse("orders.*.created");
    const topic_pattern copy = original;
    original = topic_pattern::parse("x");
    CHECK(copy.matches("orders.eu.created"));
    CHECK_FALSE(copy.matches("x"));
}

TEST_CASE("topic_pattern: invalid patterns say what is wrong and quote the pattern") {
    const std::pair<std::string_view, std::string_view> cases[] = {
        {"", "invalid topic pattern \"\": empty"},
        {"a..b", "invalid topic pattern \"a..b\": empty token"},
        {".a", "invalid topic pattern \".a\": empty token"},
        {"a.", "invalid topic pattern \"a.\": empty token"},
        {".", "invalid topic pattern \".\": empty token"},
        {"ord*", "invalid topic pattern \"ord*\": '*' and '>' must be whole tokens"},
        {"orders.*x", "invalid topic pattern \"orders.*x\": '*' and '>' must be whole tokens"},
        {"a.>b", "invalid topic pattern \"a.>b\": '*' and '>' must be whole tokens"},
        {"**", "invalid topic pattern \"**\": '*' and '>' must be whole tokens"},
        {">.a", "invalid topic pattern \">.a\": '>' must be the last token"},
        {"a.>.>", "invalid topic pattern \"a.>.>\": '>' must be the last token"},
        {"a.>.*", "invalid topic pattern \"a.>.*\": '>' must be the last token"},
        {"a\nb", "invalid topic pattern: contains a control character"},
        {"orders.#", "invalid topic pattern \"orders.#\": '#' is not a wildcard here: use '>'"},
    };
    for (const auto& [pattern, message] : cases) {
        CAPTURE(pattern);
        const auto error = error_of(pattern);
        CHECK(error.starts_with(message));
    }
}

TEST_CASE("to_regex: the same test for PostgreSQL's ~ operator") {
    CHECK(topic_pattern::parse("orders.created").to_regex() == R"(^orders\.created$)");
    CHECK(topic_pattern::parse("orders.*").to_regex() == R"(^orders\.[^.]+$)");
    CHECK(topic_pattern::parse("orders.>").to_regex() == R"(^orders\.[^.]+(\.[^.]+)*$)");
    CHECK(topic_pattern::parse(">").to_regex() == R"(^[^.]+(\.[^.]+)*$)");
    // Regex metacharacters in a literal token stay literal.
    CHECK(topic_pattern::parse("a+b.(c)|d$").to_regex() == R"(^a\+b\.\(c\)\|d\$$)");
    CHECK(topic_pattern::parse("caf\xc3\xa9-x_1").to_regex() == "^caf\xc3\xa9\\-x\\_1$");
}
