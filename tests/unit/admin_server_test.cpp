#include "http/admin_server.hpp"

#include <doctest/doctest.h>

#include <utility>  // before Asio

#include <string>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

// The admin listener on a real loopback socket (port 0), driven by a plain
// blocking client: exact status lines and headers.

using namespace outboxd;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

struct served {
    served() : server(ioc, parse_listen_address("127.0.0.1:0"), [this](std::string_view path) {
                          paths.emplace_back(path);
                          if (path == "/metrics") return http::admin_response{200, "text/plain; version=0.0.4", "m 1\n"};
                          return http::admin_response{404, "text/plain", "not found\n"};
                      }) {
        thread = std::thread([this] { ioc.run(); });
    }
    ~served() {
        net::post(ioc, [this] { server.stop(); });
        ioc.stop();
        thread.join();
    }
    net::io_context ioc;
    std::vector<std::string> paths;  // read only after the requests were answered
    http::admin_server server;
    std::thread thread;
};

tcp::socket connect_to(net::io_context& ioc, std::uint16_t port) {
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::address_v4::loopback(), port));
    return s;
}

// Sends `request` and reads until the server closes the connection.
std::string exchange(std::uint16_t port, const std::string& request) {
    net::io_context ioc;
    auto s = connect_to(ioc, port);
    net::write(s, net::buffer(request));
    std::string out;
    boost::system::error_code ec;
    net::read(s, net::dynamic_buffer(out), ec);
    return out;
}

}  // namespace

TEST_CASE("admin server: GET answers with the handler's status, type and body; the query string is not the path") {
    served srv;
    REQUIRE(srv.server.port() != 0);
    const auto r = exchange(srv.server.port(), "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK(r.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(r.find("Content-Type: text/plain; version=0.0.4\r\n") != std::string::npos);
    CHECK(r.find("Content-Length: 4\r\n") != std::string::npos);
    CHECK(r.ends_with("\r\n\r\nm 1\n"));
    CHECK(exchange(srv.server.port(), "GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 404"));
    CHECK(srv.paths == std::vector<std::string>{"/metrics", "/nope"});
}

TEST_CASE("admin server: HEAD has the headers and no body; other methods get 405 with Allow, unasked") {
    served srv;
    const auto head = exchange(srv.server.port(), "HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    CHECK(head.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(head.find("Content-Length: 4\r\n") != std::string::npos);
    CHECK(head.ends_with("\r\n\r\n"));
    const auto post = exchange(srv.server.port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    CHECK(post.starts_with("HTTP/1.1 405"));
    CHECK(post.find("Allow: GET, HEAD\r\n") != std::string::npos);
    CHECK(srv.paths == std::vector<std::string>{"/metrics"});
}

TEST_CASE("admin server: keep-alive serves several requests on one connection") {
    served srv;
    const auto r = exchange(srv.server.port(),
                            "GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    CHECK(r.find("HTTP/1.1 200 OK") == 0);
    CHECK(r.find("HTTP/1.1 200 OK", 10) != std::string::npos);
}

TEST_CASE("admin server: a request head over 8 KiB, or a body, is refused with 400 and the connection closed") {
    served srv;
    const auto big = exchange(srv.server.port(),
                              "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(9000, 'a') + "\r\n\r\n");
    CHECK(big.starts_with("HTTP/1.1 400"));
    const auto body = exchange(srv.server.port(), "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
    CHECK(body.starts_with("HTTP/1.1 400"));
}

TEST_CASE("admin server: connections beyond the limit are closed at once; the others are served") {
    served srv;
    net::io_context ioc;
    std::vector<tcp::socket> held;
    for (std::size_t i = 0; i < http::admin_server::max_connections; ++i) held.push_back(connect_to(ioc, srv.server.port()));
    // One request on the first proves they were all accepted before the next.
    net::write(held[0], net::buffer(std::string("GET /metrics HTTP/1.1\r\n\r\n")));
    std::string answer(17, '\0');
    net::read(held[0], net::buffer(answer));
    CHECK(answer == "HTTP/1.1 200 OK\r\n");
    auto extra = connect_to(ioc, srv.server.port());
    net::write(extra, net::buffer(std::string("GET /metrics HTTP/1.1\r\n\r\n")));
    std::string out;
    boost::system::error_code ec;
    net::read(extra, net::dynamic_buffer(out), ec);
    CHECK(out.empty());
    held.clear();
}

TEST_CASE("admin server: an address in use is an error at construction") {
    served srv;
    net::io_context ioc;
    CHECK_THROWS_AS(http::admin_server(ioc, parse_listen_address(fmt::format("127.0.0.1:{}", srv.server.port())),
                                       [](std::string_view) { return http::admin_response{}; }),
                    boost::system::system_error);
}
