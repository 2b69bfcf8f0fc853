// describe_failure: one case per wording, exact strings (these lines end up
// in last_error, dead letters and logs, where operators search for them).

#include "http/failure_description.hpp"

#include <doctest/doctest.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <cerrno>
#include <chrono>
#include <string>

#include <boost/asio/error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>

namespace {

using namespace std::chrono_literals;
using outboxd::http::attempt_failure;
using outboxd::http::attempt_stage;
using outboxd::http::describe_failure;
using outboxd::http::destination_facts;
using outboxd::http::failure_kind;
namespace net = boost::asio;
namespace http = boost::beast::http;
using error_code = boost::system::error_code;

const destination_facts named{"hooks.example.com", "hooks.example.com:443", false};
const destination_facts literal{"10.0.0.7", "10.0.0.7:8080", true};

attempt_failure error_at(attempt_stage stage, error_code ec) {
    return {.kind = failure_kind::error, .stage = stage, .ec = ec};
}

// An OpenSSL error as Asio reports it from a handshake. OpenSSL's reason
// strings are loaded with libssl (the client's ssl::context does that; a
// test run without a TLS test before this one has none yet).
error_code ssl_error(int reason) {
    OPENSSL_init_ssl(OPENSSL_INIT_LOAD_SSL_STRINGS | OPENSSL_INIT_LOAD_CRYPTO_STRINGS, nullptr);
    return {static_cast<int>(ERR_PACK(ERR_LIB_SSL, 0, reason)), net::error::get_ssl_category()};
}

}  // namespace

TEST_CASE("describe_failure: a closed client says only that") {
    CHECK(describe_failure({.kind = failure_kind::closed, .ec = net::error::operation_aborted}, named) ==
          "client closed");
}

TEST_CASE("describe_failure: a timeout names the step, its budget and the destination") {
    auto timeout_at = [](attempt_stage stage) {
        return attempt_failure{.kind = failure_kind::timed_out, .stage = stage, .budget = 300ms};
    };
    CHECK(describe_failure(timeout_at(attempt_stage::resolving), named) ==
          "timeout after 300 ms resolving hooks.example.com");
    CHECK(describe_failure(timeout_at(attempt_stage::connecting), named) ==
          "timeout after 300 ms connecting to hooks.example.com:443");
    CHECK(describe_failure(timeout_at(attempt_stage::handshaking), named) ==
          "timeout after 300 ms in TLS handshake with hooks.example.com:443");
    CHECK(describe_failure(timeout_at(attempt_stage::writing), named) ==
          "timeout after 300 ms sending request to hooks.example.com:443");
    CHECK(describe_failure(timeout_at(attempt_stage::reading), named) ==
          "timeout after 300 ms waiting for response from hooks.example.com:443");
}

TEST_CASE("describe_failure: a budget cut short by the attempt's deadline says so") {
    attempt_failure const f{
        .kind = failure_kind::timed_out, .stage = attempt_stage::reading, .budget = 200ms, .budget_cut = true};
    CHECK(describe_failure(f, named) ==
          "timeout after 200 ms (the attempt's deadline) waiting for response from hooks.example.com:443");
}

TEST_CASE("describe_failure: errors while resolving, connecting and writing carry the system's message") {
    CHECK(describe_failure(error_at(attempt_stage::resolving, net::error::host_not_found), named) ==
          "resolve hooks.example.com: Host not found (authoritative)");
    CHECK(describe_failure(error_at(attempt_stage::connecting, net::error::connection_refused), literal) ==
          "connect to 10.0.0.7:8080: Connection refused");
    CHECK(describe_failure(error_at(attempt_stage::writing, net::error::broken_pipe), named) ==
          "send request to hooks.example.com:443: Broken pipe");
}

TEST_CASE("describe_failure: a rejected certificate gives the verifier's reason") {
    attempt_failure f = error_at(attempt_stage::handshaking, ssl_error(SSL_R_CERTIFICATE_VERIFY_FAILED));
    f.tls_verify_result = X509_V_ERR_HOSTNAME_MISMATCH;
    CHECK(describe_failure(f, named) ==
          "TLS handshake with hooks.example.com:443 failed: certificate verify failed (hostname mismatch)");
    f.tls_verify_result = X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT;
    CHECK(describe_failure(f, named) ==
          "TLS handshake with hooks.example.com:443 failed: certificate verify failed (self-signed certificate)");
    f.tls_verify_result = X509_V_OK;  // nothing more to say
    CHECK(describe_failure(f, named) == "TLS handshake with hooks.example.com:443 failed: certificate verify failed");
}

TEST_CASE("describe_failure: other TLS handshake failures") {
    // Another OpenSSL reason: OpenSSL's words, no verifier's reason even if one is set.
    attempt_failure f = error_at(attempt_stage::handshaking, ssl_error(SSL_R_WRONG_VERSION_NUMBER));
    f.tls_verify_result = X509_V_ERR_HOSTNAME_MISMATCH;
    CHECK(describe_failure(f, named) == "TLS handshake with hooks.example.com:443 failed: wrong version number");
    // A system error wrapped by OpenSSL has no reason string of its own.
    error_code const wrapped{static_cast<int>(ERR_SYSTEM_FLAG | ECONNRESET), net::error::get_ssl_category()};
    CHECK(describe_failure(error_at(attempt_stage::handshaking, wrapped), named) ==
          "TLS handshake with hooks.example.com:443 failed: Connection reset by peer");
    // The server hung up mid-handshake, with or without a close_notify.
    CHECK(describe_failure(error_at(attempt_stage::handshaking, net::ssl::error::stream_truncated), named) ==
          "TLS handshake with hooks.example.com:443 failed: connection closed by the server");
    CHECK(describe_failure(error_at(attempt_stage::handshaking, net::error::eof), named) ==
          "TLS handshake with hooks.example.com:443 failed: connection closed by the server");
    CHECK(describe_failure(error_at(attempt_stage::handshaking, net::error::connection_reset), named) ==
          "TLS handshake with hooks.example.com:443 failed: Connection reset by peer");
}

TEST_CASE("describe_failure: errors while reading a response") {
    CHECK(describe_failure(error_at(attempt_stage::reading, http::error::header_limit), named) ==
          "response from hooks.example.com:443 too large: head over 65536 bytes");
    CHECK(describe_failure(error_at(attempt_stage::reading, http::error::buffer_overflow), named) ==
          "response from hooks.example.com:443 too large: a chunk-size line or trailers over 81920 bytes");
    CHECK(describe_failure(error_at(attempt_stage::reading, http::error::end_of_stream), named) ==
          "connection closed by hooks.example.com:443 before any response");
    attempt_failure cut_off = error_at(attempt_stage::reading, http::error::end_of_stream);
    cut_off.response_started = true;
    CHECK(describe_failure(cut_off, named) == "malformed response from hooks.example.com:443: end of stream");
    CHECK(describe_failure(error_at(attempt_stage::reading, http::error::bad_version), named) ==
          "malformed response from hooks.example.com:443: bad version");
    CHECK(describe_failure(error_at(attempt_stage::reading, net::error::connection_reset), named) ==
          "read response from hooks.example.com:443: Connection reset by peer");
}

TEST_CASE("describe_failure: failures the client finds itself") {
    CHECK(describe_failure({.kind = failure_kind::lookup_failed, .detail = "Name or service not known"}, named) ==
          "resolve hooks.example.com: Name or service not known");
    CHECK(describe_failure({.kind = failure_kind::tls_setup_failed, .detail = "invalid argument"}, named) ==
          "TLS setup for hooks.example.com:443 failed: invalid argument");
    CHECK(describe_failure({.kind = failure_kind::response_too_large}, named) ==
          "response from hooks.example.com:443 too large: over 4194304 bytes read");
    CHECK(describe_failure({.kind = failure_kind::connection_lost, .ec = net::error::connection_reset}, named) ==
          "connection to hooks.example.com:443 lost before any response (Connection reset by peer); not retried "
          "on a new connection, which might outlive the attempt's deadline");
    CHECK(describe_failure({.kind = failure_kind::not_sent}, named) ==
          "request to hooks.example.com:443 not sent: the attempt's deadline had passed");
}

TEST_CASE("describe_failure: the egress guard names what it refused, and a host name as well") {
    CHECK(describe_failure({.kind = failure_kind::egress_refused, .detail = "10.0.0.7 (private)"}, literal) ==
          "refused to connect to 10.0.0.7 (private): egress to private addresses is blocked "
          "(block_private_addresses)");
    CHECK(describe_failure({.kind = failure_kind::egress_refused, .detail = "127.0.0.1 (loopback)"}, named) ==
          "refused to connect to hooks.example.com at 127.0.0.1 (loopback): egress to private addresses is "
          "blocked (block_private_addresses)");
}
