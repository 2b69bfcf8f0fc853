#pragma once
// Everything about a webhook client's endpoint that its connections need,
// checked and computed once when the client is made.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <cstdint>
#include <optional>
#include <string>

#include <boost/asio/ip/address.hpp>

#include "core/url.hpp"
#include "http/failure_description.hpp"
#include "http/webhook_client.hpp"

namespace outboxd::http {

struct client_config {
    endpoint_url endpoint;  // target "/" when the URL had none
    client_options options;  // max_connections at least 1
    std::string authority;  // host:port for messages, IPv6 in brackets
    std::optional<boost::asio::ip::address> literal;  // host is an IP address: no DNS lookup
    std::uint16_t port = 0;

    [[nodiscard]] destination_facts facts() const noexcept {
        return {endpoint.host, authority, literal.has_value()};
    }
};

// Throws std::invalid_argument for an endpoint without host or valid port.
[[nodiscard]] client_config make_client_config(endpoint_url endpoint, client_options options);

}  // namespace outboxd::http
