#pragma once
// A throwaway PKI for TLS tests, made in memory with OpenSSL when the test
// runs: a CA and server certificates it signs. Nothing is read from disk;
// temp_file writes a PEM where an API wants a path (a ca_file).

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>
#include <string_view>

namespace outboxd::test {

struct pem_identity {
    std::string certificate;  // PEM
    std::string private_key;  // PEM, unencrypted
};

class test_ca {
public:
    // A self-signed CA (ECDSA P-256, valid from an hour ago for a day).
    explicit test_ca(std::string_view common_name = "outboxd test CA");
    ~test_ca();
    test_ca(const test_ca&) = delete;
    test_ca& operator=(const test_ca&) = delete;

    // A server certificate signed by this CA for `subject_alt_names` in
    // OpenSSL's syntax, e.g. "DNS:localhost,IP:127.0.0.1".
    [[nodiscard]] pem_identity issue(std::string_view subject_alt_names);

    [[nodiscard]] const std::string& certificate_pem() const noexcept { return certificate_pem_; }

private:
    struct key_deleter {
        void operator()(EVP_PKEY* key) const noexcept;
    };
    struct cert_deleter {
        void operator()(X509* cert) const noexcept;
    };
    std::unique_ptr<EVP_PKEY, key_deleter> key_;
    std::unique_ptr<X509, cert_deleter> cert_;
    std::string certificate_pem_;
    long next_serial_ = 2;  // the CA itself is 1
};

// A file with the given contents in the temp directory, removed on destruction.
class temp_file {
public:
    explicit temp_file(std::string_view contents);
    ~temp_file();
    temp_file(const temp_file&) = delete;
    temp_file& operator=(const temp_file&) = delete;

    [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
};

}  // namespace outboxd::test
