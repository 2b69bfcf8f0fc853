#include "http/tls_context.hpp"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <stdexcept>
#include <system_error>

#include <boost/asio/error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <fmt/format.h>

namespace outboxd::http {

namespace net = boost::asio;
namespace ssl = net::ssl;

void configure_tls(ssl::context& context, const tls_settings& tls) {
    // TLS 1.0 and 1.1 are deprecated (RFC 8996); webhook receivers all speak 1.2.
    if (SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION) != 1) {
        throw std::runtime_error(fmt::format("cannot require TLS 1.2: {}", openssl_reason()));
    }
    boost::system::error_code ec;
    if (tls.ca_file) {
        // Only this bundle is trusted: a private CA should not widen into
        // "private CA or any public one".
        context.load_verify_file(*tls.ca_file, ec);
        if (ec) {
            throw std::invalid_argument(
                fmt::format("cannot load the CA file '{}': {}", *tls.ca_file, describe_ssl_error(ec)));
        }
    } else {
        context.set_default_verify_paths(ec);
        if (ec) {
            throw std::runtime_error(fmt::format("cannot load the system CA certificates: {}", describe_ssl_error(ec)));
        }
    }
    context.set_verify_mode(tls.verify ? ssl::verify_peer : ssl::verify_none);
}

std::string prepare_tls_session(SSL* session, const std::string& host, bool host_is_ip, bool verify) {
    // SNI lets a server that hosts many names pick the certificate.
    if (!host_is_ip && SSL_set_tlsext_host_name(session, host.c_str()) != 1) return openssl_reason();
    if (!verify) return {};
    // OpenSSL checks the name (or IP address) during the handshake itself,
    // so a mismatch reports as "certificate verify failed (hostname
    // mismatch)". No partial wildcards ("w*.example.com"): RFC 6125
    // discourages them and browsers reject them.
    X509_VERIFY_PARAM* const param = SSL_get0_param(session);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    int const set = host_is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                               : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
    return set == 1 ? std::string() : openssl_reason();
}

std::string openssl_reason() {
    unsigned long const code = ERR_peek_last_error();
    ERR_clear_error();
    char const* reason = code == 0 ? nullptr : ERR_reason_error_string(code);
    return reason != nullptr ? reason : "unknown OpenSSL error";
}

std::string describe_ssl_error(const boost::system::error_code& ec) {
    if (ec.category() == net::error::get_ssl_category()) {
        auto const code = static_cast<unsigned long>(static_cast<unsigned int>(ec.value()));
        if (ERR_SYSTEM_ERROR(code)) return std::system_category().message(ERR_GET_REASON(code));
    }
    return ec.message();
}

std::string describe_handshake_error(const boost::system::error_code& ec, long verify_result) {
    if (ec.category() == net::error::get_ssl_category()) {
        std::string reason = describe_ssl_error(ec);
        auto const code = static_cast<unsigned long>(static_cast<unsigned int>(ec.value()));
        if (ERR_GET_REASON(code) == SSL_R_CERTIFICATE_VERIFY_FAILED && verify_result != X509_V_OK) {
            reason += fmt::format(" ({})", X509_verify_cert_error_string(verify_result));
        }
        return reason;
    }
    if (ec == ssl::error::stream_truncated || ec == net::error::eof) return "connection closed by the server";
    return describe_ssl_error(ec);
}

}  // namespace outboxd::http
