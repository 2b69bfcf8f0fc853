// Parsing of webhook endpoint URLs: the strict subset of RFC 3986 that an
// HTTP client needs, with errors meant for an operator reading a config file.
//
// Decisions:
// * Only absolute http/https URLs. The scheme and host are case-insensitive
//   and returned in lower case; the path and query are returned unchanged.
// * Userinfo (`user:pass@`) is refused: credentials belong in headers, and a
//   URL is logged in many places. No error message ever repeats any part of
//   the URL except a well-formed scheme or a single offending character, so a
//   mistyped URL holding a password cannot leak it through an error.
// * Fragments are refused: they are never sent to the server, so a `#` in a
//   webhook URL is almost always a mistake (an unencoded `#` in a query).
// * Characters outside RFC 3986 (space, controls, non-ASCII, `"<>\^`{|}`) are
//   refused rather than silently percent-encoded: what we send must be
//   exactly what the operator wrote.
// * An empty port (`host:`) is refused rather than defaulted: in a config
//   file it is a typo, not an intent.
// * A host made only of digits and dots must be a valid dotted-quad IPv4
//   address (no leading zeros: `010` is octal to some resolvers).

#include "core/url.hpp"

#include <arpa/inet.h>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace outboxd {
namespace {

[[noreturn]] void fail(std::string_view what) {
    std::string message = "invalid endpoint URL: ";
    message += what;
    throw std::invalid_argument(message);
}

constexpr bool is_alpha(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }
constexpr bool is_hex(char c) noexcept {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
constexpr char to_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = to_lower(c);
    return out;
}

// RFC 3986 pchar minus pct-encoded (checked separately), plus '/' and '?'.
constexpr bool is_target_char(char c) noexcept {
    if (is_alpha(c) || is_digit(c)) return true;
    switch (c) {
        case '-': case '.': case '_': case '~':                          // unreserved
        case '!': case '$': case '&': case '\'': case '(': case ')':     // sub-delims
        case '*': case '+': case ',': case ';': case '=':
        case ':': case '@': case '/': case '?':
            return true;
        default:
            return false;
    }
}

// reg-name characters we accept: DNS names plus '_' (common in internal names).
constexpr bool is_host_char(char c) noexcept {
    return is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_';
}

// Whitespace, controls and non-ASCII anywhere make the whole URL suspect
// (a pasted newline, a trailing space): refuse before looking at structure.
void check_bytes(std::string_view url) {
    for (char ch : url) {
        auto const c = static_cast<unsigned char>(ch);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') fail("contains whitespace");
        if (c < 0x20 || c == 0x7f) fail("contains a control character");
        if (c >= 0x80) fail("contains a non-ASCII character (percent-encode it)");
    }
}

bool is_valid_ipv4(std::string_view s) {
    int parts = 0;
    std::size_t i = 0;
    while (true) {
        std::size_t const start = i;
        unsigned value = 0;
        while (i < s.size() && is_digit(s[i])) {
            value = value * 10 + static_cast<unsigned>(s[i] - '0');
            if (i - start >= 3 || value > 255) return false;
            ++i;
        }
        std::size_t const len = i - start;
        if (len == 0 || (len > 1 && s[start] == '0')) return false;
        ++parts;
        if (i == s.size()) break;
        if (s[i] != '.') return false;
        ++i;
    }
    return parts == 4;
}

void check_reg_name(std::string_view host) {
    if (host.size() > 253) fail("host name longer than 253 characters");
    std::size_t label = 0;
    for (std::size_t i = 0; i < host.size(); ++i) {
        char const c = host[i];
        if (c == '%') fail("percent-encoded host names are not supported");
        if (!is_host_char(c)) {
            std::string what = "invalid character '";
            what += c;
            what += "' in host";
            fail(what);
        }
        if (c == '.') {
            // A single trailing dot (fully qualified name) is fine.
            if (label == 0) fail("empty label in host name");
            label = 0;
        } else if (++label > 63) {
            fail("host name label longer than 63 characters");
        }
    }
    bool numeric = true;
    for (char c : host) numeric = numeric && (is_digit(c) || c == '.');
    if (numeric && !is_valid_ipv4(host)) fail("invalid IPv4 address");
}

void check_ipv6(std::string_view inside) {
    if (inside.find('%') != std::string_view::npos) fail("IPv6 zone identifiers are not supported");
    if (inside.empty() || inside.size() >= INET6_ADDRSTRLEN) fail("invalid IPv6 address");
    for (char c : inside) {
        if (!is_hex(c) && c != ':' && c != '.') fail("invalid IPv6 address");
    }
    std::string const text(inside);  // inet_pton needs a terminated string
    std::array<unsigned char, 16> bytes{};
    if (::inet_pton(AF_INET6, text.c_str(), bytes.data()) != 1) fail("invalid IPv6 address");
}

// Returns the port number as canonical decimal text; never echoes the input
// (a mistyped `user:secret@host` can end up here as a "port").
std::string parse_port(std::string_view digits) {
    if (digits.empty()) fail("empty port after ':'");
    unsigned long value = 0;
    for (char c : digits) {
        if (!is_digit(c)) fail("port is not a number");
        value = value * 10 + static_cast<unsigned long>(c - '0');
        if (value > 65535) fail("port out of range (1..65535)");
    }
    if (value == 0) fail("port out of range (1..65535)");
    return std::to_string(value);
}

void check_target(std::string_view target) {
    for (std::size_t i = 0; i < target.size(); ++i) {
        char const c = target[i];
        if (c == '%') {
            if (i + 2 >= target.size() || !is_hex(target[i + 1]) || !is_hex(target[i + 2])) {
                fail("'%' in path or query not followed by two hex digits");
            }
            i += 2;
            continue;
        }
        if (!is_target_char(c)) {
            std::string what = "character '";
            what += c;
            what += "' not allowed in path or query (percent-encode it)";
            fail(what);
        }
    }
}

}  // namespace

endpoint_url parse_endpoint_url(std::string_view url) {
    if (url.empty()) fail("empty");
    check_bytes(url);

    // scheme "://"
    std::size_t const colon = url.find(':');
    std::string_view const scheme_text = colon == std::string_view::npos ? std::string_view{} : url.substr(0, colon);
    bool scheme_syntax = !scheme_text.empty() && is_alpha(scheme_text.front());
    for (char c : scheme_text) {
        scheme_syntax = scheme_syntax && (is_alpha(c) || is_digit(c) || c == '+' || c == '-' || c == '.');
    }
    if (!scheme_syntax || url.substr(colon + 1, 2) != "//") {
        // Without "scheme://" we cannot tell a scheme from "user:pass@" or
        // "host:port", so nothing of the input is echoed.
        fail("must start with http:// or https://");
    }
    endpoint_url out;
    out.scheme = lower(scheme_text);
    if (out.scheme != "http" && out.scheme != "https") {
        fail("unsupported scheme '" + out.scheme + "' (expected http or https)");
    }
    std::string_view rest = url.substr(colon + 3);

    if (rest.find('#') != std::string_view::npos) {
        fail("fragments ('#...') are not allowed: they are never sent to the server");
    }
    if (rest.find('\\') != std::string_view::npos) fail("backslash not allowed");

    // authority = everything up to the first '/' or '?'
    std::size_t const authority_end = rest.find_first_of("/?");
    std::string_view const authority = rest.substr(0, authority_end);
    std::string_view const target = authority_end == std::string_view::npos ? std::string_view{} : rest.substr(authority_end);

    if (authority.find('@') != std::string_view::npos) {
        fail("userinfo ('user:password@') is not allowed; send credentials in a header instead");
    }

    std::string_view port_text;
    bool has_port = false;
    bool ipv6 = false;
    if (!authority.empty() && authority.front() == '[') {
        std::size_t const close = authority.find(']');
        if (close == std::string_view::npos) fail("unterminated '[' in host");
        std::string_view const inside = authority.substr(1, close - 1);
        check_ipv6(inside);
        out.host = lower(inside);
        ipv6 = true;
        std::string_view const after = authority.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':') fail("unexpected characters after IPv6 address");
            has_port = true;
            port_text = after.substr(1);
        }
    } else {
        std::size_t const port_colon = authority.find(':');
        std::string_view const host = authority.substr(0, port_colon);
        if (host.empty()) fail("missing host");
        check_reg_name(host);
        out.host = lower(host);
        if (port_colon != std::string_view::npos) {
            has_port = true;
            port_text = authority.substr(port_colon + 1);
        }
    }

    std::string const default_port = out.scheme == "https" ? "443" : "80";
    out.port = has_port ? parse_port(port_text) : default_port;

    check_target(target);
    // No path means the root: "" is "/", "?q" is "/?q". One character
    // appended, not `= "/"`: at -O3 GCC 12 reports a -Wrestrict false
    // positive on assigning the literal.
    if (target.empty() || target.front() == '?') out.target.push_back('/');
    out.target += target;

    out.host_header = ipv6 ? "[" + out.host + "]" : out.host;
    if (out.port != default_port) {
        out.host_header += ':';
        out.host_header += out.port;
    }
    return out;
}

std::string loggable_url(const endpoint_url& url) {
    const auto query = url.target.find('?');
    return fmt::format("{}://{}{}{}", url.scheme, url.host_header, std::string_view(url.target).substr(0, query),
                       query == std::string::npos ? "" : "?<redacted>");
}

}  // namespace outboxd
