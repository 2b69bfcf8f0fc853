#pragma once
// Standard Webhooks v1 signatures (https://www.standardwebhooks.com):
//   webhook-signature: v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">
// Several secrets at once (key rotation) give space-separated signatures;
// receivers accept the request if any one verifies.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace outboxd {

// A signing key. Its bytes never reach a log: there is no way to print it.
class signing_secret {
public:
    // Parses "whsec_<base64>" (24 to 64 key bytes, as the specification
    // asks). Throws std::invalid_argument; the message never echoes the secret.
    [[nodiscard]] static signing_secret parse(std::string_view text);

    [[nodiscard]] const std::string& key() const noexcept { return key_; }

private:
    explicit signing_secret(std::string key) : key_(std::move(key)) {}
    std::string key_;
};

// Splits a space-separated list of secrets (for rotation) and parses each.
[[nodiscard]] std::vector<signing_secret> parse_signing_secrets(std::string_view text);

// The webhook-signature header value for one request.
[[nodiscard]] std::string sign_webhook(const std::vector<signing_secret>& secrets, std::string_view message_id,
                                       std::int64_t unix_seconds, std::string_view body);

[[nodiscard]] std::string base64_encode(std::string_view bytes);
// Throws std::invalid_argument on anything but canonical padded base64.
[[nodiscard]] std::string base64_decode(std::string_view text);

}  // namespace outboxd
