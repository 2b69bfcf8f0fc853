#pragma once
// The egress (SSRF) guard's rule: which IP addresses a webhook may be
// delivered to when block_private_addresses is on. Pure: bytes in, class out.
// The HTTP client applies it to every address DNS returns, right before it
// connects, so a public name that resolves to 127.0.0.1 is refused as well.

#include <array>
#include <string_view>

namespace outboxd {

using ipv4_bytes = std::array<unsigned char, 4>;   // network byte order
using ipv6_bytes = std::array<unsigned char, 16>;  // network byte order

enum class address_class {
    global,       // none of the below: the public Internet
    unspecified,  // 0.0.0.0/8, ::
    loopback,     // 127.0.0.0/8, ::1
    private_use,  // 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 (old site-local), 64:ff9b:1::/48
    shared,       // 100.64.0.0/10, carrier-grade NAT (RFC 6598)
    link_local,   // 169.254/16 (the cloud metadata service 169.254.169.254), fe80::/10
    multicast,    // 224.0.0.0/4, ff00::/8
    broadcast,    // 255.255.255.255
    reserved,     // not routed on the Internet: 240/4, documentation, benchmarking,
                  // IETF protocol assignments (192.0.0/24, 2001::/23), discard 100::/64
};

[[nodiscard]] address_class classify(const ipv4_bytes& address) noexcept;

// IPv6 forms that carry an IPv4 address are classified by that address, as
// that is where the packets end up: IPv4-mapped ::ffff:a.b.c.d (what a
// dual-stack socket reports), IPv4-compatible ::a.b.c.d, IPv4-translated
// ::ffff:0:a.b.c.d, NAT64 64:ff9b::/96 and 6to4 2002::/16.
[[nodiscard]] address_class classify(const ipv6_bytes& address) noexcept;

// Only global addresses may be connected to while the guard is on.
[[nodiscard]] constexpr bool egress_allowed(address_class c) noexcept { return c == address_class::global; }

// For messages: "loopback", "private", "link-local", "carrier-grade NAT", ...
[[nodiscard]] std::string_view describe(address_class c) noexcept;

}  // namespace outboxd
