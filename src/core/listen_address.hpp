#pragma once
// The admin listener's address, "HOST:PORT": an IPv4 address, an IPv6
// address in brackets, or localhost; port 0 to 65535 (0: any free port,
// for tests). Parsed without I/O (no name lookup).

#include <cstdint>
#include <string>
#include <string_view>

namespace outboxd {

struct listen_address {
    std::string host;  // without brackets; "localhost" is kept as given
    std::uint16_t port = 0;
    // 127.0.0.0/8, ::1 or localhost: reachable from this machine only.
    [[nodiscard]] bool loopback() const;
};

// Throws std::invalid_argument with what is wrong (no quote of the input).
[[nodiscard]] listen_address parse_listen_address(std::string_view text);

}  // namespace outboxd
