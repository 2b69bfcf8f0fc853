#include "http/client_config.hpp"

#include <charconv>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

namespace outboxd::http {

client_config make_client_config(endpoint_url endpoint, client_options options) {
    client_config c;
    if (endpoint.host.empty()) throw std::invalid_argument("webhook endpoint has no host");
    unsigned port = 0;
    auto const* first = endpoint.port.data();
    auto const* last = first + endpoint.port.size();
    auto const [end, err] = std::from_chars(first, last, port);
    if (err != std::errc{} || end != last || port == 0 || port > 65535) {
        throw std::invalid_argument("webhook endpoint has an invalid port");
    }
    c.port = static_cast<std::uint16_t>(port);
    // push_back, not `= "/"`: GCC 12 -O3 reports a -Wrestrict false positive on that.
    if (endpoint.target.empty()) endpoint.target.push_back('/');
    if (options.max_connections == 0) options.max_connections = 1;

    boost::system::error_code ec;
    auto const address = boost::asio::ip::make_address(endpoint.host, ec);
    if (!ec) c.literal = address;
    c.authority = (address.is_v6() && !ec) ? fmt::format("[{}]:{}", endpoint.host, endpoint.port)
                                           : fmt::format("{}:{}", endpoint.host, endpoint.port);
    c.endpoint = std::move(endpoint);
    c.options = std::move(options);
    return c;
}

}  // namespace outboxd::http
