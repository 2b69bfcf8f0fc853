#include "core/dsn.hpp"

#include <algorithm>
#include <cctype>
#include <utility>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/text.hpp"

namespace outboxd {
namespace {

constexpr std::string_view unparseable = "(connection string not shown: it could not be parsed)";

bool ieq_prefix(std::string_view s, std::string_view prefix) {
    if (s.size() < prefix.size()) return false;
    for (std::size_t i = 0; i < prefix.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
    }
    return true;
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// One `key = value` of a libpq key/value string: where the value's raw text
// is (quotes and escapes included) and what it means.
struct setting {
    std::size_t key_begin = 0;
    std::string_view key;
    std::size_t value_begin = 0;
    std::size_t value_end = 0;
    std::string value;
};

// The grammar of libpq's conninfo_parse: whitespace-separated key=value,
// spaces allowed around '=', values single-quoted or bare, backslash escapes
// in both. nullopt when the string does not follow it.
std::optional<std::vector<setting>> parse_keyword_value(std::string_view dsn) {
    std::vector<setting> out;
    std::size_t i = 0;
    for (;;) {
        while (i < dsn.size() && is_space(dsn[i])) ++i;
        if (i >= dsn.size()) return out;
        const auto key_start = i;
        while (i < dsn.size() && dsn[i] != '=' && !is_space(dsn[i])) ++i;
        setting s;
        s.key_begin = key_start;
        s.key = dsn.substr(key_start, i - key_start);
        while (i < dsn.size() && is_space(dsn[i])) ++i;
        if (i >= dsn.size() || dsn[i] != '=' || s.key.empty()) return std::nullopt;
        ++i;
        while (i < dsn.size() && is_space(dsn[i])) ++i;
        s.value_begin = i;
        if (i < dsn.size() && dsn[i] == '\'') {
            ++i;
            for (;;) {
                if (i >= dsn.size()) return std::nullopt;  // unterminated quote
                if (dsn[i] == '\\' && i + 1 < dsn.size()) {
                    s.value.push_back(dsn[i + 1]);
                    i += 2;
                } else if (dsn[i] == '\'') {
                    ++i;
                    break;
                } else {
                    s.value.push_back(dsn[i++]);
                }
            }
        } else {
            while (i < dsn.size() && !is_space(dsn[i])) {
                if (dsn[i] == '\\' && i + 1 < dsn.size()) {
                    s.value.push_back(dsn[i + 1]);
                    i += 2;
                } else {
                    s.value.push_back(dsn[i++]);
                }
            }
        }
        s.value_end = i;
        out.push_back(std::move(s));
    }
}

// The userinfo of a URI runs to the last '@' before the path. A password may
// (wrongly, but it happens) contain an unencoded '?', so only '/' ends it.
struct uri_password {
    std::size_t begin = 0;
    std::size_t end = 0;
};

std::optional<uri_password> find_uri_password(std::string_view uri) {
    const auto scheme_end = uri.find("://");
    if (scheme_end == std::string_view::npos) return std::nullopt;
    const auto authority = scheme_end + 3;
    const auto path = uri.find('/', authority);
    const auto at = uri.rfind('@', path == std::string_view::npos ? std::string_view::npos : path);
    if (at == std::string_view::npos || at < authority) return std::nullopt;
    const auto colon = uri.find(':', authority);
    if (colon == std::string_view::npos || colon > at) return std::nullopt;
    return uri_password{colon + 1, at};
}

std::string redact_uri(std::string_view uri) {
    std::string out(uri);
    if (const auto pw = find_uri_password(uri)) out.replace(pw->begin, pw->end - pw->begin, "***");
    // password=... in the query string
    for (auto q = out.find('?'); q != std::string::npos;) {
        const auto key = q + 1;
        if (ieq_prefix(std::string_view(out).substr(key), "password=")) {
            const auto value = key + 9;
            const auto value_end = out.find('&', value);
            out.replace(value, (value_end == std::string::npos ? out.size() : value_end) - value, "***");
        }
        q = out.find('&', key);
    }
    return out;
}

std::string redact_keyword_value(std::string_view dsn) {
    const auto settings = parse_keyword_value(dsn);
    if (!settings) return std::string(unparseable);
    std::string out(dsn);
    // Right to left, so earlier offsets stay valid.
    for (auto it = settings->rbegin(); it != settings->rend(); ++it) {
        if (it->key == "password") out.replace(it->key_begin, it->value_end - it->key_begin, "password=***");
    }
    return out;
}

// In a key/value string that does not parse, the password's extent is
// unknown: every word from "password" up to the next word with '=' may be part
// of it (e.g. an unquoted password with a space), and libpq's parse error
// quotes such words.
std::vector<std::string_view> suspect_words(std::string_view dsn) {
    std::vector<std::string_view> words;
    bool in_password = false;
    std::size_t i = 0;
    while (i < dsn.size()) {
        while (i < dsn.size() && is_space(dsn[i])) ++i;
        const auto start = i;
        while (i < dsn.size() && !is_space(dsn[i])) ++i;
        const auto word = dsn.substr(start, i - start);
        if (word.empty()) break;
        if (word.starts_with("password")) {
            in_password = true;
            const auto eq = word.find('=');
            if (eq != std::string_view::npos && eq + 1 < word.size()) words.push_back(word.substr(eq + 1));
            continue;
        }
        if (word.find('=') != std::string_view::npos) in_password = false;
        else if (in_password) words.push_back(word);
    }
    return words;
}

void replace_all(std::string& text, std::string_view needle, std::string_view with) {
    if (needle.empty()) return;
    for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + with.size())) {
        text.replace(pos, needle.size(), with);
    }
}

}  // namespace

std::optional<std::string> password_of(std::string_view dsn) {
    if (is_uri_dsn(dsn)) {
        const auto pw = find_uri_password(dsn);
        if (!pw) return std::nullopt;
        return std::string(dsn.substr(pw->begin, pw->end - pw->begin));
    }
    const auto settings = parse_keyword_value(dsn);
    if (!settings) return std::nullopt;
    for (const auto& s : *settings) {
        if (s.key == "password") return s.value;
    }
    return std::nullopt;
}

bool is_uri_dsn(std::string_view dsn) noexcept {
    return ieq_prefix(dsn, "postgresql://") || ieq_prefix(dsn, "postgres://");
}

std::string redact_dsn(std::string_view dsn) {
    return is_uri_dsn(dsn) ? redact_uri(dsn) : redact_keyword_value(dsn);
}

std::string scrub_secrets(std::string_view message, std::string_view dsn) {
    std::string out = one_line(message);
    if (dsn.empty()) return out;
    // The whole connection string first (keeps the message readable) ...
    replace_all(out, dsn, redact_dsn(dsn));
    // ... then the password wherever it still stands alone. Very short
    // passwords are skipped: replacing every "a" would garble the message.
    if (const auto pw = password_of(dsn); pw && pw->size() >= 4) replace_all(out, *pw, "***");
    if (!is_uri_dsn(dsn) && !parse_keyword_value(dsn)) {
        for (const auto word : suspect_words(dsn)) {
            replace_all(out, fmt::format("\"{}\"", word), "\"***\"");
            if (word.size() >= 4) replace_all(out, word, "***");
        }
    }
    return out;
}

std::string with_default(std::string_view dsn, std::string_view key, std::string_view value) {
    if (is_uri_dsn(dsn)) {
        const auto q = dsn.find('?');
        if (q == std::string_view::npos) return fmt::format("{}?{}={}", dsn, key, value);
        const std::string needle = fmt::format("{}=", key);
        for (auto pos = q; pos != std::string_view::npos; pos = dsn.find('&', pos + 1)) {
            if (dsn.substr(pos + 1).starts_with(needle)) return std::string(dsn);
        }
        const bool open_ended = dsn.back() == '?' || dsn.back() == '&';
        return fmt::format("{}{}{}={}", dsn, open_ended ? "" : "&", key, value);
    }
    if (const auto settings = parse_keyword_value(dsn)) {
        for (const auto& s : *settings) {
            if (s.key == key) return std::string(dsn);
        }
    }
    if (dsn.find_first_not_of(" \t\n\r") == std::string_view::npos) return fmt::format("{}={}", key, value);
    return fmt::format("{} {}={}", dsn, key, value);
}

std::string with_connection_defaults(std::string_view dsn, std::chrono::milliseconds connect_timeout,
                                     std::chrono::milliseconds keepalive_timeout) {
    using std::chrono::duration_cast;
    using std::chrono::seconds;
    const auto whole_seconds = [](std::chrono::milliseconds d) {
        return std::max<long long>(1, duration_cast<seconds>(d + std::chrono::milliseconds(999)).count());
    };
    // Idle for half the timeout, then three probes in the other half: an idle
    // connection to a silent peer errors within the timeout. tcp_user_timeout
    // covers a connection with data in flight, which keepalive does not.
    const auto t = whole_seconds(keepalive_timeout);
    const auto idle = std::max<long long>(1, t / 2);
    const auto interval = std::max<long long>(1, (t - idle) / 3);
    std::string out(dsn);
    const std::pair<std::string_view, std::string> defaults[] = {
        {"application_name", "outboxd"},
        {"connect_timeout", fmt::format("{}", whole_seconds(connect_timeout))},
        {"keepalives", "1"},
        {"keepalives_idle", fmt::format("{}", idle)},
        {"keepalives_interval", fmt::format("{}", interval)},
        {"keepalives_count", "3"},
        {"tcp_user_timeout", fmt::format("{}", keepalive_timeout.count())},
    };
    for (const auto& [key, value] : defaults) out = with_default(out, key, value);
    return out;
}

}  // namespace outboxd
