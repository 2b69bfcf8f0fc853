#include "http/failure_description.hpp"

#include <cstdlib>

#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <fmt/format.h>

#include "http/response_limits.hpp"
#include "http/tls_context.hpp"

namespace outboxd::http {
namespace {

namespace beast = boost::beast;

constexpr std::string_view egress_blocked = "egress to private addresses is blocked (block_private_addresses)";

// "300 ms", or "200 ms (the attempt's deadline)" when the request's own
// deadline came before the timeout.
std::string budget_text(const attempt_failure& f) {
    return f.budget_cut ? fmt::format("{} ms (the attempt's deadline)", f.budget.count())
                        : fmt::format("{} ms", f.budget.count());
}

std::string describe_timeout(const attempt_failure& f, const destination_facts& to) {
    switch (f.stage) {
        case attempt_stage::resolving:
            return fmt::format("timeout after {} resolving {}", budget_text(f), to.host);
        case attempt_stage::connecting:
            return fmt::format("timeout after {} connecting to {}", budget_text(f), to.authority);
        case attempt_stage::handshaking:
            return fmt::format("timeout after {} in TLS handshake with {}", budget_text(f), to.authority);
        case attempt_stage::writing:
            return fmt::format("timeout after {} sending request to {}", budget_text(f), to.authority);
        case attempt_stage::reading:
            return fmt::format("timeout after {} waiting for response from {}", budget_text(f), to.authority);
    }
    std::abort();  // a stage outside the enum: a bug
}

std::string describe_read_error(const attempt_failure& f, const destination_facts& to) {
    namespace http = beast::http;
    if (f.ec == http::error::header_limit) {
        return fmt::format("response from {} too large: head over {} bytes", to.authority, max_response_header);
    }
    if (f.ec == http::error::buffer_overflow) {
        return fmt::format("response from {} too large: a chunk-size line or trailers over {} bytes", to.authority,
                           max_unparsed);
    }
    if (f.ec == http::error::end_of_stream && !f.response_started) {
        return fmt::format("connection closed by {} before any response", to.authority);
    }
    if (f.ec.category() == http::make_error_code(http::error::end_of_stream).category()) {
        return fmt::format("malformed response from {}: {}", to.authority, f.ec.message());
    }
    return fmt::format("read response from {}: {}", to.authority, f.ec.message());
}

std::string describe_error(const attempt_failure& f, const destination_facts& to) {
    switch (f.stage) {
        case attempt_stage::resolving:
            return fmt::format("resolve {}: {}", to.host, f.ec.message());
        case attempt_stage::connecting:
            return fmt::format("connect to {}: {}", to.authority, f.ec.message());
        case attempt_stage::handshaking:
            return fmt::format("TLS handshake with {} failed: {}", to.authority,
                               describe_handshake_error(f.ec, f.tls_verify_result));
        case attempt_stage::writing:
            return fmt::format("send request to {}: {}", to.authority, f.ec.message());
        case attempt_stage::reading:
            return describe_read_error(f, to);
    }
    std::abort();  // a stage outside the enum: a bug
}

}  // namespace

std::string describe_failure(const attempt_failure& f, const destination_facts& to) {
    switch (f.kind) {
        case failure_kind::closed:
            return std::string(client_closed);
        case failure_kind::timed_out:
            return describe_timeout(f, to);
        case failure_kind::error:
            return describe_error(f, to);
        case failure_kind::lookup_failed:
            return fmt::format("resolve {}: {}", to.host, f.detail);
        case failure_kind::egress_refused:
            // An IP literal's refusal names the address already.
            return to.host_is_ip ? fmt::format("refused to connect to {}: {}", f.detail, egress_blocked)
                                 : fmt::format("refused to connect to {} at {}: {}", to.host, f.detail, egress_blocked);
        case failure_kind::tls_setup_failed:
            return fmt::format("TLS setup for {} failed: {}", to.authority, f.detail);
        case failure_kind::response_too_large:
            return fmt::format("response from {} too large: over {} bytes read", to.authority, max_response_bytes);
        case failure_kind::connection_lost:
            return fmt::format("connection to {} lost before any response ({}); not retried on a new connection, "
                               "which might outlive the attempt's deadline",
                               to.authority, f.ec.message());
        case failure_kind::not_sent:
            return fmt::format("request to {} not sent: the attempt's deadline had passed", to.authority);
    }
    std::abort();  // a kind outside the enum: a bug
}

}  // namespace outboxd::http
