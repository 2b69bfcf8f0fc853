#include "core/signing.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>

#include <fmt/format.h>

namespace outboxd {

std::string base64_encode(std::string_view bytes) {
    std::string out(4 * ((bytes.size() + 2) / 3), '\0');
    const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
    out.resize(static_cast<std::size_t>(n));
    return out;
}

std::string base64_decode(std::string_view text) {
    if (text.empty() || text.size() % 4 != 0) throw std::invalid_argument("not base64 (length is not a multiple of 4)");
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        const bool alphabet = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
                              c == '/';
        const bool padding = c == '=' && i >= text.size() - 2 && (i == text.size() - 1 || text.back() == '=');
        if (!alphabet && !padding) throw std::invalid_argument("not base64 (unexpected character)");
    }
    std::string out(3 * text.size() / 4, '\0');
    const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
    if (n < 0) throw std::invalid_argument("not base64");
    // EVP_DecodeBlock counts padding as zero bytes.
    std::size_t size = static_cast<std::size_t>(n);
    if (text.back() == '=') --size;
    if (text[text.size() - 2] == '=') --size;
    out.resize(size);
    return out;
}

signing_secret signing_secret::parse(std::string_view text) {
    static constexpr std::string_view prefix = "whsec_";
    if (!text.starts_with(prefix)) {
        throw std::invalid_argument("a signing secret starts with whsec_ followed by base64 (the Standard Webhooks form)");
    }
    std::string key;
    try {
        key = base64_decode(text.substr(prefix.size()));
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("signing secret after whsec_ is {}", e.what()));
    }
    if (key.size() < 24 || key.size() > 64) {
        throw std::invalid_argument(
            fmt::format("signing secret holds {} key bytes; Standard Webhooks asks for 24 to 64", key.size()));
    }
    return signing_secret(std::move(key));
}

std::vector<signing_secret> parse_signing_secrets(std::string_view text) {
    std::vector<signing_secret> out;
    std::size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && text[i] == ' ') ++i;
        const auto start = i;
        while (i < text.size() && text[i] != ' ') ++i;
        if (i > start) out.push_back(signing_secret::parse(text.substr(start, i - start)));
    }
    return out;
}

std::string sign_webhook(const std::vector<signing_secret>& secrets, std::string_view message_id,
                         std::int64_t unix_seconds, std::string_view body) {
    std::string signed_content;
    signed_content.reserve(message_id.size() + 24 + body.size());
    fmt::format_to(std::back_inserter(signed_content), "{}.{}.", message_id, unix_seconds);
    signed_content.append(body);
    std::string header;
    for (const auto& secret : secrets) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int mac_len = 0;
        HMAC(EVP_sha256(), secret.key().data(), static_cast<int>(secret.key().size()),
             reinterpret_cast<const unsigned char*>(signed_content.data()), signed_content.size(), mac, &mac_len);
        if (!header.empty()) header.push_back(' ');
        header += "v1,";
        header += base64_encode(std::string_view(reinterpret_cast<const char*>(mac), mac_len));
    }
    return header;
}

}  // namespace outboxd
