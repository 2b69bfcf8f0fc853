#include "core/listen_address.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace outboxd;

TEST_CASE("listen address: IPv4, bracketed IPv6 and localhost with a port; loopback told apart") {
    const auto a = parse_listen_address("127.0.0.1:9187");
    CHECK(a.host == "127.0.0.1");
    CHECK(a.port == 9187);
    CHECK(a.loopback());
    const auto b = parse_listen_address("[::1]:0");
    CHECK(b.host == "::1");
    CHECK(b.port == 0);
    CHECK(b.loopback());
    CHECK(parse_listen_address("localhost:80").loopback());
    CHECK_FALSE(parse_listen_address("0.0.0.0:9187").loopback());
    CHECK_FALSE(parse_listen_address("[::]:9187").loopback());
    CHECK_FALSE(parse_listen_address("10.1.2.3:65535").loopback());
}

TEST_CASE("listen address: host names, missing or out-of-range ports and malformed hosts are refused") {
    for (const auto* bad : {"9187", ":9187", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                            "127.0.0.1:9x", "metrics.internal:9187", "256.0.0.1:1", "1.2.3:1", "::1:9187",
                            "[zz::1]:1", "[]:1"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS((void)parse_listen_address(bad), std::invalid_argument);
    }
}
