#pragma once
// The egress (SSRF) guard of block_private_addresses: every address is
// classified (core/address_policy) after resolution and right before
// connecting, and only global ones are handed to connect, so a name that
// resolves (or is re-bound) to an internal address is refused as well as an
// IP literal. The guard looks at the addresses, not at the name: DNS may
// point any name anywhere, and may change its answer between two
// connections (rebinding).

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <cstdint>
#include <string>
#include <vector>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace outboxd::http {

// "127.0.0.1 (loopback)" when the guard refuses `address`, else empty.
[[nodiscard]] std::string egress_refusal(const boost::asio::ip::address& address);

struct screened_addresses {
    std::vector<boost::asio::ip::tcp::endpoint> allowed;  // to connect to, in the lookup's order
    // The refused ones for the message: "10.0.0.1 (private), ::1 (loopback)",
    // the first three, then ", and N more".
    std::string refused;
};

// The addresses a connection may try (all of them when `guard` is off).
[[nodiscard]] screened_addresses screen_addresses(const std::vector<boost::asio::ip::address>& addresses,
                                                  std::uint16_t port, bool guard);

}  // namespace outboxd::http
