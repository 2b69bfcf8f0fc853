#pragma once
// Parsing of webhook endpoint URLs (pure; no DNS).

#include <string>
#include <string_view>

namespace outboxd {

struct endpoint_url {
    std::string scheme;       // "http" or "https"
    std::string host;         // without brackets for IPv6 literals
    std::string port;         // always set: explicit, or 80 / 443 from the scheme
    std::string target;       // path + query, at least "/"
    std::string host_header;  // what goes into Host: (host[:port] when not default)

    [[nodiscard]] bool is_tls() const noexcept { return scheme == "https"; }
};

// Throws std::invalid_argument with a message that names what is wrong
// (unsupported scheme, missing host, bad port, userinfo present, fragment, ...).
// The message never repeats userinfo, which may hold credentials.
[[nodiscard]] endpoint_url parse_endpoint_url(std::string_view url);

// The URL for logs and printed configuration: a query string often carries a
// credential (?token=...), so it is shown as "?<redacted>".
[[nodiscard]] std::string loggable_url(const endpoint_url& url);

}  // namespace outboxd
