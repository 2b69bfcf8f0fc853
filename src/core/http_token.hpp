#pragma once
// What an HTTP header name may be: an RFC 9110 token. One rule for the
// configuration's static headers, an event's headers and the client's last
// check before it writes a request.

#include <string_view>

namespace outboxd {

// 1 or more of A-Z a-z 0-9 ! # $ % & ' * + - . ^ _ ` | ~ (ASCII only).
[[nodiscard]] bool is_http_token(std::string_view s) noexcept;

}  // namespace outboxd
