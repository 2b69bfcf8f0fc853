#pragma once
// How a webhook destination's HTTPS server is authenticated: shared by the
// configuration (core/config.hpp) and the HTTP client (http/webhook_client.hpp).

#include <optional>
#include <string>

namespace outboxd {

struct tls_settings {
    bool verify = true;                   // false only when asked; logged loudly
    std::optional<std::string> ca_file;   // PEM bundle; default: the system CAs
};

}  // namespace outboxd
