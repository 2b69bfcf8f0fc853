#include "http/admin_server.hpp"

#include <chrono>
#include <list>
#include <optional>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace outboxd::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

// A client has this long for each request (and to take each answer); an
// idle keep-alive connection is closed after it too.
constexpr std::chrono::seconds io_deadline{30};
constexpr std::uint32_t header_limit = 8 * 1024;

}  // namespace

struct admin_server::state : std::enable_shared_from_this<admin_server::state> {
    state(net::io_context& ioc, handler h) : acceptor(ioc), on_request(std::move(h)) {}

    class session;

    void accept();
    void close_all();

    tcp::acceptor acceptor;
    handler on_request;
    std::list<std::weak_ptr<session>> sessions;
    std::size_t open = 0;
    bool stopped = false;
};

class admin_server::state::session : public std::enable_shared_from_this<session> {
public:
    session(tcp::socket socket, std::shared_ptr<state> owner) : stream_(std::move(socket)), owner_(std::move(owner)) {}
    ~session() { --owner_->open; }

    void start() { read(); }
    void close() {
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
        stream_.close();
    }

private:
    void read() {
        parser_.emplace();
        parser_->header_limit(header_limit);
        parser_->body_limit(0);
        stream_.expires_after(io_deadline);
        bhttp::async_read(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec) {
            // A malformed request gets its 400; a closed or idle connection nothing.
            if (ec != bhttp::error::end_of_stream && ec != beast::error::timeout && ec != net::error::operation_aborted &&
                ec != net::error::connection_reset && !owner_->stopped) {
                respond_and_close({400, "text/plain; charset=utf-8", "bad request\n"}, 11, false);
                return;
            }
            close();
            return;
        }
        const auto& req = parser_->get();
        const bool head = req.method() == bhttp::verb::head;
        admin_response res;
        if (req.method() != bhttp::verb::get && !head) {
            res = {405, "text/plain; charset=utf-8", "only GET and HEAD\n"};
        } else {
            const std::string_view target(req.target().data(), req.target().size());
            const auto path = target.substr(0, target.find('?'));
            try {
                res = owner_->on_request(path);
            } catch (const std::exception&) {
                res = {500, "text/plain; charset=utf-8", "internal error\n"};
            }
        }
        respond(std::move(res), req.version(), req.keep_alive() && res.status != 405, head);
    }

    void respond_and_close(admin_response res, unsigned version, bool head) {
        respond(std::move(res), version, false, head);
    }

    void respond(admin_response res, unsigned version, bool keep_alive, bool head) {
        auto msg = std::make_shared<bhttp::response<bhttp::string_body>>(static_cast<bhttp::status>(res.status),
                                                                         version);
        msg->set(bhttp::field::content_type, res.content_type);
        msg->set(bhttp::field::cache_control, "no-store");
        if (res.status == 405) msg->set(bhttp::field::allow, "GET, HEAD");
        msg->keep_alive(keep_alive);
        msg->body() = std::move(res.body);
        msg->prepare_payload();
        if (head) msg->body().clear();  // Content-Length still says what GET would send
        stream_.expires_after(io_deadline);
        bhttp::async_write(stream_, *msg, [self = shared_from_this(), msg, keep_alive](beast::error_code ec, std::size_t) {
            if (ec || !keep_alive || self->owner_->stopped) {
                self->close();
                return;
            }
            self->read();
        });
    }

    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<bhttp::request_parser<bhttp::empty_body>> parser_;
    std::shared_ptr<state> owner_;
};

void admin_server::state::accept() {
    acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (self->stopped) return;
        if (!ec) {
            if (self->open >= max_connections) {
                beast::error_code ignored;
                socket.close(ignored);  // a scraper needs one; this many is a flood
            } else {
                ++self->open;
                auto s = std::make_shared<session>(std::move(socket), self);
                std::erase_if(self->sessions, [](const auto& w) { return w.expired(); });
                self->sessions.push_back(s);
                s->start();
            }
        }
        self->accept();
    });
}

void admin_server::state::close_all() {
    stopped = true;
    beast::error_code ec;
    acceptor.close(ec);
    for (auto& w : sessions) {
        if (auto s = w.lock()) s->close();
    }
    sessions.clear();
}

admin_server::admin_server(net::io_context& ioc, const listen_address& at, handler h)
    : state_(std::make_shared<state>(ioc, std::move(h))) {
    // localhost without a lookup: the loopback address.
    const auto address = at.host == "localhost" ? net::ip::address_v4::loopback() : net::ip::make_address(at.host);
    const tcp::endpoint endpoint(address, at.port);
    auto& a = state_->acceptor;
    a.open(endpoint.protocol());
    a.set_option(tcp::acceptor::reuse_address(true));
    a.bind(endpoint);
    a.listen(net::socket_base::max_listen_connections);
    port_ = a.local_endpoint().port();
    state_->accept();
}

admin_server::~admin_server() { stop(); }

void admin_server::stop() {
    if (!state_->stopped) state_->close_all();
}

}  // namespace outboxd::http
