#include "core/dsn.hpp"

#include <cctype>
#include <string>

#include <fmt/format.h>

namespace outboxd {
namespace {

bool ieq_prefix(std::string_view s, std::string_view prefix) {
    if (s.size() < prefix.size()) return false;
    for (std::size_t i = 0; i < prefix.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
    }
    return true;
}

// Finds the password in the userinfo of a URI: [scheme://][user[:password]@]host...
std::string redact_uri(std::string_view uri) {
    std::string out(uri);
    const auto scheme_end = out.find("://");
    const auto authority = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    const auto authority_end = out.find_first_of("/?", authority);
    const auto at = out.rfind('@', authority_end == std::string::npos ? out.size() : authority_end);
    if (at != std::string::npos && at >= authority) {
        const auto colon = out.find(':', authority);
        if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
    }
    // password=... in the query string
    for (auto q = out.find('?'); q != std::string::npos;) {
        auto key = q + 1;
        if (ieq_prefix(std::string_view(out).substr(key), "password=")) {
            const auto value = key + 9;
            const auto value_end = out.find('&', value);
            out.replace(value, (value_end == std::string::npos ? out.size() : value_end) - value, "***");
        }
        q = out.find('&', key);
    }
    return out;
}

// key = value pairs; values may be single-quoted with backslash escapes.
std::string redact_keyword_value(std::string_view dsn) {
    std::string out;
    std::size_t i = 0;
    while (i < dsn.size()) {
        while (i < dsn.size() && std::isspace(static_cast<unsigned char>(dsn[i]))) out.push_back(dsn[i++]);
        const auto key_start = i;
        while (i < dsn.size() && dsn[i] != '=' && !std::isspace(static_cast<unsigned char>(dsn[i]))) ++i;
        const std::string_view key = dsn.substr(key_start, i - key_start);
        out.append(key);
        while (i < dsn.size() && std::isspace(static_cast<unsigned char>(dsn[i]))) ++i;
        if (i >= dsn.size() || dsn[i] != '=') break;
        out.push_back('=');
        ++i;
        while (i < dsn.size() && std::isspace(static_cast<unsigned char>(dsn[i]))) ++i;
        const auto value_start = i;
        if (i < dsn.size() && dsn[i] == '\'') {
            ++i;
            while (i < dsn.size() && dsn[i] != '\'') i += (dsn[i] == '\\') ? 2 : 1;
            i = std::min(i + 1, dsn.size());
        } else {
            while (i < dsn.size() && !std::isspace(static_cast<unsigned char>(dsn[i]))) ++i;
        }
        if (key == "password") out.append("***");
        else out.append(dsn.substr(value_start, i - value_start));
    }
    return out;
}

}  // namespace

bool is_uri_dsn(std::string_view dsn) noexcept {
    return ieq_prefix(dsn, "postgresql://") || ieq_prefix(dsn, "postgres://");
}

std::string redact_dsn(std::string_view dsn) {
    return is_uri_dsn(dsn) ? redact_uri(dsn) : redact_keyword_value(dsn);
}

std::string scrub_secrets(std::string_view message, std::string_view dsn) {
    std::string out(message);
    // A password can only leak if the message quotes the connection string;
    // replace any literal occurrence of the whole string, then of the password.
    if (!dsn.empty()) {
        const std::string redacted = redact_dsn(dsn);
        for (auto pos = out.find(dsn); pos != std::string::npos; pos = out.find(dsn, pos + redacted.size())) {
            out.replace(pos, dsn.size(), redacted);
        }
    }
    return out;
}

std::string with_default(std::string_view dsn, std::string_view key, std::string_view value) {
    const std::string needle = fmt::format("{}=", key);
    if (is_uri_dsn(dsn)) {
        const auto q = dsn.find('?');
        if (q != std::string_view::npos) {
            for (auto pos = q; pos != std::string_view::npos; pos = dsn.find('&', pos + 1)) {
                if (dsn.substr(pos + 1).starts_with(needle)) return std::string(dsn);
            }
            return fmt::format("{}&{}={}", dsn, key, value);
        }
        return fmt::format("{}?{}={}", dsn, key, value);
    }
    for (auto pos = dsn.find(needle); pos != std::string_view::npos; pos = dsn.find(needle, pos + 1)) {
        if (pos == 0 || std::isspace(static_cast<unsigned char>(dsn[pos - 1]))) return std::string(dsn);
    }
    if (dsn.empty()) return fmt::format("{}={}", key, value);
    return fmt::format("{} {}={}", dsn, key, value);
}

}  // namespace outboxd
