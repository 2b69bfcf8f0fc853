#include "http/egress_guard.hpp"

#include <doctest/doctest.h>

#include <vector>

namespace {

using boost::asio::ip::address;
using boost::asio::ip::make_address;
using outboxd::http::egress_refusal;
using outboxd::http::screen_addresses;

}  // namespace

TEST_CASE("egress_refusal: names the address and its class, or nothing for a global one") {
    CHECK(egress_refusal(make_address("127.0.0.1")) == "127.0.0.1 (loopback)");
    CHECK(egress_refusal(make_address("::ffff:169.254.169.254")) == "::ffff:169.254.169.254 (link-local)");
    CHECK(egress_refusal(make_address("93.184.215.14")).empty());
}

TEST_CASE("screen_addresses: keeps the global addresses in order, with the port") {
    std::vector<address> const found{make_address("10.0.0.1"), make_address("93.184.215.14"),
                                     make_address("2606:2800:21f:cb07:6820:80da:af6b:8b2c")};
    auto const s = screen_addresses(found, 8443, true);
    REQUIRE(s.allowed.size() == 2);
    CHECK(s.allowed[0].address() == found[1]);
    CHECK(s.allowed[1].address() == found[2]);
    CHECK(s.allowed[0].port() == 8443);
    CHECK(s.refused == "10.0.0.1 (private)");
}

TEST_CASE("screen_addresses: lists the first three refused, then how many more") {
    std::vector<address> const found{make_address("10.0.0.1"), make_address("::1"), make_address("192.168.1.1"),
                                     make_address("127.0.0.1"), make_address("172.16.0.1")};
    auto const s = screen_addresses(found, 80, true);
    CHECK(s.allowed.empty());
    CHECK(s.refused == "10.0.0.1 (private), ::1 (loopback), 192.168.1.1 (private), and 2 more");
}

TEST_CASE("screen_addresses: without the guard every address is tried") {
    std::vector<address> const found{make_address("127.0.0.1"), make_address("10.0.0.1")};
    auto const s = screen_addresses(found, 80, false);
    CHECK(s.allowed.size() == 2);
    CHECK(s.refused.empty());
}
