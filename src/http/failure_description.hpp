#pragma once
// The one line a failed request attempt reports (response_summary::error,
// then the event's last_error and the logs): the step that failed, the
// destination and the cause. Pure: the connection gathers the facts, this
// words them, and a unit test pins every wording. It names the host and
// port, never a header value or a body.

#include <chrono>
#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>

namespace outboxd::http {

// The steps of an attempt, in order.
enum class attempt_stage { resolving, connecting, handshaking, writing, reading };

enum class failure_kind {
    closed,              // the client was closed or destroyed under the request
    timed_out,           // the stage ran out of time (budget)
    error,               // the network, TLS or the response parser failed (ec)
    lookup_failed,       // the name lookup found no address (detail: its reason)
    egress_refused,      // the egress guard refused every address (detail: "10.0.0.1 (private), ...")
    tls_setup_failed,    // SNI or the name to verify could not be set (detail: OpenSSL's reason)
    response_too_large,  // more than max_response_bytes read for the attempt
    connection_lost,     // a reused connection dropped before any response and a retry
                         // might outlive the attempt's deadline (ec)
    not_sent,            // the attempt's deadline passed before anything was written
};

struct attempt_failure {
    failure_kind kind = failure_kind::error;
    attempt_stage stage = attempt_stage::connecting;  // for timed_out and error
    boost::system::error_code ec{};                   // for error and connection_lost
    std::chrono::milliseconds budget{0};  // timed_out: the time the stage had...
    bool budget_cut = false;              // ...cut short by the attempt's deadline
    bool response_started = false;        // error while reading: part of a response was parsed
    long tls_verify_result = 0;           // error while handshaking: SSL_get_verify_result (0 = X509_V_OK)
    std::string_view detail{};            // see failure_kind
};

// The destination, as messages name it.
struct destination_facts {
    std::string_view host;       // as in the URL
    std::string_view authority;  // host:port, an IPv6 literal in brackets
    bool host_is_ip = false;     // no lookup: the host is the address
};

inline constexpr std::string_view client_closed = "client closed";

[[nodiscard]] std::string describe_failure(const attempt_failure& f, const destination_facts& to);

}  // namespace outboxd::http
