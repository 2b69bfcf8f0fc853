#include "core/topic_pattern.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include <fmt/format.h>

namespace outboxd {
namespace {

// The tail a '>' matches: one or more tokens, none of them empty.
bool is_token_list(std::string_view s) noexcept {
    return !s.empty() && s.front() != '.' && s.back() != '.' && s.find("..") == std::string_view::npos;
}

}  // namespace

topic_pattern topic_pattern::parse(std::string_view text) {
    auto bad = [&](std::string_view why) {
        return std::invalid_argument(fmt::format("invalid topic pattern \"{}\": {}", text, why));
    };
    if (text.empty()) throw std::invalid_argument("invalid topic pattern \"\": empty");
    // The database refuses control characters in topics, so a pattern with
    // one could never match; it is also not safe to echo.
    if (std::any_of(text.begin(), text.end(), [](char c) {
            const auto u = static_cast<unsigned char>(c);
            return u < 0x20 || u == 0x7F;
        })) {
        throw std::invalid_argument("invalid topic pattern: contains a control character");
    }
    topic_pattern p;
    p.text_ = std::string(text);
    std::size_t pos = 0;
    for (;;) {
        const auto dot = text.find('.', pos);
        const auto end = dot == std::string_view::npos ? text.size() : dot;
        const auto tok = text.substr(pos, end - pos);
        if (tok.empty()) throw bad("empty token (two dots in a row, or a dot at either end)");
        if (!p.tokens_.empty() && p.tokens_.back().k == kind::rest) throw bad("'>' must be the last token");
        if (tok == "*") {
            p.tokens_.push_back({kind::one, pos, end - pos});
            p.literal_ = false;
        } else if (tok == ">") {
            p.tokens_.push_back({kind::rest, pos, end - pos});
            p.literal_ = false;
        } else if (tok == "#") {
            // RabbitMQ's wildcard; here it would be a literal that never matches.
            throw bad("'#' is not a wildcard here: use '>' for one or more tokens, '*' for exactly one");
        } else if (tok.find_first_of("*>") != std::string_view::npos) {
            throw bad("'*' and '>' must be whole tokens");
        } else {
            p.tokens_.push_back({kind::literal, pos, end - pos});
        }
        if (dot == std::string_view::npos) break;
        pos = dot + 1;
    }
    return p;
}

std::string topic_pattern::to_regex() const {
    const std::string_view text = text_;
    std::string out = "^";
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
        const auto& t = tokens_[i];
        if (i > 0) out += "\\.";
        switch (t.k) {
            case kind::one: out += "[^.]+"; break;
            case kind::rest: out += "[^.]+(\\.[^.]+)*"; break;
            case kind::literal:
                for (const char c : text.substr(t.offset, t.size)) {
                    // In PostgreSQL's regular expressions a backslash before
                    // any character that is not a letter or digit makes it
                    // literal. Bytes of non-ASCII characters are never
                    // metacharacters: left as they are.
                    const auto u = static_cast<unsigned char>(c);
                    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
                    out.push_back(c);
                }
                break;
        }
    }
    out += "$";
    return out;
}

bool topic_pattern::matches(std::string_view topic) const noexcept {
    if (literal_) return topic == text_;
    const std::string_view text = text_;
    std::size_t pos = 0;  // start of the next topic token; topic.size() + 1 once all are consumed
    for (const auto& t : tokens_) {
        if (pos > topic.size()) return false;  // the topic has fewer tokens
        if (t.k == kind::rest) return is_token_list(topic.substr(pos));
        const auto dot = topic.find('.', pos);
        const auto end = dot == std::string_view::npos ? topic.size() : dot;
        const auto tok = topic.substr(pos, end - pos);
        if (tok.empty()) return false;
        if (t.k == kind::literal && tok != text.substr(t.offset, t.size)) return false;
        pos = end + 1;
    }
    return pos == topic.size() + 1;  // no tokens left over
}

}  // namespace outboxd
