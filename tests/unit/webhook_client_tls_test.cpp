// webhook_client over HTTPS against a real TLS server on 127.0.0.1 (port
// 0), run by the test on the same io_context as the client, with a CA and
// server certificates made in memory when the test runs (tls_test_pki).
// Single-threaded like webhook_client_test.cpp: the loop is advanced until
// an observable condition holds; time is used only where it is the subject
// (the handshake deadline).

#include "http/webhook_client.hpp"

#include <doctest/doctest.h>

#include <openssl/ssl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "tls_test_pki.hpp"
#include "webhook_client_test_support.hpp"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

using outboxd::parse_endpoint_url;
using outboxd::http::client_options;
using outboxd::http::response_summary;
using outboxd::http::webhook_client;
using outboxd::test::fast_options;
using outboxd::test::json;
using outboxd::test::pem_identity;
using outboxd::test::post_and_wait;
using outboxd::test::run_until;
using outboxd::test::temp_file;
using outboxd::test::test_ca;

using test_request = http::request<http::string_body>;
using test_response = http::response<http::string_body>;

// Loopback HTTPS/1.1 server that answers 200 "ok" and records what it sees.
class tls_server {
public:
    // What the server does after reading a request.
    enum class action {
        respond,                    // answer, keep the connection
        respond_then_close,         // answer, then close TCP without a close_notify
        respond_then_close_notify,  // answer, then send a close_notify and close
        respond_then_ticket,        // answer, then send a TLS 1.3 session ticket; keep the connection
        respond_then_unsolicited,   // answer, then send a second, unasked-for response; keep the connection
        close,                      // close TCP without answering
    };
    // (connection number from 1, request number on that connection from 0)
    using behaviour_fn = std::function<action(int, int)>;

    tls_server(net::io_context& ioc, const pem_identity& identity,
               const std::function<void(ssl::context&)>& configure = {})
        : context_(ssl::context::tls_server), acceptor_(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
        context_.use_certificate_chain(net::buffer(identity.certificate));
        context_.use_private_key(net::buffer(identity.private_key), ssl::context::pem);
        if (configure) configure(context_);
        accept();
    }
    tls_server(const tls_server&) = delete;
    tls_server& operator=(const tls_server&) = delete;
    ~tls_server() {
        beast::error_code ignored;
        acceptor_.close(ignored);
    }

    [[nodiscard]] std::string url(std::string_view host = "127.0.0.1") const {
        return "https://" + std::string(host) + ":" + std::to_string(port()) + "/hook";
    }
    [[nodiscard]] tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }
    [[nodiscard]] unsigned short port() const { return acceptor_.local_endpoint().port(); }

    behaviour_fn behaviour = [](int, int) { return action::respond; };
    int accepts = 0;            // TCP connections accepted
    int handshakes = 0;         // TLS handshakes completed
    int failed_handshakes = 0;  // TLS handshakes that failed
    int open = 0;               // connections currently open (as far as the server knows)
    int extras_sent = 0;        // tickets and unsolicited responses written
    std::vector<test_request> seen;

private:
    struct session : std::enable_shared_from_this<session> {
        session(tls_server& server, tcp::socket socket, int id)
            : server_(server), stream_(std::move(socket), server.context_), id_(id) {}

        void start() {
            beast::get_lowest_layer(stream_).expires_after(10s);
            stream_.async_handshake(ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
                beast::get_lowest_layer(self->stream_).expires_never();
                if (ec) {
                    ++self->server_.failed_handshakes;
                    self->shut();
                    return;
                }
                ++self->server_.handshakes;
                self->read();
            });
        }

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
            action const what = server_.behaviour(id_, served_++);
            if (what == action::close) {
                shut();
                return;
            }
            response_ = test_response{http::status::ok, 11};
            response_.body() = "ok";
            response_.prepare_payload();
            http::async_write(stream_, response_,
                              [self = shared_from_this(), what](beast::error_code ec2, std::size_t) {
                                  if (ec2 || what == action::respond_then_close) {
                                      self->shut();
                                  } else if (what == action::respond_then_close_notify) {
                                      self->close_notify();
                                  } else if (what == action::respond_then_ticket) {
                                      self->send_ticket();
                                  } else if (what == action::respond_then_unsolicited) {
                                      self->send_unsolicited();
                                  } else {
                                      self->read();
                                  }
                              });
        }

        // A new session ticket goes out with the next handshake step; on an
        // established connection that step writes just the ticket.
        void send_ticket() {
            REQUIRE(SSL_new_session_ticket(stream_.native_handle()) == 1);
            stream_.async_handshake(ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
                if (ec) return self->shut();
                ++self->server_.extras_sent;
                self->read();
            });
        }

        void send_unsolicited() {
            net::async_write(stream_, net::buffer(unsolicited),
                             [self = shared_from_this()](beast::error_code ec, std::size_t) {
                                 if (ec) return self->shut();
                                 ++self->server_.extras_sent;
                                 self->read();
                             });
        }
        static constexpr std::string_view unsolicited =
            "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

        // Sends a close_notify; the client never answers one, so the wait
        // for its reply is cut short and the socket closed.
        void close_notify() {
            beast::get_lowest_layer(stream_).expires_after(50ms);
            stream_.async_shutdown([self = shared_from_this()](beast::error_code) { self->shut(); });
        }

        void shut() {
            if (closed_) return;
            closed_ = true;
            --server_.open;
            beast::error_code ignored;
            beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ignored);
            beast::get_lowest_layer(stream_).close();
        }

        tls_server& server_;
        beast::ssl_stream<beast::tcp_stream> stream_;
        beast::flat_buffer buffer_;
        test_request request_;
        test_response response_;
        int id_;
        int served_ = 0;
        bool closed_ = false;
    };

    void accept() {
        acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
            if (ec) return;  // acceptor closed
            ++accepts;
            ++open;
            std::make_shared<session>(*this, std::move(socket), accepts)->start();
            accept();
        });
    }

    ssl::context context_;
    tcp::acceptor acceptor_;
};

// Accepts TCP connections and never reads from them: a TLS handshake with
// it can only time out.
class silent_server {
public:
    explicit silent_server(net::io_context& ioc) : acceptor_(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
        accept();
    }

    [[nodiscard]] std::string url() const {
        return "https://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()) + "/hook";
    }

    int accepts = 0;

private:
    void accept() {
        acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
            if (ec) return;
            ++accepts;
            held_.push_back(std::move(socket));
            accept();
        });
    }

    tcp::acceptor acceptor_;
    std::vector<tcp::socket> held_;
};

// Everything a test needs: a CA, a certificate for localhost and 127.0.0.1
// signed by it, and the CA as a file for client_options::tls.ca_file.
struct pki {
    test_ca ca;
    pem_identity localhost = ca.issue("DNS:localhost,IP:127.0.0.1,IP:::1");
    temp_file ca_file{ca.certificate_pem()};

    [[nodiscard]] client_options trusting_options() const {
        client_options o = fast_options();
        o.tls.ca_file = ca_file.path();
        return o;
    }
};

// The std::invalid_argument message of constructing a client ("" if none).
std::string construction_error(const std::string& url, const client_options& options) {
    net::io_context ioc;
    try {
        webhook_client const client(ioc, parse_endpoint_url(url), options);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return {};
}

}  // namespace

TEST_CASE("webhook_client tls: a certificate from the configured CA is accepted, by host name and by IP") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    std::string host;
    SUBCASE("DNS name") { host = "localhost"; }
    SUBCASE("IP literal") { host = "127.0.0.1"; }
    CAPTURE(host);
    webhook_client client(ioc, parse_endpoint_url(server.url(host)), p.trusting_options());

    response_summary const r = post_and_wait(ioc, client, json(R"({"id":1})"));
    CAPTURE(r.error);
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 200);
    CHECK(r.body_excerpt == "ok");
    REQUIRE(server.seen.size() == 1);
    CHECK(server.seen[0].body() == R"({"id":1})");
    CHECK(server.seen[0][http::field::host] == parse_endpoint_url(server.url(host)).host_header);
}

TEST_CASE("webhook_client tls: keep-alive reuses one TLS connection; close() does not wait on the server") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), p.trusting_options());

    for (int i = 0; i < 3; ++i) {
        response_summary const r = post_and_wait(ioc, client, json("{}"));
        CAPTURE(r.error);
        CHECK(r.status == 200);
    }
    CHECK(server.accepts == 1);
    CHECK(server.handshakes == 1);
    CHECK(server.seen.size() == 3);

    // No two-way TLS shutdown: the server sees the connection go at once.
    client.close();
    CHECK(run_until(ioc, [&] { return server.open == 0; }, 2s));
}

TEST_CASE("webhook_client tls: without ca_file only the system CAs are trusted") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), fast_options());

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.transport_error);  // so the relay retries it and never counts it delivered
    CHECK_FALSE(r.timed_out);
    CHECK(r.status == 0);
    std::string const where = "localhost:" + std::to_string(server.port());
    CHECK(r.error == "TLS handshake with " + where +
                         " failed: certificate verify failed (unable to get local issuer certificate)");
    CHECK(server.seen.empty());
}

TEST_CASE("webhook_client tls: a certificate for another name is refused") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.ca.issue("DNS:wrong.example"));
    std::string host;
    std::string reason;
    SUBCASE("DNS name") {
        host = "localhost";
        reason = "(hostname mismatch)";
    }
    SUBCASE("IP literal") {
        host = "127.0.0.1";
        reason = "(IP address mismatch)";
    }
    webhook_client client(ioc, parse_endpoint_url(server.url(host)), p.trusting_options());

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.error.find("TLS handshake with " + host + ":") == 0);
    CHECK(r.error.find("failed: certificate verify failed " + reason) != std::string::npos);
    CHECK(server.seen.empty());
}

TEST_CASE("webhook_client tls: verify = false accepts any certificate") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.ca.issue("DNS:wrong.example"));
    client_options o = fast_options();  // no ca_file either
    o.tls.verify = false;
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 200);
    CHECK(server.seen.size() == 1);
}

TEST_CASE("webhook_client tls: a server that never completes the handshake times out after connect_timeout") {
    net::io_context ioc;
    pki p;
    silent_server server(ioc);
    client_options o = p.trusting_options();
    o.connect_timeout = 300ms;
    webhook_client client(ioc, parse_endpoint_url(server.url()), o);

    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.timed_out);
    CHECK(r.error == "timeout after 300 ms in TLS handshake with 127.0.0.1:" + parse_endpoint_url(server.url()).port);
    CHECK(r.elapsed >= 300ms);
    CHECK(r.elapsed < 5s);
    CHECK(server.accepts == 1);
}

TEST_CASE("webhook_client tls: a server offering only TLS 1.1 is refused") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost, [](ssl::context& c) {
        // OpenSSL 3 speaks TLS 1.0/1.1 only at security level 0.
        SSL_CTX_set_security_level(c.native_handle(), 0);
        SSL_CTX_set_min_proto_version(c.native_handle(), TLS1_VERSION);
        SSL_CTX_set_max_proto_version(c.native_handle(), TLS1_1_VERSION);
    });

    // The server does work: a client that allows TLS 1.1 gets through.
    {
        ssl::context lax(ssl::context::tls_client);
        SSL_CTX_set_security_level(lax.native_handle(), 0);
        SSL_CTX_set_min_proto_version(lax.native_handle(), TLS1_VERSION);
        beast::ssl_stream<beast::tcp_stream> probe(ioc, lax);
        bool done = false;
        beast::error_code result;
        beast::get_lowest_layer(probe).async_connect(server.endpoint(), [&](beast::error_code ec) {
            if (ec) {
                result = ec;
                done = true;
                return;
            }
            probe.async_handshake(ssl::stream_base::client, [&](beast::error_code ec2) {
                result = ec2;
                done = true;
            });
        });
        REQUIRE(run_until(ioc, [&] { return done; }));
        CAPTURE(result.message());
        REQUIRE_FALSE(result);
        CHECK(SSL_version(probe.native_handle()) == TLS1_1_VERSION);
    }

    // Our hello offers TLS 1.2 and 1.3 only, so the server gives up with a
    // protocol_version alert. (OpenSSL 3's default security level would
    // refuse TLS 1.1 as well; the client's explicit minimum also holds where
    // a system openssl.cnf lowers that level.)
    webhook_client client(ioc, parse_endpoint_url(server.url()), p.trusting_options());
    response_summary const r = post_and_wait(ioc, client, json("{}"));
    CAPTURE(r.error);
    CHECK(r.transport_error);
    CHECK(r.error == "TLS handshake with 127.0.0.1:" + std::to_string(server.port()) +
                         " failed: tlsv1 alert protocol version");
    CHECK(server.failed_handshakes == 1);
    CHECK(server.seen.empty());
}

TEST_CASE("webhook_client tls: a connection the server closed while idle costs nothing") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    SUBCASE("with a close_notify (the client reads it while the connection is idle)") {
        server.behaviour = [](int, int) { return tls_server::action::respond_then_close_notify; };
    }
    SUBCASE("without a close_notify") {
        server.behaviour = [](int, int) { return tls_server::action::respond_then_close; };
    }
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), p.trusting_options());

    CHECK(post_and_wait(ioc, client, json("first")).status == 200);
    REQUIRE(run_until(ioc, [&] { return server.open == 0; }));
    response_summary const r = post_and_wait(ioc, client, json("second"));
    CAPTURE(r.error);
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 200);
    CHECK(server.accepts == 2);
    REQUIRE(server.seen.size() == 2);
    CHECK(server.seen[1].body() == "second");
}

TEST_CASE("webhook_client tls: a session ticket on an idle connection does not cost the connection") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    server.behaviour = [](int, int index) {
        return index == 0 ? tls_server::action::respond_then_ticket : tls_server::action::respond;
    };
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), p.trusting_options());

    CHECK(post_and_wait(ioc, client, json("first")).status == 200);
    REQUIRE(run_until(ioc, [&] { return server.extras_sent == 1; }));
    response_summary const r = post_and_wait(ioc, client, json("second"));
    CAPTURE(r.error);
    CHECK(r.status == 200);
    CHECK(server.accepts == 1);
    CHECK(server.seen.size() == 2);
}

TEST_CASE("webhook_client tls: an unsolicited response on an idle connection is never taken for the next answer") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    server.behaviour = [](int connection, int) {
        return connection == 1 ? tls_server::action::respond_then_unsolicited : tls_server::action::respond;
    };
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), p.trusting_options());

    CHECK(post_and_wait(ioc, client, json("first")).status == 200);
    REQUIRE(run_until(ioc, [&] { return server.extras_sent == 1; }));
    response_summary const r = post_and_wait(ioc, client, json("second"));
    CAPTURE(r.error);
    CHECK(r.status == 200);  // not the 408 that was waiting on connection 1
    CHECK(server.accepts == 2);
    REQUIRE(server.seen.size() == 2);
    CHECK(server.seen[1].body() == "second");
}

TEST_CASE("webhook_client tls: a reused connection dropped under a request is retried once on a fresh one") {
    net::io_context ioc;
    pki p;
    tls_server server(ioc, p.localhost);
    // Connection 1 answers its first request, then drops TCP (no
    // close_notify: the client sees a truncated TLS stream) on the second.
    server.behaviour = [](int connection, int index) {
        return connection == 1 && index == 1 ? tls_server::action::close : tls_server::action::respond;
    };
    webhook_client client(ioc, parse_endpoint_url(server.url("localhost")), p.trusting_options());

    CHECK(post_and_wait(ioc, client, json("first")).status == 200);
    response_summary const r = post_and_wait(ioc, client, json("second"));
    CAPTURE(r.error);
    CHECK_FALSE(r.transport_error);
    CHECK(r.status == 200);
    CHECK(server.accepts == 2);
    CHECK(server.handshakes == 2);
    REQUIRE(server.seen.size() == 3);
    CHECK(server.seen[1].body() == "second");
    CHECK(server.seen[2].body() == "second");  // the same request, sent again
}

TEST_CASE("webhook_client tls: an unusable ca_file is a construction error naming the file") {
    client_options o = fast_options();
    std::string error;
    SUBCASE("missing") {
        o.tls.ca_file = "/nonexistent/outboxd-test-ca.pem";
        error = construction_error("https://localhost:8443/hook", o);
        CHECK(error.find("No such file or directory") != std::string::npos);
    }
    SUBCASE("not PEM") {
        temp_file const garbage("this is not a certificate\n");
        o.tls.ca_file = garbage.path();
        error = construction_error("https://localhost:8443/hook", o);
    }
    SUBCASE("empty") {
        temp_file const empty("");
        o.tls.ca_file = empty.path();
        error = construction_error("https://localhost:8443/hook", o);
    }
    CAPTURE(error);
    REQUIRE(o.tls.ca_file);
    CHECK(error.find("cannot load the CA file '" + *o.tls.ca_file + "': ") == 0);
}

TEST_CASE("webhook_client tls: tls settings are not read for an http endpoint") {
    client_options o = fast_options();
    o.tls.ca_file = "/nonexistent/outboxd-test-ca.pem";
    CHECK(construction_error("http://localhost:8080/hook", o).empty());
}
