#pragma once
// The TLS side of the webhook client: the one ssl::context per client (trust
// store loaded once), the per-connection session setup (SNI and the name the
// certificate must match), and the wording of OpenSSL's errors.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <string>

#include <boost/asio/ssl/context.hpp>
#include <boost/system/error_code.hpp>
#include <openssl/ssl.h>

#include "core/tls_settings.hpp"

namespace outboxd::http {

// TLS 1.2 or later; the trust store is tls.ca_file alone when given, else
// the system's; the peer is verified unless tls.verify is false. Throws
// std::invalid_argument naming a CA file that cannot be loaded, and
// std::runtime_error when OpenSSL refuses the rest.
void configure_tls(boost::asio::ssl::context& context, const tls_settings& tls);

// Prepares a new session to `host` before its handshake: SNI for a DNS name
// (RFC 6066 forbids IP literals in it) and, when `verify`, the name or IP
// address the certificate must match. Returns OpenSSL's reason when that
// fails, else an empty string.
[[nodiscard]] std::string prepare_tls_session(SSL* session, const std::string& host, bool host_is_ip, bool verify);

// The newest OpenSSL error's reason, for messages (empty queue: a
// fallback); clears the thread's error queue.
[[nodiscard]] std::string openssl_reason();

// ec.message(), except for an OpenSSL error that wraps a system error
// (e.g. a CA file that cannot be opened), which OpenSSL 3 gives no reason
// string (Asio then says only "asio.ssl error"): that one gets strerror's.
// Pure.
[[nodiscard]] std::string describe_ssl_error(const boost::system::error_code& ec);

// Why a TLS handshake failed, e.g. "certificate verify failed (hostname
// mismatch)": OpenSSL's reason plus, for a rejected certificate, the
// verifier's own explanation (`verify_result`: SSL_get_verify_result of the
// session, X509_V_OK when there is none). Pure.
[[nodiscard]] std::string describe_handshake_error(const boost::system::error_code& ec, long verify_result);

}  // namespace outboxd::http
