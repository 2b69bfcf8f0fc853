// Address classes after the IANA special-purpose address registries
// (RFC 6890 and successors). The guard refuses everything that is not
// plainly on the public Internet: a webhook has no business reaching
// documentation or benchmarking ranges either, and refusing too much here
// costs an operator one flag, while allowing too much exposes internal
// services (the cloud metadata endpoint above all).

#include "core/address_policy.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace outboxd {
namespace {

struct ipv4_range {
    std::uint32_t network;
    unsigned bits;
    address_class kind;
};

constexpr std::uint32_t ipv4(std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d) noexcept {
    return (a << 24U) | (b << 16U) | (c << 8U) | d;
}

// First match wins: the broadcast address lies inside 240/4.
constexpr std::array<ipv4_range, 16> ipv4_ranges{{
    {ipv4(255, 255, 255, 255), 32, address_class::broadcast},
    {ipv4(0, 0, 0, 0), 8, address_class::unspecified},  // "this network"
    {ipv4(10, 0, 0, 0), 8, address_class::private_use},
    {ipv4(100, 64, 0, 0), 10, address_class::shared},
    {ipv4(127, 0, 0, 0), 8, address_class::loopback},
    {ipv4(169, 254, 0, 0), 16, address_class::link_local},
    {ipv4(172, 16, 0, 0), 12, address_class::private_use},
    {ipv4(192, 0, 0, 0), 24, address_class::reserved},  // IETF protocol assignments
    {ipv4(192, 0, 2, 0), 24, address_class::reserved},  // documentation (TEST-NET-1)
    {ipv4(192, 88, 99, 0), 24, address_class::reserved},  // former 6to4 relay anycast
    {ipv4(192, 168, 0, 0), 16, address_class::private_use},
    {ipv4(198, 18, 0, 0), 15, address_class::reserved},    // benchmarking
    {ipv4(198, 51, 100, 0), 24, address_class::reserved},  // documentation (TEST-NET-2)
    {ipv4(203, 0, 113, 0), 24, address_class::reserved},   // documentation (TEST-NET-3)
    {ipv4(224, 0, 0, 0), 4, address_class::multicast},
    {ipv4(240, 0, 0, 0), 4, address_class::reserved},  // former class E
}};

// IPv6 ranges are all at most /64, so eight prefix bytes are enough.
struct ipv6_range {
    std::array<unsigned char, 8> prefix;
    unsigned bits;
    address_class kind;
};

// Checked after the special forms ::, ::1 and those embedding IPv4.
constexpr std::array<ipv6_range, 9> ipv6_ranges{{
    {{0xfc, 0x00}, 7, address_class::private_use},  // unique local
    {{0xfe, 0x80}, 10, address_class::link_local},
    {{0xfe, 0xc0}, 10, address_class::private_use},  // site-local (deprecated, still routed inside sites)
    {{0xff, 0x00}, 8, address_class::multicast},
    {{0x00, 0x64, 0xff, 0x9b, 0x00, 0x01}, 48, address_class::private_use},  // local-use NAT64 (RFC 8215)
    {{0x01, 0x00, 0, 0, 0, 0, 0, 0}, 64, address_class::reserved},            // discard-only
    {{0x20, 0x01, 0x0d, 0xb8}, 32, address_class::reserved},                  // documentation
    {{0x3f, 0xff, 0x00}, 20, address_class::reserved},                        // documentation (RFC 9637)
    {{0x20, 0x01, 0x00}, 23, address_class::reserved},                        // IETF protocol assignments, Teredo
}};

bool has_prefix(const ipv6_bytes& a, const ipv6_range& r) noexcept {
    unsigned bits = r.bits;
    for (std::size_t i = 0; bits > 0; ++i) {
        unsigned const n = std::min(bits, 8U);
        auto const mask = static_cast<unsigned char>(0xffU << (8U - n));
        if ((a[i] & mask) != (r.prefix[i] & mask)) return false;
        bits -= n;
    }
    return true;
}

bool all_zero(const ipv6_bytes& a, std::size_t from, std::size_t to) noexcept {
    return std::all_of(a.begin() + static_cast<std::ptrdiff_t>(from), a.begin() + static_cast<std::ptrdiff_t>(to),
                       [](unsigned char b) { return b == 0; });
}

ipv4_bytes ipv4_at(const ipv6_bytes& a, std::size_t offset) noexcept {
    return {a[offset], a[offset + 1], a[offset + 2], a[offset + 3]};
}

// The IPv4 address an IPv6 address stands for, if it is one of the forms
// that carry one (see the header).
std::optional<ipv4_bytes> embedded_ipv4(const ipv6_bytes& a) noexcept {
    if (all_zero(a, 0, 10) && a[10] == 0xff && a[11] == 0xff) return ipv4_at(a, 12);  // ::ffff:a.b.c.d
    if (all_zero(a, 0, 12)) return ipv4_at(a, 12);                                      // ::a.b.c.d
    if (all_zero(a, 0, 8) && a[8] == 0xff && a[9] == 0xff && all_zero(a, 10, 12)) {
        return ipv4_at(a, 12);  // ::ffff:0:a.b.c.d
    }
    if (a[0] == 0x00 && a[1] == 0x64 && a[2] == 0xff && a[3] == 0x9b && all_zero(a, 4, 12)) {
        return ipv4_at(a, 12);  // 64:ff9b::a.b.c.d
    }
    if (a[0] == 0x20 && a[1] == 0x02) return ipv4_at(a, 2);  // 2002:aabb:ccdd::/48
    return std::nullopt;
}

}  // namespace

address_class classify(const ipv4_bytes& address) noexcept {
    std::uint32_t const a = ipv4(address[0], address[1], address[2], address[3]);
    for (ipv4_range const& r : ipv4_ranges) {
        std::uint32_t const mask = ~std::uint32_t{0} << (32U - r.bits);
        if ((a & mask) == r.network) return r.kind;
    }
    return address_class::global;
}

address_class classify(const ipv6_bytes& address) noexcept {
    if (all_zero(address, 0, 15)) {
        // ::1 and :: are not IPv4-compatible forms of 0.0.0.1 and 0.0.0.0.
        if (address[15] == 0) return address_class::unspecified;
        if (address[15] == 1) return address_class::loopback;
    }
    if (auto const v4 = embedded_ipv4(address)) return classify(*v4);
    for (ipv6_range const& r : ipv6_ranges) {
        if (has_prefix(address, r)) return r.kind;
    }
    return address_class::global;
}

std::string_view describe(address_class c) noexcept {
    switch (c) {
        case address_class::global:
            return "global";
        case address_class::unspecified:
            return "unspecified";
        case address_class::loopback:
            return "loopback";
        case address_class::private_use:
            return "private";
        case address_class::shared:
            return "carrier-grade NAT";
        case address_class::link_local:
            return "link-local";
        case address_class::multicast:
            return "multicast";
        case address_class::broadcast:
            return "broadcast";
        case address_class::reserved:
            return "reserved";
    }
    return "unknown";
}

}  // namespace outboxd
