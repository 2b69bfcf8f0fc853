#include "core/address_policy.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

using outboxd::address_class;
using outboxd::classify;
using outboxd::describe;
using outboxd::egress_allowed;
using outboxd::ipv4_bytes;
using outboxd::ipv6_bytes;

namespace {

// Classifies an address written as text (inet_pton does the parsing, so the
// table below reads like the registries it follows).
address_class class_of(const std::string& text) {
    ipv4_bytes v4{};
    if (inet_pton(AF_INET, text.c_str(), v4.data()) == 1) return classify(v4);
    ipv6_bytes v6{};
    REQUIRE_MESSAGE(inet_pton(AF_INET6, text.c_str(), v6.data()) == 1, text);
    return classify(v6);
}

void check_table(const std::vector<std::pair<std::string, address_class>>& table) {
    for (auto const& [text, expected] : table) {
        CAPTURE(text);
        CHECK(describe(class_of(text)) == describe(expected));
    }
}

}  // namespace

TEST_CASE("address_policy: IPv4 classes") {
    check_table({
        {"0.0.0.0", address_class::unspecified},
        {"0.255.255.255", address_class::unspecified},
        {"1.0.0.0", address_class::global},
        {"8.8.8.8", address_class::global},
        {"9.255.255.255", address_class::global},
        {"10.0.0.0", address_class::private_use},
        {"10.255.255.255", address_class::private_use},
        {"11.0.0.0", address_class::global},
        {"100.63.255.255", address_class::global},
        {"100.64.0.0", address_class::shared},
        {"100.127.255.255", address_class::shared},
        {"100.128.0.0", address_class::global},
        {"126.255.255.255", address_class::global},
        {"127.0.0.1", address_class::loopback},
        {"127.255.255.254", address_class::loopback},
        {"128.0.0.0", address_class::global},
        {"169.253.255.255", address_class::global},
        {"169.254.0.0", address_class::link_local},
        {"169.254.169.254", address_class::link_local},  // cloud metadata service
        {"169.255.0.0", address_class::global},
        {"172.15.255.255", address_class::global},
        {"172.16.0.0", address_class::private_use},
        {"172.31.255.255", address_class::private_use},
        {"172.32.0.0", address_class::global},
        {"192.0.0.8", address_class::reserved},
        {"192.0.1.1", address_class::global},
        {"192.0.2.1", address_class::reserved},
        {"192.88.99.1", address_class::reserved},
        {"192.167.255.255", address_class::global},
        {"192.168.0.0", address_class::private_use},
        {"192.168.255.255", address_class::private_use},
        {"192.169.0.0", address_class::global},
        {"198.17.255.255", address_class::global},
        {"198.18.0.0", address_class::reserved},
        {"198.19.255.255", address_class::reserved},
        {"198.20.0.0", address_class::global},
        {"198.51.100.7", address_class::reserved},
        {"203.0.113.7", address_class::reserved},
        {"223.255.255.255", address_class::global},
        {"224.0.0.1", address_class::multicast},
        {"239.255.255.255", address_class::multicast},
        {"240.0.0.1", address_class::reserved},
        {"255.255.255.254", address_class::reserved},
        {"255.255.255.255", address_class::broadcast},
    });
}

TEST_CASE("address_policy: IPv6 classes") {
    check_table({
        {"::", address_class::unspecified},
        {"::1", address_class::loopback},
        {"::2", address_class::unspecified},  // IPv4-compatible 0.0.0.2
        {"2606:4700::1111", address_class::global},
        {"2a00:1450:4001:82b::200e", address_class::global},
        {"fbff:ffff::1", address_class::global},
        {"fc00::", address_class::private_use},
        {"fd12:3456:789a::1", address_class::private_use},
        {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", address_class::private_use},
        {"fe00::1", address_class::global},
        {"fe80::1", address_class::link_local},
        {"febf:ffff::1", address_class::link_local},
        {"fec0::1", address_class::private_use},
        {"ff02::1", address_class::multicast},
        {"ff0e::101", address_class::multicast},
        {"100::1", address_class::reserved},
        {"100:0:0:1::1", address_class::global},
        {"2001:db8::1", address_class::reserved},
        {"2001:db9::1", address_class::global},
        {"2001::1", address_class::reserved},    // Teredo
        {"2001:1ff::1", address_class::reserved},
        {"2001:200::1", address_class::global},
        {"3fff::1", address_class::reserved},
        {"3fff:1000::1", address_class::global},
        {"64:ff9b:1::a00:1", address_class::private_use},
    });
}

TEST_CASE("address_policy: IPv6 forms that embed an IPv4 address take its class") {
    check_table({
        // IPv4-mapped: what a dual-stack socket reports for an IPv4 peer.
        {"::ffff:127.0.0.1", address_class::loopback},
        {"::ffff:10.1.2.3", address_class::private_use},
        {"::ffff:169.254.169.254", address_class::link_local},
        {"::ffff:0.0.0.0", address_class::unspecified},
        {"::ffff:100.64.0.1", address_class::shared},
        {"::ffff:255.255.255.255", address_class::broadcast},
        {"::ffff:8.8.8.8", address_class::global},
        // IPv4-compatible (deprecated, still parsed by everyone).
        {"::127.0.0.1", address_class::loopback},
        {"::192.168.1.1", address_class::private_use},
        {"::8.8.8.8", address_class::global},
        // IPv4-translated (SIIT).
        {"::ffff:0:127.0.0.1", address_class::loopback},
        {"::ffff:0:8.8.8.8", address_class::global},
        // NAT64 well-known prefix.
        {"64:ff9b::7f00:1", address_class::loopback},
        {"64:ff9b::a9fe:a9fe", address_class::link_local},
        {"64:ff9b::808:808", address_class::global},
        // 6to4.
        {"2002:7f00:1::1", address_class::loopback},
        {"2002:c0a8:101::1", address_class::private_use},
        {"2002:808:808::1", address_class::global},
    });
}

TEST_CASE("address_policy: only global addresses pass, and every class has a name") {
    for (auto c : {address_class::unspecified, address_class::loopback, address_class::private_use,
                   address_class::shared, address_class::link_local, address_class::multicast,
                   address_class::broadcast, address_class::reserved}) {
        CAPTURE(describe(c));
        CHECK_FALSE(egress_allowed(c));
        CHECK_FALSE(describe(c).empty());
        CHECK(describe(c) != describe(address_class::global));
    }
    CHECK(egress_allowed(address_class::global));
    CHECK(describe(address_class::loopback) == "loopback");
    CHECK(describe(address_class::private_use) == "private");
    CHECK(describe(address_class::link_local) == "link-local");
}
