#include "tls_test_pki.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <vector>

namespace outboxd::test {
namespace {

// Test setup either works or the test cannot run: any failure throws.
void require(bool ok, std::string_view what) {
    if (ok) return;
    char reason[256] = {};
    ERR_error_string_n(ERR_get_error(), reason, sizeof reason);
    throw std::runtime_error(std::string("test PKI: ") + std::string(what) + ": " + reason);
}

struct bio_deleter {
    void operator()(BIO* bio) const noexcept { BIO_free(bio); }
};

std::string to_pem(const std::function<int(BIO*)>& write) {
    std::unique_ptr<BIO, bio_deleter> const bio(BIO_new(BIO_s_mem()));
    require(bio != nullptr, "BIO_new");
    require(write(bio.get()) == 1, "PEM write");
    char* data = nullptr;
    long const n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<std::size_t>(n));
}

EVP_PKEY* new_key() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    require(key != nullptr, "EC key generation");
    return key;
}

void add_extension(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value);
    require(ext != nullptr, value);
    int const added = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    require(added == 1, "X509_add_ext");
}

// A certificate for `key`, named `common_name`, signed by issuer/issuer_key
// (itself when issuer is null).
X509* make_certificate(EVP_PKEY* key, std::string_view common_name, long serial, X509* issuer, EVP_PKEY* issuer_key,
                       std::string_view subject_alt_names) {
    X509* cert = X509_new();
    require(cert != nullptr, "X509_new");
    require(X509_set_version(cert, 2) == 1, "X509_set_version");  // v3
    require(ASN1_INTEGER_set(X509_get_serialNumber(cert), serial) == 1, "serial");
    require(X509_gmtime_adj(X509_getm_notBefore(cert), -3600) != nullptr, "notBefore");
    require(X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600) != nullptr, "notAfter");
    require(X509_set_pubkey(cert, key) == 1, "X509_set_pubkey");
    std::string const cn(common_name);
    X509_NAME* name = X509_get_subject_name(cert);
    require(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()),
                                       -1, -1, 0) == 1,
            "subject");
    require(X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name) == 1, "issuer");

    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert, cert, nullptr, nullptr, 0);
    if (issuer == nullptr) {
        add_extension(cert, &ctx, NID_basic_constraints, "critical,CA:TRUE");
        add_extension(cert, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
        std::string const san(subject_alt_names);
        add_extension(cert, &ctx, NID_basic_constraints, "critical,CA:FALSE");
        add_extension(cert, &ctx, NID_ext_key_usage, "serverAuth");
        add_extension(cert, &ctx, NID_subject_alt_name, san.c_str());
    }
    require(X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) > 0, "X509_sign");
    return cert;
}

}  // namespace

void test_ca::key_deleter::operator()(EVP_PKEY* key) const noexcept { EVP_PKEY_free(key); }
void test_ca::cert_deleter::operator()(X509* cert) const noexcept { X509_free(cert); }

test_ca::test_ca(std::string_view common_name) : key_(new_key()) {
    cert_.reset(make_certificate(key_.get(), common_name, 1, nullptr, nullptr, {}));
    certificate_pem_ = to_pem([this](BIO* bio) { return PEM_write_bio_X509(bio, cert_.get()); });
}

test_ca::~test_ca() = default;

pem_identity test_ca::issue(std::string_view subject_alt_names) {
    std::unique_ptr<EVP_PKEY, key_deleter> const key(new_key());
    std::unique_ptr<X509, cert_deleter> const cert(
        make_certificate(key.get(), "outboxd test server", next_serial_++, cert_.get(), key_.get(), subject_alt_names));
    pem_identity out;
    out.certificate = to_pem([&](BIO* bio) { return PEM_write_bio_X509(bio, cert.get()); });
    out.private_key = to_pem(
        [&](BIO* bio) { return PEM_write_bio_PrivateKey(bio, key.get(), nullptr, nullptr, 0, nullptr, nullptr); });
    return out;
}

temp_file::temp_file(std::string_view contents) {
    char const* dir = std::getenv("TMPDIR");
    std::string pattern = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/outboxd-test-XXXXXX";
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    int const fd = ::mkstemp(name.data());
    if (fd < 0) throw std::runtime_error("temp_file: mkstemp failed");
    path_ = name.data();
    auto const written = ::write(fd, contents.data(), contents.size());
    ::close(fd);
    if (written != static_cast<ssize_t>(contents.size())) {
        std::remove(path_.c_str());
        throw std::runtime_error("temp_file: short write");
    }
}

temp_file::~temp_file() { std::remove(path_.c_str()); }

}  // namespace outboxd::test
