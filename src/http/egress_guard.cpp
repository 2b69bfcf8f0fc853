#include "http/egress_guard.hpp"

#include <cstddef>

#include <fmt/format.h>

#include "core/address_policy.hpp"

namespace outboxd::http {

std::string egress_refusal(const boost::asio::ip::address& address) {
    address_class const kind =
        address.is_v4() ? classify(address.to_v4().to_bytes()) : classify(address.to_v6().to_bytes());
    if (egress_allowed(kind)) return {};
    return fmt::format("{} ({})", address.to_string(), describe(kind));
}

screened_addresses screen_addresses(const std::vector<boost::asio::ip::address>& addresses, std::uint16_t port,
                                    bool guard) {
    screened_addresses out;
    std::size_t refused_count = 0;
    constexpr std::size_t refused_listed = 3;
    for (auto const& address : addresses) {
        std::string why;
        if (guard) why = egress_refusal(address);
        if (why.empty()) {
            out.allowed.emplace_back(address, port);
        } else if (++refused_count <= refused_listed) {
            out.refused += (out.refused.empty() ? "" : ", ") + why;
        }
    }
    if (refused_count > refused_listed) out.refused += fmt::format(", and {} more", refused_count - refused_listed);
    return out;
}

}  // namespace outboxd::http
