#include "http/request_head.hpp"

#include <doctest/doctest.h>

using outboxd::header_list;
using outboxd::http::request_head;

TEST_CASE("request_head: request line, our fields, the caller's, then the length") {
    const header_list headers{{"webhook-id", "msg_1"}, {"X-Topic", "orders.created"}};
    CHECK(request_head({"/hooks?a=1", "example.com:8080", "outboxd/0.1"}, headers, 17) ==
          "POST /hooks?a=1 HTTP/1.1\r\n"
          "Host: example.com:8080\r\n"
          "User-Agent: outboxd/0.1\r\n"
          "Content-Type: application/json\r\n"
          "Connection: keep-alive\r\n"
          "webhook-id: msg_1\r\n"
          "X-Topic: orders.created\r\n"
          "Content-Length: 17\r\n"
          "\r\n");
}

TEST_CASE("request_head: a caller's Content-Type and User-Agent replace ours, the last one given wins") {
    const header_list headers{{"content-type", "text/plain"}, {"USER-AGENT", "mine/1"}, {"Content-Type", "application/cloudevents+json"}};
    CHECK(request_head({"/", "h", "outboxd/0.1"}, headers, 0) ==
          "POST / HTTP/1.1\r\n"
          "Host: h\r\n"
          "User-Agent: mine/1\r\n"
          "Content-Type: application/cloudevents+json\r\n"
          "Connection: keep-alive\r\n"
          "Content-Length: 0\r\n"
          "\r\n");
}

TEST_CASE("request_head: fields that frame the message or manage the connection are never the caller's") {
    const header_list headers{{"Host", "evil.example"},     {"content-length", "0"}, {"Transfer-Encoding", "chunked"},
                              {"Connection", "close"},      {"Keep-Alive", "timeout=1"}, {"Proxy-Connection", "x"},
                              {"TE", "trailers"},           {"Trailer", "x"},        {"Upgrade", "h2c"},
                              {"x-kept", "yes"}};
    CHECK(request_head({"/", "h", "ua"}, headers, 3) ==
          "POST / HTTP/1.1\r\n"
          "Host: h\r\n"
          "User-Agent: ua\r\n"
          "Content-Type: application/json\r\n"
          "Connection: keep-alive\r\n"
          "x-kept: yes\r\n"
          "Content-Length: 3\r\n"
          "\r\n");
}
