#include "core/url.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <string_view>

using outboxd::endpoint_url;
using outboxd::parse_endpoint_url;

namespace {

// The message of the std::invalid_argument thrown for `url` ("" if none).
std::string error_of(std::string_view url) {
    try {
        (void)parse_endpoint_url(url);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return {};
}

}  // namespace

TEST_CASE("url: plain http with defaults") {
    endpoint_url const u = parse_endpoint_url("http://example.com");
    CHECK(u.scheme == "http");
    CHECK(u.host == "example.com");
    CHECK(u.port == "80");
    CHECK(u.target == "/");
    CHECK(u.host_header == "example.com");
    CHECK_FALSE(u.is_tls());
}

TEST_CASE("url: https default port is 443 and is_tls") {
    endpoint_url const u = parse_endpoint_url("https://hooks.example.com/in");
    CHECK(u.scheme == "https");
    CHECK(u.port == "443");
    CHECK(u.target == "/in");
    CHECK(u.host_header == "hooks.example.com");
    CHECK(u.is_tls());
}

TEST_CASE("url: explicit port, path and query") {
    endpoint_url const u = parse_endpoint_url("http://127.0.0.1:8080/hooks/orders?tenant=a&x=%2F");
    CHECK(u.host == "127.0.0.1");
    CHECK(u.port == "8080");
    CHECK(u.target == "/hooks/orders?tenant=a&x=%2F");
    CHECK(u.host_header == "127.0.0.1:8080");
}

TEST_CASE("url: a default port given explicitly is left out of Host") {
    CHECK(parse_endpoint_url("http://example.com:80/").host_header == "example.com");
    CHECK(parse_endpoint_url("https://example.com:443/").host_header == "example.com");
    CHECK(parse_endpoint_url("https://example.com:80/").host_header == "example.com:80");
    // leading zeros are normalised
    CHECK(parse_endpoint_url("http://example.com:0080/").port == "80");
}

TEST_CASE("url: query without a path gets target '/?...'") {
    CHECK(parse_endpoint_url("http://example.com?a=1").target == "/?a=1");
}

TEST_CASE("url: scheme and host are case-insensitive, path is not") {
    endpoint_url const u = parse_endpoint_url("HTTPS://Hooks.Example.COM/Path/A");
    CHECK(u.scheme == "https");
    CHECK(u.host == "hooks.example.com");
    CHECK(u.target == "/Path/A");
}

TEST_CASE("url: bracketed IPv6 literals") {
    endpoint_url const a = parse_endpoint_url("http://[::1]:9000/x");
    CHECK(a.host == "::1");
    CHECK(a.port == "9000");
    CHECK(a.host_header == "[::1]:9000");

    endpoint_url const b = parse_endpoint_url("https://[2001:DB8::1]");
    CHECK(b.host == "2001:db8::1");
    CHECK(b.port == "443");
    CHECK(b.host_header == "[2001:db8::1]");

    CHECK(parse_endpoint_url("http://[::ffff:192.0.2.1]/").host == "::ffff:192.0.2.1");
}

TEST_CASE("url: host names with underscores, digits and a trailing dot") {
    CHECK(parse_endpoint_url("http://my_service-1.internal/").host == "my_service-1.internal");
    CHECK(parse_endpoint_url("http://example.com./").host == "example.com.");
    CHECK(parse_endpoint_url("http://localhost:1/").port == "1");
    CHECK(parse_endpoint_url("http://localhost:65535/").port == "65535");
}

TEST_CASE("url: path characters allowed by RFC 3986 pass through unchanged") {
    std::string_view const target = "/a/b;c=d/e:f@g/!$&'()*+,=-._~?q=1&r=%C3%A9";
    CHECK(parse_endpoint_url(std::string("http://h") + std::string(target)).target == target);
}

TEST_CASE("url: unsupported or missing schemes are refused") {
    CHECK(error_of("ftp://example.com/").find("unsupported scheme 'ftp'") != std::string::npos);
    CHECK(error_of("ws://example.com/").find("unsupported scheme") != std::string::npos);
    CHECK(error_of("example.com/hook").find("http:// or https://") != std::string::npos);
    CHECK(error_of("localhost:8080/hook").find("http:// or https://") != std::string::npos);
    CHECK(error_of("http:/example.com").find("http:// or https://") != std::string::npos);
    CHECK(error_of("http:example.com").find("http:// or https://") != std::string::npos);
    CHECK(error_of("://example.com").find("http:// or https://") != std::string::npos);
    CHECK(error_of("").find("empty") != std::string::npos);
}

TEST_CASE("url: every error is a std::invalid_argument naming the URL") {
    CHECK_THROWS_AS((void)parse_endpoint_url("nope"), std::invalid_argument);
    CHECK(error_of("nope").rfind("invalid endpoint URL: ", 0) == 0);
}

TEST_CASE("url: userinfo is refused without echoing the credentials") {
    for (std::string_view url : {
             "http://alice:s3cr3t-pw@example.com/hook",
             "https://alice:s3cr3t-pw@[::1]:8443/",
             "http://s3cr3t-pw@example.com",
             "http://alice:s3cr3t-pw@/",
         }) {
        CAPTURE(url);
        std::string const msg = error_of(url);
        CHECK(msg.find("userinfo") != std::string::npos);
        CHECK(msg.find("s3cr3t") == std::string::npos);
        CHECK(msg.find("alice") == std::string::npos);
    }
    // A password holding '/' ends the authority early, so this looks like
    // "host alice, port s3cr..." — still must not be echoed.
    std::string const msg = error_of("http://alice:s3cr/3t@example.com/");
    CHECK_FALSE(msg.empty());
    CHECK(msg.find("s3cr") == std::string::npos);
    CHECK(msg.find("alice") == std::string::npos);
    // Same for a user:pass URL with no scheme at all.
    std::string const no_scheme = error_of("alice:s3cr3t@example.com");
    CHECK_FALSE(no_scheme.empty());
    CHECK(no_scheme.find("s3cr3t") == std::string::npos);
}

TEST_CASE("url: fragments are refused") {
    CHECK(error_of("http://example.com/hook#frag").find("fragment") != std::string::npos);
    CHECK(error_of("http://example.com#").find("fragment") != std::string::npos);
    CHECK(error_of("http://example.com/?a=b#c").find("fragment") != std::string::npos);
}

TEST_CASE("url: empty or malformed hosts are refused") {
    CHECK(error_of("http://").find("missing host") != std::string::npos);
    CHECK(error_of("http:///path").find("missing host") != std::string::npos);
    CHECK(error_of("http://:8080/").find("missing host") != std::string::npos);
    CHECK(error_of("http://?q=1").find("missing host") != std::string::npos);
    CHECK(error_of("http://exa!mple.com/").find("invalid character '!' in host") != std::string::npos);
    CHECK(error_of("http://a..b/").find("empty label") != std::string::npos);
    CHECK(error_of("http://.a/").find("empty label") != std::string::npos);
    CHECK(error_of("http://ex%41mple.com/").find("percent-encoded") != std::string::npos);
    CHECK(error_of("http://" + std::string(64, 'a') + ".com/").find("63") != std::string::npos);
    CHECK(error_of("http://" + std::string(254, 'a') + "/").find("253") != std::string::npos);
}

TEST_CASE("url: numeric hosts must be valid dotted-quad IPv4") {
    CHECK(parse_endpoint_url("http://0.0.0.0/").host == "0.0.0.0");
    CHECK(parse_endpoint_url("http://255.255.255.255/").host == "255.255.255.255");
    for (std::string_view url : {"http://256.1.1.1/", "http://1.2.3/", "http://1.2.3.4.5/", "http://01.2.3.4/",
                                 "http://1.2.3.4./", "http://1234/"}) {
        CAPTURE(url);
        CHECK(error_of(url).find("IPv4") != std::string::npos);
    }
}

TEST_CASE("url: malformed IPv6 literals are refused") {
    CHECK(error_of("http://[::1/").find("unterminated") != std::string::npos);
    CHECK(error_of("http://[]/").find("invalid IPv6") != std::string::npos);
    CHECK(error_of("http://[1:2:3]/").find("invalid IPv6") != std::string::npos);
    CHECK(error_of("http://[::g]/").find("invalid IPv6") != std::string::npos);
    CHECK(error_of("http://[1::2::3]/").find("invalid IPv6") != std::string::npos);
    CHECK(error_of("http://[fe80::1%25eth0]/").find("zone") != std::string::npos);
    CHECK(error_of("http://[::1]x/").find("after IPv6") != std::string::npos);
    CHECK(error_of("http://[::1]:/").find("empty port") != std::string::npos);
}

TEST_CASE("url: bad ports are refused") {
    CHECK(error_of("http://example.com:/").find("empty port") != std::string::npos);
    CHECK(error_of("http://example.com:0/").find("out of range") != std::string::npos);
    CHECK(error_of("http://example.com:65536/").find("out of range") != std::string::npos);
    CHECK(error_of("http://example.com:99999999999999999999999/").find("out of range") != std::string::npos);
    CHECK(error_of("http://example.com:80a/").find("not a number") != std::string::npos);
    CHECK(error_of("http://example.com:-1/").find("not a number") != std::string::npos);
    CHECK(error_of("http://example.com:8080:1/").find("not a number") != std::string::npos);
}

TEST_CASE("url: whitespace, control and non-ASCII characters are refused") {
    CHECK(error_of(" http://example.com/").find("whitespace") != std::string::npos);
    CHECK(error_of("http://example.com/\n").find("whitespace") != std::string::npos);
    CHECK(error_of("http://example.com/a b").find("whitespace") != std::string::npos);
    CHECK(error_of("http://exam\tple.com/").find("whitespace") != std::string::npos);
    CHECK(error_of(std::string("http://example.com/\0", 20)).find("control") != std::string::npos);
    CHECK(error_of("http://example.com/\x7f").find("control") != std::string::npos);
    CHECK(error_of("http://example.com/\x1b[0m").find("control") != std::string::npos);
    CHECK(error_of("http://ex\xc3\xa4mple.com/").find("non-ASCII") != std::string::npos);
}

TEST_CASE("url: characters outside RFC 3986 in the path or query are refused") {
    CHECK(error_of("http://example.com/a|b").find("'|'") != std::string::npos);
    CHECK(error_of("http://example.com/a\"b").find("percent-encode") != std::string::npos);
    CHECK(error_of("http://example.com/{x}").find("percent-encode") != std::string::npos);
    CHECK(error_of("http://example.com/a\\b").find("backslash") != std::string::npos);
    CHECK(error_of("http://example.com/%").find("two hex digits") != std::string::npos);
    CHECK(error_of("http://example.com/%4").find("two hex digits") != std::string::npos);
    CHECK(error_of("http://example.com/%zz").find("two hex digits") != std::string::npos);
}
