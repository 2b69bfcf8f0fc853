#pragma once
// Topic patterns for routing, in the NATS convention.
//
// A topic is a list of tokens separated by '.': "orders.eu.created". In a
// pattern
//   *   matches exactly one token:          orders.*  ~ orders.created, not orders.eu.created
//   >   matches one or more tokens, and     orders.>  ~ orders.created, orders.eu.created,
//       may only be the last token                      but not orders itself
// and any other token matches only itself, byte for byte (case-sensitive).
// A pattern without wildcards matches exactly one topic: itself.
//
// Patterns are validated when parsed (they come from the configuration):
// no empty tokens, '*' and '>' only as whole tokens, '>' only last.
// Topics are not validated (they come from the database, which only refuses
// empty ones and control characters): the matcher works token by token, so
// a topic with an empty token ("a..b", ".a", "a.") is never matched by a
// wildcard, and since no valid pattern contains an empty token, no pattern
// matches it at all. Such a topic therefore has no route.
//
// Matching allocates nothing and uses no regular expressions: it runs once
// per route for every event the relay claims.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace outboxd {

class topic_pattern {
public:
    // Throws std::invalid_argument: `invalid topic pattern "ord*": '*' and
    // '>' must be whole tokens` (patterns are not secret, so they are quoted).
    [[nodiscard]] static topic_pattern parse(std::string_view text);

    [[nodiscard]] bool matches(std::string_view topic) const noexcept;
    // The same test as a PostgreSQL regular expression (for `topic ~ $1` in
    // the CLI's queries): anchored, literal tokens escaped.
    [[nodiscard]] std::string to_regex() const;

    [[nodiscard]] const std::string& text() const noexcept { return text_; }
    // True when the pattern has no wildcard (it matches only itself).
    [[nodiscard]] bool is_literal() const noexcept { return literal_; }

private:
    enum class kind { literal, one, rest };  // "name", "*", ">"
    struct token {
        kind k;
        std::size_t offset;  // into text_, for literal tokens
        std::size_t size;
    };

    topic_pattern() = default;

    std::string text_;
    std::vector<token> tokens_;
    bool literal_ = true;
};

}  // namespace outboxd
