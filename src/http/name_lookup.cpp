#include "http/name_lookup.hpp"

#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace outboxd::http {

namespace net = boost::asio;

resolution system_lookup(const std::string& host, const std::string& port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV;
    addrinfo* list = nullptr;
    resolution r;
    int const rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &list);
    if (rc != 0) {
        r.error = rc == EAI_SYSTEM ? std::system_category().message(errno) : ::gai_strerror(rc);
        return r;
    }
    for (addrinfo const* a = list; a != nullptr; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            net::ip::address_v4::bytes_type bytes{};
            std::memcpy(bytes.data(), &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, bytes.size());
            r.addresses.emplace_back(net::ip::address_v4(bytes));
        } else if (a->ai_family == AF_INET6) {
            auto const* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
            net::ip::address_v6::bytes_type bytes{};
            std::memcpy(bytes.data(), &in6->sin6_addr, bytes.size());
            r.addresses.emplace_back(net::ip::address_v6(bytes, in6->sin6_scope_id));
        }
    }
    ::freeaddrinfo(list);
    if (r.addresses.empty()) r.error = "no addresses";
    return r;
}

}  // namespace outboxd::http
