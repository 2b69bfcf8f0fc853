#include "core/listen_address.hpp"

#include <algorithm>
#include <stdexcept>

namespace outboxd {
namespace {

bool ipv4(std::string_view s) {
    int parts = 0;
    while (true) {
        const auto dot = s.find('.');
        const auto part = s.substr(0, dot);
        if (part.empty() || part.size() > 3 || !std::all_of(part.begin(), part.end(), [](char c) {
                return c >= '0' && c <= '9';
            })) {
            return false;
        }
        if (std::stoi(std::string(part)) > 255) return false;
        ++parts;
        if (dot == std::string_view::npos) break;
        s.remove_prefix(dot + 1);
    }
    return parts == 4;
}

bool ipv6(std::string_view s) {
    return s.find(':') != std::string_view::npos && std::all_of(s.begin(), s.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' ||
                      c == '.';
           });
}

}  // namespace

bool listen_address::loopback() const {
    return host == "localhost" || host == "::1" || host.starts_with("127.");
}

listen_address parse_listen_address(std::string_view text) {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw std::invalid_argument("expected HOST:PORT, e.g. 127.0.0.1:9187");
    auto host = text.substr(0, colon);
    const auto port = text.substr(colon + 1);
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(std::string(port)) > 65535) {
        throw std::invalid_argument("expected HOST:PORT with a port from 0 to 65535");
    }
    if (host.starts_with('[') && host.ends_with(']')) {
        host = host.substr(1, host.size() - 2);
        if (!ipv6(host)) throw std::invalid_argument("expected an IPv6 address between the brackets");
    } else if (host != "localhost" && !ipv4(host)) {
        throw std::invalid_argument(
            "expected an IPv4 address, an IPv6 address in brackets or localhost before the port (no host names)");
    }
    return {std::string(host), static_cast<std::uint16_t>(std::stoi(std::string(port)))};
}

}  // namespace outboxd
