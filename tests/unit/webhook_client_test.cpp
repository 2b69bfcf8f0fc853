// webhook_client against a real HTTP/1.1 server on 127.0.0.1 (port 0), run
// by the test on the same io_context as the client. Everything is
// single-threaded: tests advance the loop until an observable condition
// holds (run_until), never sleep, and use time only where time is the
// subject (the request timeout).

#include "http/webhook_client.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "webhook_client_test_support.hpp"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

using outboxd::endpoint_url;
using outboxd::parse_endpoint_url;
using outboxd::http::client_options;
using outboxd::http::outgoing_request;
using outboxd::http::response_summary;
using outboxd::http::webhook_client;
using outboxd::test::fast_options;
using outboxd::test::json;
using outboxd::test::post_and_wait;
using outboxd::test::result_slot;
using outboxd::test::run_until;
using outboxd::test::settle;

using test_request = http::request<http::string_body>;
using test_response = http::response<http::string_body>;

// What the server does with one request.
struct reply {
    enum class kind {
        respond,            // send `response`, keep the connection open
        respond_and_close,  // send `response`, then close the connection
        close,              // close the connection without answering
        hold,               // answer only when the test calls release_held()
        raw,                // write `raw` bytes, then close
        raw_keep,           // write `raw` bytes, keep the connection open
        raw_split_keep,     // write `raw` up to its blank line, pause, write the rest; keep open
        stream,             // write `raw`, then the server's stream_repeat until the client stops reading
    };
    kind what = kind::respond;
    test_response response;
    std::string raw;
};

test_response make_response(unsigned status, std::string body = {}) {
    test_response res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, "text/plain");
    res.body() = std::move(body);
    res.prepare_payload();
    return res;
}

reply respond(unsigned status, std::string body = {}) { return {reply::kind::respond, make_response(status, std::move(body)), {}}; }

// Loopback HTTP/1.1 server that records what it sees.
class test_server {
public:
    // (request, connection number from 1, request number on that connection from 0)
    using behaviour_fn = std::function<reply(const test_request&, int, int)>;

    explicit test_server(net::io_context& ioc) : acceptor_(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
        accept();
    }
    test_server(const test_server&) = delete;
    test_server& operator=(const test_server&) = delete;
    ~test_server() {
        beast::error_code ignored;
        acceptor_.close(ignored);
    }

    [[nodiscard]] std::string url(std::string_view path = "/hook") const {
        return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()) + std::string(path);
    }

    // Answers every held request with its stored reply.
    void release_held() {
        auto held = std::move(held_);
        held_.clear();
        for (auto& s : held) s->answer();
    }
    [[nodiscard]] std::size_t held() const noexcept { return held_.size(); }

    behaviour_fn behaviour = [](const test_request&, int, int) { return respond(200, "ok"); };
    int accepts = 0;   // TCP connections accepted
    int open = 0;      // connections currently open (as far as the server knows)
    int max_open = 0;  // highest `open` seen
    std::vector<test_request> seen;
    // kind::stream: bytes written (accepted by the kernel), and whether a
    // write failed because the client closed.
    static constexpr std::size_t stream_limit = 64 * 1024 * 1024;
    std::string stream_repeat;
    std::size_t streamed = 0;
    bool stream_ended = false;

private:
    struct session : std::enable_shared_from_this<session> {
        session(test_server& server, tcp::socket socket, int id)
            : server_(server), stream_(std::move(socket)), pause_(stream_.get_executor()), id_(id) {}

        void read() {
            request_ = {};
            http::async_read(stream_, buffer_, request_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
                self->on_read(ec);
            });
        }

        void on_read(beast::error_code ec) {
            if (ec) {
                shut();
                return;
            }
            server_.seen.push_back(request_);
            reply_ = server_.behaviour(request_, id_, served_++);
            if (reply_.what == reply::kind::hold) {
                server_.held_.push_back(shared_from_this());
                reply_.what = reply::kind::respond;
                return;
            }
            answer();
        }

        void answer() {
            switch (reply_.what) {
                case reply::kind::close:
                    shut();
                    return;
                case reply::kind::raw:
                    net::async_write(stream_, net::buffer(reply_.raw),
                                     [self = shared_from_this()](beast::error_code, std::size_t) { self->shut(); });
                    return;
                case reply::kind::raw_split_keep:
                    // The header now, the body in a later TCP segment: what
                    // servers that write headers and body separately do.
                    split_ = reply_.raw.find("\r\n\r\n") + 4;
                    net::async_write(stream_, net::buffer(reply_.raw.data(), split_),
                                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                                         if (ec) return self->shut();
                                         self->pause_.expires_after(20ms);
                                         self->pause_.async_wait([self](beast::error_code) {
                                             auto const tail = net::buffer(self->reply_.raw) + self->split_;
                                             net::async_write(self->stream_, tail,
                                                              [self](beast::error_code ec2, std::size_t) {
                                                                  if (ec2) return self->shut();
                                                                  self->read();
                                                              });
                                         });
                                     });
                    return;
                case reply::kind::stream:
                    // A small send buffer, so that what the server counts as
                    // written is close to what the client has read.
                    stream_.socket().set_option(net::socket_base::send_buffer_size(16 * 1024));
                    net::async_write(stream_, net::buffer(reply_.raw),
                                     [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                                         self->server_.streamed += n;
                                         if (ec) return self->shut();
                                         self->stream_more();
                                     });
                    return;
                case reply::kind::raw_keep:
                    net::async_write(stream_, net::buffer(reply_.raw),
                                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                                         if (ec) {
                                             self->shut();
                                         } else {
                                             self->read();
                                         }
                                     });
                    return;
                default:
                    http::async_write(stream_, reply_.response,
                                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                                          bool const keep = !ec && self->reply_.what == reply::kind::respond &&
                                                            self->reply_.response.keep_alive();
                                          if (keep) {
                                              self->read();
                                          } else {
                                              self->shut();
                                          }
                                      });
                    return;
            }
        }

        // Writes stream_repeat in 64 KiB slices until a write fails (the client
        // has closed) or stream_limit is reached (a safety bound for a
        // client that reads everything; the connection then closes).
        void stream_more() {
            if (server_.streamed >= test_server::stream_limit) return;
            if (slice_.empty()) {
                while (slice_.size() < 64 * 1024) slice_ += server_.stream_repeat;
            }
            net::async_write(stream_, net::buffer(slice_), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                self->server_.streamed += n;
                if (ec) {
                    self->server_.stream_ended = true;
                    return self->shut();
                }
                self->stream_more();
            });
        }

        void shut() {
            if (closed_) return;
            closed_ = true;
            --server_.open;
            beast::error_code ignored;
            stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
            stream_.close();
        }

        test_server& server_;
        beast::tcp_stream stream_;
        net::steady_timer pause_;
        std::size_t split_ = 0;
        std::string slice_;
        beast::flat_buffer buffer_;
        test_request request_;
        reply reply_;
        int id_;
        int served_ = 0;
        bool closed_ = false;
    };

    void accept() {
        acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
            if (ec) return;  // acceptor closed
            ++accepts;
            ++open;
            max_open = std::max(max_open, open);
            socket.set_option(tcp::no_delay(true));
            std::make_shared<session>(*this, std::move(socket), accepts)->read();
            accept();
        });
    }

    tcp::acceptor acceptor_;
    std::vector<std::shared_ptr<session>> held_;
};

}  // namespace

TEST_CASE("webhook_client: 200 with body excerpt; the request carries target, headers and body") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return respond(200, "accepted"); };
    webhook_client client(ioc, parse_endpoint_url(server.url("/hooks/orders?x=1")), fast_options());

    outgoing_request req = json(R"({"id":42})");
    req.headers = {{"webhook-id", "evt_42"}, {"X-Tenant", "a"}};
    response_summary const r = post_and_wait(ioc, client, std::move(req));

    CHECK_FALSE(r.transport_error);
    CHECK_FALSE(r.timed_out);
    CHECK(r.status == 200);
    CHECK(r.body_excerpt == "accepted");
    CHECK(r.error.empty());
    CHECK(r.retry_after.empty());
    CHECK(r.elapsed > 0us);

    REQUIRE(server.seen.size() == 1);
    test_request const& got = server.seen.front();
    CHECK(got.method() == http::verb::post);
    CHECK(got.target() == "/hooks/orders?x=1");
    CHECK(got.version() == 11);
    CHECK(got[http::field::host] == parse_endpoint_url(server.url()).host_header);
    CHECK(got[http::field::content_type] == "application/json");
    CHECK(got[http::field::user_agent] == "outboxd");
    CHECK(got[http::field::connection] == "keep-alive");
    CHECK(got[http::field::content_length] == "9");
    CHECK(got["webhook-id"] == "evt_42");
    CHECK(got["X-Tenant"] == "a");
    CHECK(got.body() == R"({"id":42})");
}

TEST_CASE("webhook_client: done is never called from inside post()") {
    net::io_context ioc;
    test_server server(ioc);
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    result_slot ok;
    client.post(json("{}"), ok.callback());
    CHECK(ok.calls == 0);
    CHECK(client.in_flight() == 1);

    // Refused up front (bad header) — still reported through the loop.
    result_slot bad;
    client.post(outgoing_request{"{}", {{"X-Evil", "a\r\nInjected: 1"}}}, bad.callback());
    CHECK(bad.calls == 0);

    REQUIRE(run_until(ioc, [&] { return ok.done() && bad.done(); }));
    CHECK(ok.value->status == 200);
    CHECK(bad.value->transport_error);
    CHECK(bad.value->error.find("X-Evil") != std::string::npos);
    CHECK(bad.value->error.find("Injected") == std::string::npos);  // values never in errors
    CHECK(server.seen.size() == 1);                                 // the bad one never left
    CHECK(client.in_flight() == 0);
}

TEST_CASE("webhook_client: an invalid header name is refused without sending anything") {
    net::io_context ioc;
    test_server server(ioc);
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());
    response_summary const r = post_and_wait(ioc, client, outgoing_request{"{}", {{"Bad Name", "v"}}});
    CHECK(r.transport_error);
    CHECK(r.error.find("invalid header name") != std::string::npos);
    CHECK(server.seen.empty());
}

TEST_CASE("webhook_client: host names are resolved (localhost)") {
    net::io_context ioc;
    test_server server(ioc);
    std::string url = server.url();
    url.replace(url.find("127.0.0.1"), 9, "localhost");
    webhook_client client(ioc, parse_endpoint_url(url), fast_options());
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.status == 200);
    REQUIRE(server.seen.size() == 1);
    CHECK(server.seen[0][http::field::host] == url.substr(7, url.find('/', 7) - 7));
}

TEST_CASE("webhook_client: bare canned responses (Content-Length: 0, 204) keep the connection") {
    net::io_context ioc;
    test_server server(ioc);
    int n = 0;
    server.behaviour = [&](const test_request&, int, int) {
        return reply{reply::kind::raw_keep, {},
                     n++ % 2 == 0 ? "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" : "HTTP/1.1 204 No Content\r\n\r\n"};
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());
    for (int i = 0; i < 4; ++i) {
        response_summary const r = post_and_wait(ioc, client, json("{}"));
        CAPTURE(r.error);
        CHECK(r.status == (i % 2 == 0 ? 200U : 204U));
        CHECK(r.body_excerpt.empty());
    }
    CHECK(server.accepts == 1);
}

TEST_CASE("webhook_client: an interim 1xx response is skipped") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) {
        return reply{reply::kind::raw, {},
                     "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                     "HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone"};
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 201);
    CHECK(r.body_excerpt == "done");
}

TEST_CASE("webhook_client: framing headers from the caller are ignored; Content-Type may be overridden") {
    net::io_context ioc;
    test_server server(ioc);
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    outgoing_request req = json("{}");
    req.headers = {{"Content-Length", "999"}, {"Host", "evil.example"}, {"Content-Type", "application/cloudevents+json"}};
    response_summary const r = post_and_wait(ioc, client, std::move(req));
    CHECK(r.status == 200);
    REQUIRE(server.seen.size() == 1);
    CHECK(server.seen[0][http::field::content_length] == "2");
    CHECK(server.seen[0][http::field::host] == parse_endpoint_url(server.url()).host_header);
    CHECK(server.seen[0][http::field::content_type] == "application/cloudevents+json");
    CHECK(server.seen[0].count(http::field::content_type) == 1);
}

TEST_CASE("webhook_client: 500 is reported with a truncated body excerpt, and the connection is reused") {
    net::io_context ioc;
    test_server server(ioc);
    std::string const body(100, 'x');
    server.behaviour = [&](const test_request&, int, int) { return respond(500, "0123456789abcdef" + body); };
    client_options o = fast_options();
    o.max_body_excerpt = 16;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 500);
    CHECK(r.body_excerpt == "0123456789abcdef");

    // The rest of the body was read and discarded, so the connection is reusable.
    CHECK(post_and_wait(ioc, client, json("{}")).status == 500);
    CHECK(server.accepts == 1);
}

TEST_CASE("webhook_client: a huge response body keeps the status and excerpt, then drops the connection") {
    net::io_context ioc;
    test_server server(ioc);
    int calls = 0;
    server.behaviour = [&](const test_request&, int, int) {
        return ++calls == 1 ? respond(502, "head" + std::string(3 * 1024 * 1024, 'z')) : respond(200, "ok");
    };
    client_options o = fast_options();
    o.max_body_excerpt = 8;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 502);
    CHECK(r.body_excerpt == "headzzzz");

    CHECK(post_and_wait(ioc, client, json("{}")).status == 200);
    CHECK(server.accepts == 2);  // the first connection was not reused
}

// A receiver that never stops sending costs a bounded read, whatever part
// of the response it stretches (Beast 1.74 itself limits neither chunk
// extensions nor trailers): the attempt fails promptly as a transport error.
// What the server managed to write is what the client read plus the
// kernel's socket buffers on both sides.
void check_endless_response(std::string prefix, std::string repeat) {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [&](const test_request&, int, int) { return reply{reply::kind::stream, {}, prefix}; };
    server.stream_repeat = std::move(repeat);
    client_options o = fast_options();
    o.request_timeout = 3s;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK_FALSE(r.timed_out);
    CHECK(r.status == 0);
    CHECK(r.error.find("too large") != std::string::npos);
    CHECK(r.elapsed < 2s);
    CHECK(run_until(ioc, [&] { return server.stream_ended; }, 2s));
    // What the server could write beyond what the client read sits in the
    // two sockets' kernel buffers, which autotune to several MiB on loopback
    // (once 5.0 MiB in all on a loaded machine): the point is that the client
    // stops far short of the 64 MiB the server would stream.
    constexpr std::size_t socket_buffers = 16 * 1024 * 1024;
    CAPTURE(server.streamed);
    CHECK(server.streamed < outboxd::http::max_response_bytes + socket_buffers);
}

TEST_CASE("webhook_client: an endless chunk extension is cut off, not buffered") {
    check_endless_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;x=", "a");
}

TEST_CASE("webhook_client: an endless trailer is cut off, not buffered") {
    check_endless_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n",
                           "X-Padding: padding-padding-padding\r\n");
}

TEST_CASE("webhook_client: endless chunk framing around a small body stops at max_response_bytes") {
    // 1 body byte per ~1 KiB on the wire: the 1 MiB body limit alone would
    // let a gigabyte through.
    check_endless_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                           "1;ext=" + std::string(1000, 'e') + "\r\nz\r\n");
}

TEST_CASE("webhook_client: endless interim 1xx responses stop at max_response_bytes") {
    check_endless_response("", "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n");
}

TEST_CASE("webhook_client: an endless response head is cut off") {
    check_endless_response("HTTP/1.1 200 OK\r\n", "X-Padding: padding-padding-padding\r\n");
}

TEST_CASE("webhook_client: Retry-After is captured raw") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) {
        reply r = respond(503, "busy");
        r.response.set(http::field::retry_after, "120");
        return r;
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.status == 503);
    CHECK(r.retry_after == "120");
    CHECK_FALSE(r.transport_error);
}

TEST_CASE("webhook_client: connection refused is a transport error naming the endpoint") {
    net::io_context ioc;
    // A port that was just free: bind, note, close.
    std::string url;
    {
        tcp::acceptor probe(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
        url = "http://127.0.0.1:" + std::to_string(probe.local_endpoint().port()) + "/";
    }
    webhook_client client(ioc, parse_endpoint_url(url), fast_options());
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CHECK_FALSE(r.timed_out);
    CHECK(r.status == 0);
    CAPTURE(r.error);
    CHECK(r.error.find("connect to 127.0.0.1:") == 0);
    CHECK(r.error.find("refused") != std::string::npos);
}

TEST_CASE("webhook_client: a server that never answers times out after request_timeout") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return reply{reply::kind::hold, {}, {}}; };
    client_options o = fast_options();
    o.request_timeout = 200ms;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CHECK(r.timed_out);
    CHECK(r.status == 0);
    CHECK(r.error.find("timeout after 200 ms waiting for response") == 0);
    CHECK(r.elapsed >= 200ms);
    CHECK(r.elapsed < 5s);
    CHECK(server.seen.size() == 1);  // a timeout is never retried
}

TEST_CASE("webhook_client: sequential requests reuse one keep-alive connection") {
    net::io_context ioc;
    test_server server(ioc);
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    for (int i = 0; i < 5; ++i) {
        CHECK(post_and_wait(ioc, client, json("{}")).status == 200);
    }
    CHECK(server.accepts == 1);
    CHECK(server.seen.size() == 5);
}

TEST_CASE("webhook_client: a body arriving in a later segment than its header is read, and the connection kept") {
    // Regression: Beast 1.74 with body_limit(boost::none) failed exactly this
    // case with "body limit exceeded" and dropped the connection.
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) {
        reply r;
        r.what = reply::kind::raw_split_keep;
        r.raw = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        return r;
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());
    for (int i = 0; i < 3; ++i) {
        auto const r = post_and_wait(ioc, client, json("{}"));
        CHECK_FALSE(r.transport_error);
        CHECK(r.status == 200);
        CHECK(r.body_excerpt == "ok");
    }
    CHECK(server.accepts == 1);
}

TEST_CASE("webhook_client: an idle connection outlives request_timeout") {
    // tcp_stream's deadline must not close a connection that sits idle in
    // the pool longer than request_timeout. Time is the subject here.
    net::io_context ioc;
    test_server server(ioc);
    client_options o = fast_options();
    o.request_timeout = 100ms;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    CHECK(post_and_wait(ioc, client, json("{}")).status == 200);
    net::steady_timer idle(ioc, 300ms);
    bool waited = false;
    idle.async_wait([&](beast::error_code) { waited = true; });
    REQUIRE(run_until(ioc, [&] { return waited; }));
    CHECK(post_and_wait(ioc, client, json("{}")).status == 200);
    CHECK(server.accepts == 1);
}

TEST_CASE("webhook_client: Connection: close and HTTP/1.0 responses end the connection") {
    net::io_context ioc;
    test_server server(ioc);
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    SUBCASE("Connection: close") {
        server.behaviour = [](const test_request&, int, int) {
            reply r = respond(200, "ok");
            r.response.keep_alive(false);
            return r;
        };
    }
    SUBCASE("HTTP/1.0, server keeps the socket open") {
        server.behaviour = [](const test_request&, int, int) {
            reply r = respond(200, "ok");
            r.response.version(10);
            r.response.set(http::field::connection, "keep-alive");
            return r;
        };
    }
    for (int i = 0; i < 3; ++i) {
        CHECK(post_and_wait(ioc, client, json("{}")).status == 200);
    }
    CHECK(server.accepts == 3);
}

TEST_CASE("webhook_client: a server closing an idle keep-alive connection costs nothing") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) {
        return reply{reply::kind::respond_and_close, make_response(200, "ok"), {}};
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    for (int i = 0; i < 3; ++i) {
        response_summary const r = post_and_wait(ioc, client, json("{}"));
        CHECK(r.status == 200);
        CHECK_FALSE(r.transport_error);
    }
    CHECK(server.accepts == 3);
}

TEST_CASE("webhook_client: a reused connection dropped under a request is retried once on a fresh one") {
    net::io_context ioc;
    test_server server(ioc);
    // Connection 1 answers its first request, then drops the connection on
    // reading the second (the race of a server closing an idle connection
    // just as a request goes out).
    server.behaviour = [](const test_request&, int connection, int index) {
        if (connection == 1 && index == 1) return reply{reply::kind::close, {}, {}};
        return respond(200, "ok");
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    CHECK(post_and_wait(ioc, client, json("first")).status == 200);
    response_summary const r = post_and_wait(ioc, client, json("second"));
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 200);
    CHECK(server.accepts == 2);
    REQUIRE(server.seen.size() == 3);
    CHECK(server.seen[1].body() == "second");
    CHECK(server.seen[2].body() == "second");  // the same request, sent again
}

TEST_CASE("webhook_client: the stale-connection retry happens once only") {
    net::io_context ioc;
    test_server server(ioc);
    int n = 0;
    server.behaviour = [&](const test_request&, int, int) {
        return n++ == 0 ? respond(200, "ok") : reply{reply::kind::close, {}, {}};
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    CHECK(post_and_wait(ioc, client, json("{}")).status == 200);
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CHECK_FALSE(r.timed_out);
    CAPTURE(r.error);
    CHECK(r.error.find("before any response") != std::string::npos);
    CHECK(server.accepts == 2);
    CHECK(server.seen.size() == 3);
}

TEST_CASE("webhook_client: a fresh connection closed without a response is not retried") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return reply{reply::kind::close, {}, {}}; };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CHECK(r.status == 0);
    CHECK(server.accepts == 1);
    CHECK(server.seen.size() == 1);
}

TEST_CASE("webhook_client: a malformed response is a transport error") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) {
        return reply{reply::kind::raw, {}, "SMTP ready\r\n\r\n"};
    };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CHECK(r.status == 0);
    CAPTURE(r.error);
    CHECK(r.error.find("malformed response from 127.0.0.1:") == 0);
}

TEST_CASE("webhook_client: more posts than max_connections wait for a connection and share the pool") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return reply{reply::kind::hold, make_response(200, "ok"), {}}; };
    client_options o = fast_options();
    o.max_connections = 3;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    constexpr int total = 10;
    std::vector<result_slot> slots(total);
    for (int i = 0; i < total; ++i) client.post(json(std::to_string(i)), slots[i].callback());
    CHECK(client.in_flight() == total);

    // The first three requests are on the wire and held by the server.
    REQUIRE(run_until(ioc, [&] { return server.held() == 3; }));
    CHECK(server.accepts == 3);
    std::vector<std::string> first;
    for (auto const& req : server.seen) first.push_back(req.body());
    std::sort(first.begin(), first.end());
    CHECK(first == std::vector<std::string>{"0", "1", "2"});
    CHECK(client.in_flight() == total);

    server.behaviour = [](const test_request&, int, int) { return respond(200, "ok"); };
    server.release_held();
    REQUIRE(run_until(ioc, [&] {
        return std::all_of(slots.begin(), slots.end(), [](const result_slot& s) { return s.done(); });
    }));
    for (auto const& s : slots) {
        CHECK(s.calls == 1);
        CHECK(s.value->status == 200);
    }
    CHECK(server.accepts == 3);
    CHECK(server.max_open == 3);
    CHECK(server.seen.size() == total);
    CHECK(client.in_flight() == 0);
}

TEST_CASE("webhook_client: posts queued behind a busy connection go out in the order they were posted") {
    // One connection: every post after the first waits in the queue, so the
    // order the server sees is the queue's order (LIFO would send 5 first).
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return respond(200, "ok"); };
    client_options o = fast_options();
    o.max_connections = 1;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    constexpr int total = 6;
    std::vector<result_slot> slots(total);
    for (int i = 0; i < total; ++i) client.post(json(std::to_string(i)), slots[i].callback());
    REQUIRE(run_until(ioc, [&] {
        return std::all_of(slots.begin(), slots.end(), [](const result_slot& s) { return s.done(); });
    }));
    std::vector<std::string> order;
    for (auto const& req : server.seen) order.push_back(req.body());
    CHECK(order == std::vector<std::string>{"0", "1", "2", "3", "4", "5"});
    CHECK(server.accepts == 1);
}

TEST_CASE("webhook_client: close() fails queued requests, lets the one on the wire finish") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return reply{reply::kind::hold, make_response(200, "ok"), {}}; };
    client_options o = fast_options();
    o.max_connections = 1;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    result_slot a;
    result_slot b;
    result_slot c;
    client.post(json("a"), a.callback());
    client.post(json("b"), b.callback());
    client.post(json("c"), c.callback());
    REQUIRE(run_until(ioc, [&] { return server.held() == 1; }));

    client.close();
    CHECK(client.in_flight() == 1);
    CHECK(b.calls == 0);  // failed through the loop, not synchronously
    REQUIRE(run_until(ioc, [&] { return b.done() && c.done(); }));
    for (result_slot const* s : {&b, &c}) {
        CHECK(s->value->transport_error);
        CHECK(s->value->status == 0);
        CHECK(s->value->error == "client closed");
    }
    CHECK_FALSE(a.done());

    result_slot late;
    client.post(json("late"), late.callback());
    CHECK(late.calls == 0);
    REQUIRE(run_until(ioc, [&] { return late.done(); }));
    CHECK(late.value->error == "client closed");

    server.release_held();
    REQUIRE(run_until(ioc, [&] { return a.done(); }));
    CHECK(a.value->status == 200);
    CHECK(a.calls == 1);
    // The connection is not kept after close(): the server sees it go.
    REQUIRE(run_until(ioc, [&] { return server.open == 0; }));
    CHECK(server.seen.size() == 1);
    CHECK(client.in_flight() == 0);
}

TEST_CASE("webhook_client: destroying the client with a request on the wire still calls done once") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return reply{reply::kind::hold, make_response(200, "ok"), {}}; };
    result_slot a;
    result_slot queued;
    {
        client_options o = fast_options();
        o.max_connections = 1;
        webhook_client client(ioc, parse_endpoint_url(server.url()), o);
        client.post(json("a"), a.callback());
        client.post(json("b"), queued.callback());
        REQUIRE(run_until(ioc, [&] { return server.held() == 1; }));
    }
    REQUIRE(run_until(ioc, [&] { return a.done() && queued.done(); }));
    CHECK(a.calls == 1);
    CHECK(a.value->transport_error);
    CHECK(a.value->error == "client closed");
    CHECK(queued.value->error == "client closed");
    server.release_held();  // writing to the aborted connection must not disturb anything
    REQUIRE(run_until(ioc, [&] { return server.open == 0; }));
    CHECK(a.calls == 1);
}

TEST_CASE("webhook_client: an https endpoint speaks TLS, never plain HTTP") {
    // More in webhook_client_tls_test.cpp; here: a plain server behind an
    // https URL never sees a request.
    net::io_context ioc;
    test_server server(ioc);
    std::string url = server.url();
    url.replace(0, 4, "https");
    webhook_client client(ioc, parse_endpoint_url(url), fast_options());
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CHECK(r.status == 0);
    CAPTURE(r.error);
    CHECK(r.error.find("TLS handshake with 127.0.0.1:") == 0);
    CHECK(server.seen.empty());
}

TEST_CASE("webhook_client: block_private_addresses refuses a loopback literal without connecting") {
    net::io_context ioc;
    test_server server(ioc);
    client_options o = fast_options();
    o.block_private_addresses = true;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    result_slot slot;
    client.post(json("{}"), slot.callback());
    CHECK(slot.calls == 0);  // refused through the loop, not inside post()
    REQUIRE(run_until(ioc, [&] { return slot.done(); }));
    response_summary const& r = *slot.value;
    CHECK(r.transport_error);
    CHECK_FALSE(r.timed_out);
    CHECK(r.status == 0);
    CHECK(r.error ==
          "refused to connect to 127.0.0.1 (loopback): egress to private addresses is blocked "
          "(block_private_addresses)");
    settle(ioc);
    CHECK(server.accepts == 0);

    // Refused every time, not only on the first connection.
    CHECK(post_and_wait(ioc, client, json("{}")).error == r.error);
    settle(ioc);
    CHECK(server.accepts == 0);
    CHECK(client.in_flight() == 0);
}

TEST_CASE("webhook_client: block_private_addresses judges a host name by the addresses it resolves to") {
    net::io_context ioc;
    test_server server(ioc);
    std::string url = server.url();
    url.replace(url.find("127.0.0.1"), 9, "localhost");
    client_options o = fast_options();
    o.block_private_addresses = true;
    webhook_client client(ioc, parse_endpoint_url(url), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK(r.transport_error);
    CAPTURE(r.error);
    CHECK(r.error.find("refused to connect to localhost at ") == 0);
    CHECK(r.error.find("(loopback)") != std::string::npos);
    CHECK(r.error.find("(block_private_addresses)") != std::string::npos);
    settle(ioc);
    CHECK(server.accepts == 0);
}

TEST_CASE("webhook_client: block_private_addresses refuses IPv6 and IPv4-mapped loopback literals") {
    // No server needed: nothing is ever connected to.
    net::io_context ioc;
    client_options o = fast_options();
    o.block_private_addresses = true;
    webhook_client v6(ioc, parse_endpoint_url("http://[::1]:9/"), o);
    CHECK(post_and_wait(ioc, v6, json("{}")).error.find("refused to connect to ::1 (loopback)") == 0);
    webhook_client mapped(ioc, parse_endpoint_url("http://[::ffff:169.254.169.254]:80/"), o);
    CHECK(post_and_wait(ioc, mapped, json("{}")).error.find("refused to connect to ::ffff:169.254.169.254 (link-local)") ==
          0);
}

TEST_CASE("webhook_client: without block_private_addresses a loopback server is reached") {
    net::io_context ioc;
    test_server server(ioc);
    client_options o = fast_options();
    CHECK_FALSE(o.block_private_addresses);  // off by default
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 200);
    CHECK(server.accepts == 1);
}

// ---- name lookups and the attempt's deadline ---------------------------

// A name lookup that sleeps, then answers 127.0.0.1. It runs on the
// client's lookup thread; it tells the test through the loop (a posted
// handler), so run_until sees it, and touches nothing after that post.
struct lookup_probe {
    bool started = false;   // set on the loop thread
    bool returned = false;  // set on the loop thread, after the lookup's last use of ioc
    std::atomic<int> calls{0};
};

outboxd::http::resolver_function slow_lookup(net::io_context& ioc, std::shared_ptr<lookup_probe> probe,
                                             std::chrono::milliseconds delay) {
    return [&ioc, probe, delay](const std::string&, const std::string&) {
        ++probe->calls;
        net::post(ioc, [probe] { probe->started = true; });
        std::this_thread::sleep_for(delay);  // the slow DNS server this test is about
        net::post(ioc, [probe] { probe->returned = true; });
        return outboxd::http::resolution{{net::ip::make_address("127.0.0.1")}, {}};
    };
}

std::string localhost_url(const test_server& server) {
    std::string url = server.url();
    url.replace(url.find("127.0.0.1"), 9, "localhost");
    return url;
}

outgoing_request json_by(std::string body, std::chrono::steady_clock::time_point deadline) {
    outgoing_request r = json(std::move(body));
    r.deadline = deadline;
    return r;
}

TEST_CASE("webhook_client: a lookup slower than connect_timeout fails at the deadline and never connects later") {
    net::io_context ioc;
    test_server server(ioc);
    auto probe = std::make_shared<lookup_probe>();
    client_options o = fast_options();
    o.connect_timeout = 300ms;
    o.resolve = slow_lookup(ioc, probe, 1500ms);
    webhook_client client(ioc, parse_endpoint_url(localhost_url(server)), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.timed_out);
    CHECK(r.error == "timeout after 300 ms resolving localhost");
    CHECK(r.elapsed >= 250ms);
    CHECK(r.elapsed < 1000ms);  // the lookup itself takes 1500 ms
    // The late answer is dropped: no connection, no request.
    REQUIRE(run_until(ioc, [&] { return probe->returned; }));
    CHECK_FALSE(run_until(ioc, [&] { return server.accepts > 0; }, 300ms));
    CHECK(server.seen.empty());
    CHECK(probe->calls == 1);
}

TEST_CASE("webhook_client: a slow lookup for one endpoint does not hold up another's") {
    net::io_context ioc;
    test_server slow_server(ioc);
    test_server fast_server(ioc);
    auto probe = std::make_shared<lookup_probe>();
    client_options slow_options = fast_options();
    slow_options.resolve = slow_lookup(ioc, probe, 1500ms);
    webhook_client slow(ioc, parse_endpoint_url(localhost_url(slow_server)), slow_options);
    webhook_client fast(ioc, parse_endpoint_url(localhost_url(fast_server)), fast_options());  // getaddrinfo

    result_slot slow_result;
    slow.post(json("slow"), slow_result.callback());
    REQUIRE(run_until(ioc, [&] { return probe->started; }));
    response_summary const r = post_and_wait(ioc, fast, json("fast"));
    CHECK(r.status == 200);
    CHECK(r.elapsed < 1000ms);
    CHECK_FALSE(slow_result.done());  // still resolving
    // Within connect_timeout, the slow lookup's answer is used.
    REQUIRE(run_until(ioc, [&] { return slow_result.done() && probe->returned; }));
    CHECK(slow_result.value->status == 200);
}

TEST_CASE("webhook_client: destroying the client during a lookup calls done once and drops the late answer") {
    net::io_context ioc;
    test_server server(ioc);
    auto probe = std::make_shared<lookup_probe>();
    client_options o = fast_options();
    o.resolve = slow_lookup(ioc, probe, 500ms);
    result_slot slot;
    {
        webhook_client client(ioc, parse_endpoint_url(localhost_url(server)), o);
        client.post(json("{}"), slot.callback());
        REQUIRE(run_until(ioc, [&] { return probe->started; }));
    }
    REQUIRE(run_until(ioc, [&] { return slot.done(); }));
    CHECK(slot.calls == 1);
    CHECK(slot.value->error == "client closed");
    REQUIRE(run_until(ioc, [&] { return probe->returned; }));
    CHECK_FALSE(run_until(ioc, [&] { return server.accepts > 0; }, 300ms));
}

TEST_CASE("webhook_client: a lookup ends at the request's deadline when that comes before connect_timeout") {
    net::io_context ioc;
    test_server server(ioc);
    auto probe = std::make_shared<lookup_probe>();
    client_options o = fast_options();  // connect_timeout 5 s
    o.resolve = slow_lookup(ioc, probe, 1000ms);
    webhook_client client(ioc, parse_endpoint_url(localhost_url(server)), o);

    response_summary const r =
        post_and_wait(ioc, client, json_by("{}", std::chrono::steady_clock::now() + 200ms));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.timed_out);
    CHECK(r.error.find("resolving localhost") != std::string::npos);
    CHECK(r.elapsed < 700ms);
    REQUIRE(run_until(ioc, [&] { return probe->returned; }));
    CHECK_FALSE(run_until(ioc, [&] { return server.accepts > 0; }, 300ms));
}

TEST_CASE("webhook_client: a request whose deadline has passed is not sent") {
    net::io_context ioc;
    test_server server(ioc);
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());

    SUBCASE("on a new connection") {
        response_summary const r = post_and_wait(ioc, client, json_by("{}", std::chrono::steady_clock::now()));
        CAPTURE(r.error);
        CHECK(r.transport_error);
        CHECK(r.error.find("not sent") != std::string::npos);
        settle(ioc);
        CHECK(server.accepts == 0);
    }
    SUBCASE("on a kept-alive connection") {
        CHECK(post_and_wait(ioc, client, json("first")).status == 200);
        response_summary const r = post_and_wait(ioc, client, json_by("late", std::chrono::steady_clock::now()));
        CAPTURE(r.error);
        CHECK(r.transport_error);
        CHECK(r.error.find("not sent") != std::string::npos);
        settle(ioc);
        CHECK(server.seen.size() == 1);
    }
}

TEST_CASE("webhook_client: the deadline cuts the wait for a response short") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int, int) { return reply{reply::kind::hold, make_response(200), {}}; };
    webhook_client client(ioc, parse_endpoint_url(server.url()), fast_options());  // request_timeout 5 s

    response_summary const r = post_and_wait(ioc, client, json_by("{}", std::chrono::steady_clock::now() + 300ms));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.timed_out);
    CHECK(r.error.find("waiting for response") != std::string::npos);
    CHECK(r.elapsed >= 250ms);
    CHECK(r.elapsed < 1000ms);
    server.release_held();
}

// The race of a server closing an idle keep-alive connection just as a
// request goes out (see "retried once on a fresh one" above), with the
// attempt's deadline near or far.
TEST_CASE("webhook_client: a reused connection dropped late in the attempt's budget is not retried") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int connection, int index) {
        if (connection == 1 && index == 1) return reply{reply::kind::close, {}, {}};
        return respond(200, "ok");
    };
    client_options o = fast_options();
    o.connect_timeout = 1s;
    o.request_timeout = 1s;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);
    CHECK(post_and_wait(ioc, client, json("first")).status == 200);

    // A fresh connect plus request would need up to 2 s; only 1.5 s are left.
    auto const deadline = std::chrono::steady_clock::now() + 1500ms;
    response_summary const r = post_and_wait(ioc, client, json_by("second", deadline));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.error.find("not retried") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() < deadline);
    CHECK_FALSE(run_until(ioc, [&] { return server.accepts > 1; }, 300ms));
    CHECK(server.seen.size() == 2);  // no second copy of "second"
}

TEST_CASE("webhook_client: a reused connection dropped early in the attempt's budget is retried as before") {
    net::io_context ioc;
    test_server server(ioc);
    server.behaviour = [](const test_request&, int connection, int index) {
        if (connection == 1 && index == 1) return reply{reply::kind::close, {}, {}};
        return respond(200, "ok");
    };
    client_options o = fast_options();
    o.connect_timeout = 1s;
    o.request_timeout = 1s;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);
    CHECK(post_and_wait(ioc, client, json("first")).status == 200);

    response_summary const r = post_and_wait(ioc, client, json_by("second", std::chrono::steady_clock::now() + 10s));
    CHECK(r.status == 200);
    CHECK(server.accepts == 2);
    REQUIRE(server.seen.size() == 3);
    CHECK(server.seen[2].body() == "second");
}
