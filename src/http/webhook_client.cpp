// HTTP/1.1 webhook client: a bounded pool of keep-alive connections to one
// endpoint, plain or TLS, on Boost.Beast, single-threaded on the caller's
// io_context.
//
// Shape:
//   webhook_client ── impl (= pool) ── FIFO queue of pending requests
//                                   ├─ idle connections (owned by the pool)
//                                   └─ busy connections (owned by their own
//                                      pending handlers; the pool keeps a
//                                      raw pointer only to abort them)
// Each connection holds a shared_ptr to the pool, so destroying the client
// while requests are on the wire is safe: the pool lives until the last
// handler has run. Idle connections form a cycle with the pool, broken by
// close() (the client's destructor calls it).
//
// A request's life: post() → queue → dispatch() hands it to an idle
// connection (most recently used first; a cheap non-blocking peek drops ones
// the server has closed) or opens a new one while fewer than max_connections
// exist → [resolve → egress check → connect → TLS handshake] → write → read
// → finished(): the connection goes back to idle (or is closed), the next
// queued request is started, then `done` runs. Every step runs in a
// completion handler, so `done` is never called from inside post().
//
// Deadlines: resolve + connect + TLS handshake share one deadline
// (connect_timeout: everything it takes to get a usable connection); write +
// read share another (request_timeout), both through tcp_stream's timer
// (the lookup gets a steady_timer, as tcp_stream does not cover it). Both
// are cut short by the request's own deadline (the relay's lease), after
// which nothing starts: no connect, no write, no stale-connection retry.
//
// Name lookups: getaddrinfo blocks and cannot be cancelled, and Asio's
// resolver runs every lookup of an io_context one after another on a single
// thread (a slow one delays all others, and its answer arrives after any
// deadline). So each pool runs its own lookup on a detached thread; the
// connections that need an address wait for it until their connect
// deadline, and join the one in progress rather than start another (all
// ask for the same name). An answer that comes after they gave up is
// dropped. The thread reaches the loop only through a lookup_channel that
// abort() closes, so it never touches an io_context that may be gone.
//
// TLS: `connection` is a template on its stream type; https endpoints get
// connection<beast::ssl_stream<beast::tcp_stream>>, which adds the handshake
// after connect, and everything else goes through get_lowest_layer(). One
// ssl::context per client holds the trust store (loaded once). Every
// (re)connect makes a fresh stream: an OpenSSL session object cannot be
// handshaken again once its connection has closed. No close_notify is sent
// on close: HTTP/1.1 framing already tells where every message ends, so a
// truncation cannot go unnoticed, and a two-way TLS shutdown would wait on
// the server (delaying close and process exit) for no benefit.
//
// Egress guard (block_private_addresses): every address is classified
// (core/address_policy) after resolution and right before connecting, and
// only global ones are handed to connect, so a name that resolves (or is
// re-bound) to an internal address is refused as well as an IP literal.

#include "http/webhook_client.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <charconv>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>

#include "core/address_policy.hpp"
#include "core/http_token.hpp"
#include "http/request_head.hpp"

namespace outboxd::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using clock_type = std::chrono::steady_clock;
using tls_stream = beast::ssl_stream<beast::tcp_stream>;

namespace {

// A response body is read up to this many bytes, then reading stops: only
// the first max_body_excerpt bytes are kept anyway (see excerpt_body), and a
// webhook receiver has no business sending megabytes. The status line and
// the excerpt are known by then, so the status is still reported (not a
// transport error); the connection is closed because the rest of the body
// is unread. The limit is enforced by excerpt_body rather than the parser's
// body_limit, which would reject a large Content-Length before keeping any
// excerpt.
constexpr std::uint64_t max_response_body = 1024 * 1024;
// Beast's default (8 KiB) rejects some real-world responses (long CSP or
// cookie headers); 64 KiB is still a small bound.
constexpr std::uint32_t max_response_header = 64 * 1024;
// Bytes read but not yet parsed at most. Beast 1.74 parses a chunk-size
// line (with its extensions) and the trailers only once they are whole, and
// limits neither: without a bound on the read buffer a receiver could grow
// it for ever. A head must fit, hence the header limit plus a read's slack.
constexpr std::size_t max_unparsed = max_response_header + 16 * 1024;

// A Beast body type that keeps only the first `keep` bytes of the body and
// discards the rest, so a large response costs no memory beyond the excerpt
// while the connection stays usable (the body is still read to its end).
// More than `limit` bytes in total fail with http::error::body_limit.
struct excerpt_body {
    struct value_type {
        std::string text;
        std::size_t keep = 0;
        std::uint64_t limit = 0;
        std::uint64_t received = 0;
    };

    class reader {
    public:
        template <bool is_request, class fields_type>
        reader(http::header<is_request, fields_type>& /*header*/, value_type& body) : body_(body) {}

        void init(const boost::optional<std::uint64_t>& /*content_length*/, beast::error_code& ec) {
            ec = {};
        }

        template <class const_buffer_sequence>
        std::size_t put(const const_buffer_sequence& buffers, beast::error_code& ec) {
            ec = {};
            std::size_t total = 0;
            for (auto const b : beast::buffers_range_ref(buffers)) {
                total += b.size();
                std::size_t const room = body_.keep - std::min(body_.keep, body_.text.size());
                if (room > 0) body_.text.append(static_cast<const char*>(b.data()), std::min(room, b.size()));
            }
            body_.received += total;
            if (body_.received > body_.limit) ec = http::error::body_limit;
            return total;
        }

        void finish(beast::error_code& ec) { ec = {}; }

    private:
        value_type& body_;
    };
};

struct pending {
    outgoing_request request;
    std::function<void(response_summary)> done;
    clock_type::time_point posted;
};

std::chrono::microseconds since(clock_type::time_point start) {
    return std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - start);
}

response_summary transport_failure(std::string error, bool timed_out = false) {
    response_summary s;
    s.transport_error = true;
    s.timed_out = timed_out;
    s.error = std::move(error);
    return s;
}

// Defence in depth against header injection: the caller validates headers,
// but a CR/LF in a value would let an event row rewrite our request framing.
// Returns an error (without the value) or an empty string.
std::string check_headers(const header_list& headers) {
    for (std::size_t i = 0; i < headers.size(); ++i) {
        auto const& [name, value] = headers[i];
        if (!is_http_token(name)) {
            return fmt::format("refusing to send extra header #{}: invalid header name", i + 1);
        }
        for (char ch : value) {
            auto const c = static_cast<unsigned char>(ch);
            if ((c < 0x20 && c != '\t') || c == 0x7f) {
                return fmt::format("refusing to send header '{}': value contains a control character", name);
            }
        }
    }
    return {};
}

// Errors that mean "the server closed this connection" rather than "the
// server is broken": on a reused connection they trigger the one retry.
// TLS adds stream_truncated: the server closed without a close_notify, which
// is how most of them drop an idle connection.
bool is_stale_connection_error(const beast::error_code& ec) noexcept {
    return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
           ec == net::error::broken_pipe || ec == net::error::connection_aborted ||
           ec == net::error::not_connected || ec == ssl::error::stream_truncated;
}

// The newest OpenSSL error's reason, for messages (empty queue: a fallback).
std::string openssl_reason() {
    unsigned long const code = ERR_peek_last_error();
    ERR_clear_error();
    char const* reason = code == 0 ? nullptr : ERR_reason_error_string(code);
    return reason != nullptr ? reason : "unknown OpenSSL error";
}

// ec.message(), except for an OpenSSL error that wraps a system error
// (e.g. a CA file that cannot be opened), which OpenSSL 3 gives no reason
// string (Asio then says only "asio.ssl error"): that one gets strerror's.
std::string describe_ssl_error(const beast::error_code& ec) {
    if (ec.category() == net::error::get_ssl_category()) {
        auto const code = static_cast<unsigned long>(static_cast<unsigned int>(ec.value()));
        if (ERR_SYSTEM_ERROR(code)) return std::system_category().message(ERR_GET_REASON(code));
    }
    return ec.message();
}

// Why a TLS handshake failed, e.g. "certificate verify failed (hostname
// mismatch)": OpenSSL's reason plus, for a rejected certificate, the
// verifier's own explanation.
std::string describe_handshake_error(const beast::error_code& ec, const SSL* session) {
    if (ec.category() == net::error::get_ssl_category()) {
        std::string reason = describe_ssl_error(ec);
        auto const code = static_cast<unsigned long>(static_cast<unsigned int>(ec.value()));
        if (session != nullptr && ERR_GET_REASON(code) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
            long const verify = SSL_get_verify_result(session);
            if (verify != X509_V_OK) reason += fmt::format(" ({})", X509_verify_cert_error_string(verify));
        }
        return reason;
    }
    if (ec == ssl::error::stream_truncated || ec == net::error::eof) return "connection closed by the server";
    return describe_ssl_error(ec);
}

// One ssl::context per client: TLS 1.2 or later, the trust store loaded once.
void configure_tls(ssl::context& context, const tls_settings& tls) {
    // TLS 1.0 and 1.1 are deprecated (RFC 8996); webhook receivers all speak 1.2.
    if (SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION) != 1) {
        throw std::runtime_error(fmt::format("cannot require TLS 1.2: {}", openssl_reason()));
    }
    beast::error_code ec;
    if (tls.ca_file) {
        // Only this bundle is trusted: a private CA should not widen into
        // "private CA or any public one".
        context.load_verify_file(*tls.ca_file, ec);
        if (ec) {
            throw std::invalid_argument(
                fmt::format("cannot load the CA file '{}': {}", *tls.ca_file, describe_ssl_error(ec)));
        }
    } else {
        context.set_default_verify_paths(ec);
        if (ec) {
            throw std::runtime_error(fmt::format("cannot load the system CA certificates: {}", describe_ssl_error(ec)));
        }
    }
    context.set_verify_mode(tls.verify ? ssl::verify_peer : ssl::verify_none);
}

// "127.0.0.1 (loopback)" when the egress guard refuses `address`, else empty.
std::string egress_refusal(const net::ip::address& address) {
    address_class const kind =
        address.is_v4() ? classify(address.to_v4().to_bytes()) : classify(address.to_v6().to_bytes());
    if (egress_allowed(kind)) return {};
    return fmt::format("{} ({})", address.to_string(), describe(kind));
}

constexpr std::string_view egress_blocked = "egress to private addresses is blocked (block_private_addresses)";

// The default resolver_function: getaddrinfo, as Asio's resolver calls it.
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

// How a lookup thread hands its answer to the loop (see the top of the file).
struct lookup_channel {
    std::mutex mutex;
    bool open = true;  // false once the client is gone: the answer is dropped
};

// "300 ms", or "200 ms (the attempt's deadline)" when the request's own
// deadline came before the timeout, for timeout messages.
std::string budget_text(clock_type::duration budget, bool cut_by_deadline) {
    auto const ms = std::chrono::duration_cast<std::chrono::milliseconds>(budget).count();
    return cut_by_deadline ? fmt::format("{} ms (the attempt's deadline)", ms) : fmt::format("{} ms", ms);
}

// Everything about the endpoint a connection needs, computed once.
struct client_config {
    endpoint_url endpoint;
    client_options options;
    std::string authority;                    // host:port for messages, IPv6 in brackets
    std::optional<net::ip::address> literal;  // host is an IP address: no DNS lookup
    std::uint16_t port = 0;
};

class connection_base : public std::enable_shared_from_this<connection_base> {
public:
    connection_base() = default;
    connection_base(const connection_base&) = delete;
    connection_base& operator=(const connection_base&) = delete;
    virtual ~connection_base() = default;

    // Sends p on this connection, (re)connecting first if needed.
    virtual void start(pending&& p) = 0;
    // For an idle connection: true when it can take a request now.
    [[nodiscard]] virtual bool usable() noexcept = 0;
    // Closes an idle connection.
    virtual void close() noexcept = 0;
    // Cancels whatever the connection is doing; its request fails.
    virtual void abort() = 0;
    // The pool's lookup answered (generation: the connection's, when it asked).
    virtual void on_lookup(std::uint64_t generation, const resolution& r) = 0;
};

class pool : public std::enable_shared_from_this<pool> {
public:
    pool(net::io_context& ioc, endpoint_url endpoint, client_options options);
    pool(const pool&) = delete;
    pool& operator=(const pool&) = delete;
    ~pool() {
        std::lock_guard const lock(channel_->mutex);
        channel_->open = false;
    }

    void post(outgoing_request&& request, std::function<void(response_summary)>&& done);
    [[nodiscard]] std::size_t in_flight() const noexcept { return queue_.size() + busy_.size(); }
    void close();
    // close(), then cancel requests on the wire (they fail with "client closed").
    void abort();

    // For connections.
    [[nodiscard]] net::io_context& ioc() const noexcept { return ioc_; }
    [[nodiscard]] const client_config& config() const noexcept { return config_; }
    [[nodiscard]] ssl::context& tls_context() noexcept { return *tls_context_; }  // https only
    [[nodiscard]] bool aborted() const noexcept { return aborted_; }
    void finished(connection_base& c, bool reusable, std::function<void(response_summary)>&& done,
                  response_summary&& summary);
    void forget(const connection_base* c) noexcept;
    // Looks the endpoint's host up (or joins the lookup in progress); c's
    // on_lookup runs with the answer unless drop_lookup(c) came first.
    void lookup(std::shared_ptr<connection_base> c, std::uint64_t generation);
    void drop_lookup(const connection_base* c) noexcept;

private:
    void on_lookup(resolution&& r);
    void dispatch();
    void fail_later(std::function<void(response_summary)>&& done, clock_type::time_point posted, std::string error);
    [[nodiscard]] std::shared_ptr<connection_base> make_connection();

    net::io_context& ioc_;
    const client_config config_;
    std::optional<ssl::context> tls_context_;  // set for https endpoints
    std::deque<pending> queue_;
    std::vector<std::shared_ptr<connection_base>> idle_;  // most recently used last
    std::vector<connection_base*> busy_;                  // each owned by its pending handlers
    bool closed_ = false;
    bool aborted_ = false;
    std::shared_ptr<lookup_channel> channel_ = std::make_shared<lookup_channel>();
    bool lookup_running_ = false;
    std::vector<std::pair<std::shared_ptr<connection_base>, std::uint64_t>> lookup_waiters_;
};

template <class stream_type>
class connection final : public connection_base {
public:
    explicit connection(std::shared_ptr<pool> owner)
        : pool_(std::move(owner)),
          config_(pool_->config()),
          resolve_timer_(pool_->ioc()) {}

    ~connection() override { pool_->forget(this); }

    void start(pending&& p) override {
        done_ = std::move(p.done);
        posted_ = p.posted;
        deadline_ = p.request.deadline;
        may_retry_ = true;
        build_request(std::move(p.request));
        if (clock_type::now() >= deadline_) {
            // Through the loop: start() may run inside post().
            net::post(pool_->ioc(), [self = self()] { self->not_sent("the attempt's deadline had passed"); });
            return;
        }
        if (stream_ && tcp_layer().socket().is_open()) {
            send();
        } else {
            connect();
        }
    }

    bool usable() noexcept override {
        if (!stream_) return false;
        auto& socket = tcp_layer().socket();
        if (!socket.is_open()) return false;
        // A server closes idle keep-alive connections whenever it likes
        // (nginx after 75 s, Node after 5 s). Peeking one byte without
        // blocking tells whether it already has: 0 = orderly close, data =
        // something unsolicited (e.g. a 408 before closing), either way the
        // connection is unusable. EAGAIN = nothing to read, still open.
        // This catches almost every stale connection before a request is
        // wasted on it; the retry in on_write/on_read covers the race left.
        if constexpr (is_tls) {
            return only_harmless_tls_records();
        } else {
            char byte = 0;
            ssize_t const n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        }
    }

    void close() noexcept override { close_socket(); }

    void abort() override {
        resolve_timer_.cancel();  // a connection waiting for a lookup fails in on_resolve_wait
        close_socket();
    }

    void on_lookup(std::uint64_t generation, const resolution& r) override {
        if (generation != resolve_generation_ || phase_ != phase::resolving) return;
        lookup_ = r;
        resolve_timer_.cancel();  // wakes on_resolve_wait
    }

private:
    enum class phase { idle, resolving, connecting, handshaking, writing, reading };
    static constexpr bool is_tls = std::is_same_v<stream_type, tls_stream>;

    std::shared_ptr<connection> self() { return std::static_pointer_cast<connection>(shared_from_this()); }
    beast::tcp_stream& tcp_layer() noexcept { return beast::get_lowest_layer(*stream_); }
    // The OpenSSL session of a TLS connection, nullptr for plain TCP.
    SSL* tls_session() noexcept {
        if constexpr (is_tls) {
            return stream_->native_handle();
        } else {
            return nullptr;
        }
    }

    // The TLS form of usable()'s peek. What the server sent may already sit
    // inside the TLS stream, read from the socket together with the last
    // response, and records must be decrypted to be told apart: so the
    // stream itself is read, without blocking. Records that carry no data
    // (TLS 1.3 session tickets, key updates; servers send them whenever they
    // like) are consumed and leave the connection usable; a close_notify
    // (eof), a closed socket, an error or application data (an unsolicited
    // response) do not. "Would block" = nothing left, still open.
    bool only_harmless_tls_records() noexcept {
        auto& socket = tcp_layer().socket();
        beast::error_code ec;
        socket.non_blocking(true, ec);  // for this synchronous read only
        if (ec) return false;
        char byte = 0;
        std::size_t const n = stream_->read_some(net::buffer(&byte, 1), ec);
        beast::error_code ignored;
        socket.non_blocking(false, ignored);
        return n == 0 && ec == net::error::would_block;
    }

    void close_socket() noexcept {
        if (!stream_) return;
        beast::error_code ignored;
        tcp_layer().socket().close(ignored);
        try {
            tcp_layer().close();  // also cancels tcp_stream's timer
        } catch (...) {  // NOLINT(bugprone-empty-catch): nothing left to clean up
        }
    }

    void build_request(outgoing_request&& r) {
        head_ = request_head({config_.endpoint.target, config_.endpoint.host_header, config_.options.user_agent},
                             r.headers, r.body.size());
        body_ = std::move(r.body);  // moved, never copied
    }

    void connect() {
        reused_ = false;
        buffer_.clear();
        // A fresh stream for every connection (see the top of this file).
        if constexpr (is_tls) {
            stream_.emplace(pool_->ioc(), pool_->tls_context());
        } else {
            stream_.emplace(pool_->ioc());
        }
        auto const now = clock_type::now();
        connect_deadline_ = std::min(now + config_.options.connect_timeout, deadline_);
        connect_budget_ = connect_deadline_ - now;
        connect_cut_ = connect_deadline_ == deadline_;
        if (config_.literal) {
            phase_ = phase::connecting;
            tcp::endpoint const target(*config_.literal, config_.port);
            if (config_.options.block_private_addresses) {
                if (std::string refused = egress_refusal(target.address()); !refused.empty()) {
                    // Through the loop: connect() may run inside post().
                    net::post(pool_->ioc(), [self = self(), refused = std::move(refused)] {
                        self->fail(fmt::format("refused to connect to {}: {}", refused, egress_blocked));
                    });
                    return;
                }
            }
            tcp_layer().expires_at(connect_deadline_);
            tcp_layer().async_connect(target, [self = self()](beast::error_code ec) { self->on_connect(ec); });
            return;
        }
        phase_ = phase::resolving;
        lookup_.reset();
        std::uint64_t const generation = ++resolve_generation_;
        resolve_timer_.expires_at(connect_deadline_);
        resolve_timer_.async_wait(
            [self = self(), generation](beast::error_code /*ec*/) { self->on_resolve_wait(generation); });
        pool_->lookup(shared_from_this(), generation);
    }

    // The lookup answered (on_lookup cancelled the timer), the connect
    // deadline came, or the client was destroyed.
    void on_resolve_wait(std::uint64_t generation) {
        if (generation != resolve_generation_ || phase_ != phase::resolving) return;
        if (pool_->aborted() || !lookup_ || clock_type::now() >= connect_deadline_) {
            pool_->drop_lookup(this);  // a late answer is dropped
            fail(pool_->aborted() ? beast::error_code(net::error::operation_aborted) : beast::error::timeout);
            return;
        }
        resolution const r = std::move(*lookup_);
        lookup_.reset();
        if (r.addresses.empty()) {
            fail(fmt::format("resolve {}: {}", config_.endpoint.host, r.error));
            return;
        }
        on_resolve(r.addresses);
    }

    void on_resolve(const std::vector<net::ip::address>& addresses) {
        phase_ = phase::connecting;
        // The guard looks at the addresses we are about to connect to, not at
        // the name: DNS may point any name anywhere, and may change its answer
        // between two connections (rebinding).
        std::vector<tcp::endpoint> targets;
        std::string refused;  // "10.0.0.1 (private), ::1 (loopback)": the first few, for the message
        std::size_t refused_count = 0;
        constexpr std::size_t refused_listed = 3;
        for (auto const& address : addresses) {
            std::string why;
            if (config_.options.block_private_addresses) why = egress_refusal(address);
            if (why.empty()) {
                targets.emplace_back(address, config_.port);
            } else if (++refused_count <= refused_listed) {
                refused += (refused.empty() ? "" : ", ") + why;
            }
        }
        if (targets.empty() && refused_count > 0) {
            if (refused_count > refused_listed) refused += fmt::format(", and {} more", refused_count - refused_listed);
            fail(fmt::format("refused to connect to {} at {}: {}", config_.endpoint.host, refused, egress_blocked));
            return;
        }
        tcp_layer().expires_at(connect_deadline_);
        tcp_layer().async_connect(targets, [self = self()](beast::error_code ec2, const tcp::endpoint& /*ep*/) {
            self->on_connect(ec2);
        });
    }

    void on_connect(beast::error_code ec) {
        if (ec) {
            fail(ec);
            return;
        }
        // Small requests and responses: Nagle plus delayed ACK would add up
        // to 40 ms per request on loopback.
        beast::error_code ignored;
        tcp_layer().socket().set_option(tcp::no_delay(true), ignored);
        if constexpr (is_tls) {
            handshake();
        } else {
            send();
        }
    }

    void handshake() {
        phase_ = phase::handshaking;
        SSL* const session = tls_session();
        std::string const& host = config_.endpoint.host;
        // SNI lets a server that hosts many names pick the certificate; RFC
        // 6066 forbids IP literals in it.
        if (!config_.literal && SSL_set_tlsext_host_name(session, host.c_str()) != 1) {
            fail(fmt::format("TLS setup for {} failed: {}", config_.authority, openssl_reason()));
            return;
        }
        if (config_.options.tls.verify) {
            // OpenSSL checks the name (or IP address) during the handshake
            // itself, so a mismatch reports as "certificate verify failed
            // (hostname mismatch)". No partial wildcards ("w*.example.com"):
            // RFC 6125 discourages them and browsers reject them.
            X509_VERIFY_PARAM* const param = SSL_get0_param(session);
            X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            int const set = config_.literal ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                                            : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
            if (set != 1) {
                fail(fmt::format("TLS setup for {} failed: {}", config_.authority, openssl_reason()));
                return;
            }
        }
        tcp_layer().expires_at(connect_deadline_);  // the rest of connect_timeout
        stream_->async_handshake(ssl::stream_base::client,
                                 [self = self()](beast::error_code ec) { self->on_handshake(ec); });
    }

    void on_handshake(beast::error_code ec) {
        if (ec) {
            fail(ec);
            return;
        }
        send();
    }

    void send() {
        auto const now = clock_type::now();
        if (now >= deadline_) {
            not_sent("the attempt's deadline had passed");
            return;
        }
        phase_ = phase::writing;
        response_bytes_ = 0;
        new_parser();
        // One deadline for write and read together (tcp_stream applies it to
        // every operation until it is set again).
        auto const request_deadline = std::min(now + config_.options.request_timeout, deadline_);
        request_budget_ = request_deadline - now;
        request_cut_ = request_deadline == deadline_;
        tcp_layer().expires_at(request_deadline);
        // Head and body in one gathered write.
        const std::array<net::const_buffer, 2> wire{net::buffer(head_), net::buffer(body_)};
        net::async_write(*stream_, wire,
                         [self = self()](beast::error_code ec, std::size_t /*n*/) { self->on_write(ec); });
    }

    void new_parser() {
        parser_.emplace();
        // excerpt_body enforces max_response_body. Not boost::none: Beast 1.74
        // compares `len > body_limit_` against the empty optional, which is
        // always true, and fails every response whose body arrives in a later
        // segment than its header.
        parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
        parser_->header_limit(max_response_header);
        auto& body = parser_->get().body();
        body.keep = config_.options.max_body_excerpt;
        body.limit = max_response_body;
    }

    void on_write(beast::error_code ec) {
        if (ec) {
            if (should_retry(ec)) {
                retry(ec);
            } else {
                fail(ec);
            }
            return;
        }
        phase_ = phase::reading;
        read();
    }

    // Reads piece by piece to count what the parser consumes: with the
    // unparsed rest bounded by buffer_'s max_unparsed, that bounds every byte
    // read for the attempt, framing and interim responses included.
    void read() {
        http::async_read_some(*stream_, buffer_, *parser_, [self = self()](beast::error_code ec, std::size_t n) {
            self->on_read_some(ec, n);
        });
    }

    void on_read_some(beast::error_code ec, std::size_t parsed) {
        response_bytes_ += parsed;
        if (!ec && response_bytes_ > max_response_bytes) {
            fail(fmt::format("response from {} too large: over {} bytes read", config_.authority,
                             max_response_bytes));
            return;
        }
        if (!ec && !parser_->is_done()) {
            read();
            return;
        }
        on_read(ec);
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::body_limit && parser_->is_header_done() && !pool_->aborted()) {
            complete(false);  // status known; the unread rest of the body makes the connection unusable
            return;
        }
        if (ec) {
            if (!parser_->got_some() && should_retry(ec)) {
                retry(ec);
            } else {
                fail(ec);
            }
            return;
        }
        if (parser_->get().result_int() / 100 == 1) {
            // Interim response (e.g. 103 Early Hints): the real one follows.
            may_retry_ = false;  // the server has answered on this connection
            new_parser();
            read();
            return;
        }
        complete(true);
    }

    // Why retry: a server may close an idle keep-alive connection at any
    // moment, and a request written just as it does so fails with EOF or a
    // reset before any response byte arrives. The server did not process
    // such a request (it had closed), so sending it once more on a fresh
    // connection is what every HTTP client does. Only once, only on a
    // connection that had completed an exchange before, and never after a
    // response byte or a timeout. In the rare case where the server did
    // receive the request and then died, the retry is a duplicate; delivery
    // is at-least-once and consumers de-duplicate by event id.
    [[nodiscard]] bool should_retry(const beast::error_code& ec) const noexcept {
        return reused_ && may_retry_ && !pool_->aborted() && is_stale_connection_error(ec);
    }

    // A new connection and the request must both fit before the attempt's
    // deadline, or the retry could outlive the lease.
    void retry(const beast::error_code& ec) {
        may_retry_ = false;
        auto const need = config_.options.connect_timeout + config_.options.request_timeout;
        if (deadline_ - clock_type::now() < need) {
            fail(fmt::format("connection to {} lost before any response ({}); not retried on a new connection, "
                             "which might outlive the attempt's deadline",
                             config_.authority, ec.message()));
            return;
        }
        close_socket();
        connect();  // head_ and body_ still hold the whole request
    }

    // Nothing of the request was written: an idle keep-alive connection
    // stays usable.
    void not_sent(std::string_view why) {
        bool const keep = reused_ && stream_ && tcp_layer().socket().is_open() && phase_ == phase::idle;
        finish(transport_failure(pool_->aborted() ? std::string("client closed")
                                                  : fmt::format("request to {} not sent: {}", config_.authority, why)),
               keep);
    }

    void complete(bool body_complete) {
        auto& res = parser_->get();
        response_summary s;
        s.status = res.result_int();
        if (auto const it = res.find(http::field::retry_after); it != res.end()) {
            s.retry_after = std::string(it->value());
        }
        s.body_excerpt = std::move(res.body().text);
        // HTTP/1.0 responses and `Connection: close` end the connection, and
        // so does a body delimited by EOF, or bytes after the response (the
        // server is out of step with us).
        // (TLS: bytes still inside the TLS stream are found by usable().)
        bool const reusable = body_complete && res.version() == 11 && parser_->keep_alive() &&
                              !parser_->need_eof() && buffer_.size() == 0;
        finish(std::move(s), reusable);
    }

    void fail(const beast::error_code& ec) {
        std::string const& where = config_.authority;
        response_summary s;
        if (pool_->aborted()) {
            s = transport_failure("client closed");
        } else if (ec == beast::error::timeout) {
            auto const connect_ms = budget_text(connect_budget_, connect_cut_);
            auto const request_ms = budget_text(request_budget_, request_cut_);
            switch (phase_) {
                case phase::resolving:
                    s = transport_failure(
                        fmt::format("timeout after {} resolving {}", connect_ms, config_.endpoint.host), true);
                    break;
                case phase::writing:
                    s = transport_failure(fmt::format("timeout after {} sending request to {}", request_ms, where),
                                          true);
                    break;
                case phase::reading:
                    s = transport_failure(
                        fmt::format("timeout after {} waiting for response from {}", request_ms, where), true);
                    break;
                case phase::handshaking:
                    s = transport_failure(fmt::format("timeout after {} in TLS handshake with {}", connect_ms, where),
                                          true);
                    break;
                default:
                    s = transport_failure(fmt::format("timeout after {} connecting to {}", connect_ms, where), true);
                    break;
            }
        } else {
            switch (phase_) {
                case phase::resolving:
                    s = transport_failure(fmt::format("resolve {}: {}", config_.endpoint.host, ec.message()));
                    break;
                case phase::handshaking:
                    s = transport_failure(fmt::format("TLS handshake with {} failed: {}", where,
                                                      describe_handshake_error(ec, tls_session())));
                    break;
                case phase::writing:
                    s = transport_failure(fmt::format("send request to {}: {}", where, ec.message()));
                    break;
                case phase::reading:
                    if (ec == http::error::header_limit) {
                        s = transport_failure(
                            fmt::format("response from {} too large: head over {} bytes", where, max_response_header));
                    } else if (ec == http::error::buffer_overflow) {
                        s = transport_failure(fmt::format(
                            "response from {} too large: a chunk-size line or trailers over {} bytes", where,
                            max_unparsed));
                    } else if (ec == http::error::end_of_stream && !parser_->got_some()) {
                        s = transport_failure(fmt::format("connection closed by {} before any response", where));
                    } else if (ec.category() == http::make_error_code(http::error::end_of_stream).category()) {
                        s = transport_failure(fmt::format("malformed response from {}: {}", where, ec.message()));
                    } else {
                        s = transport_failure(fmt::format("read response from {}: {}", where, ec.message()));
                    }
                    break;
                default:
                    s = transport_failure(fmt::format("connect to {}: {}", where, ec.message()));
                    break;
            }
        }
        finish(std::move(s), false);
    }

    // A failure we describe ourselves (TLS setup, the egress guard).
    void fail(std::string error) {
        finish(transport_failure(pool_->aborted() ? "client closed" : std::move(error)), false);
    }

    void finish(response_summary&& s, bool reusable) {
        phase_ = phase::idle;
        if (reusable) {
            reused_ = true;
        } else {
            close_socket();
        }
        s.elapsed = since(posted_);
        parser_.reset();
        std::string().swap(body_);  // don't pin a large payload on an idle connection
        std::function<void(response_summary)> done = std::move(done_);
        done_ = nullptr;
        pool_->finished(*this, reusable, std::move(done), std::move(s));
    }

    std::shared_ptr<pool> pool_;
    const client_config& config_;  // owned by *pool_
    std::optional<stream_type> stream_;  // made by connect()
    net::steady_timer resolve_timer_;  // the connect deadline while waiting for a lookup
    std::optional<resolution> lookup_;  // the lookup's answer, until on_resolve_wait takes it
    beast::flat_buffer buffer_{max_unparsed};  // reused across requests on this connection
    std::string head_;  // request line and header fields (see http/request_head.hpp)
    std::string body_;
    std::optional<http::response_parser<excerpt_body>> parser_;
    std::function<void(response_summary)> done_;
    clock_type::time_point posted_{};
    clock_type::time_point deadline_ = clock_type::time_point::max();  // the request's own (outgoing_request)
    clock_type::time_point connect_deadline_{};  // for resolve, connect and handshake
    clock_type::duration connect_budget_{};      // connect_deadline_ - its start, for messages
    clock_type::duration request_budget_{};      // the same for write + read
    bool connect_cut_ = false;  // the budgets were cut short by deadline_
    bool request_cut_ = false;
    phase phase_ = phase::idle;
    bool reused_ = false;     // this socket completed an exchange before
    bool may_retry_ = false;  // the one stale-connection retry is still available
    std::uint64_t response_bytes_ = 0;  // parsed for the current attempt (see read())
    std::uint64_t resolve_generation_ = 0;
};

client_config make_config(endpoint_url endpoint, client_options options) {
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

    beast::error_code ec;
    auto const address = net::ip::make_address(endpoint.host, ec);
    if (!ec) c.literal = address;
    c.authority = (address.is_v6() && !ec) ? fmt::format("[{}]:{}", endpoint.host, endpoint.port)
                                           : fmt::format("{}:{}", endpoint.host, endpoint.port);
    c.endpoint = std::move(endpoint);
    c.options = std::move(options);
    return c;
}

pool::pool(net::io_context& ioc, endpoint_url endpoint, client_options options)
    : ioc_(ioc), config_(make_config(std::move(endpoint), std::move(options))) {
    if (config_.endpoint.is_tls()) configure_tls(tls_context_.emplace(ssl::context::tls_client), config_.options.tls);
    idle_.reserve(config_.options.max_connections);
    busy_.reserve(config_.options.max_connections);
}

void pool::post(outgoing_request&& request, std::function<void(response_summary)>&& done) {
    if (!done) throw std::invalid_argument("webhook_client::post: empty completion handler");
    auto const now = clock_type::now();
    if (closed_) {
        fail_later(std::move(done), now, "client closed");
        return;
    }
    if (std::string error = check_headers(request.headers); !error.empty()) {
        fail_later(std::move(done), now, std::move(error));
        return;
    }
    queue_.push_back(pending{std::move(request), std::move(done), now});
    dispatch();
}

void pool::dispatch() {
    while (!queue_.empty()) {
        std::shared_ptr<connection_base> c;
        while (!idle_.empty() && !c) {
            c = std::move(idle_.back());
            idle_.pop_back();
            if (!c->usable()) {
                c->close();
                c.reset();
            }
        }
        if (!c) {
            if (busy_.size() >= config_.options.max_connections) return;  // idle_ is empty here
            c = make_connection();
        }
        busy_.push_back(c.get());
        pending p = std::move(queue_.front());
        queue_.pop_front();
        c->start(std::move(p));  // c now lives in its handlers
    }
}

std::shared_ptr<connection_base> pool::make_connection() {
    if (config_.endpoint.is_tls()) return std::make_shared<connection<tls_stream>>(shared_from_this());
    return std::make_shared<connection<beast::tcp_stream>>(shared_from_this());
}

void pool::finished(connection_base& c, bool reusable, std::function<void(response_summary)>&& done,
                    response_summary&& summary) {
    forget(&c);
    if (reusable) {
        if (closed_) {
            c.close();
        } else {
            idle_.push_back(c.shared_from_this());
        }
    }
    dispatch();  // start the next queued request before running caller code
    done(std::move(summary));
}

void pool::forget(const connection_base* c) noexcept {
    auto const it = std::find(busy_.begin(), busy_.end(), c);
    if (it != busy_.end()) busy_.erase(it);
}

void pool::lookup(std::shared_ptr<connection_base> c, std::uint64_t generation) {
    lookup_waiters_.emplace_back(std::move(c), generation);
    if (lookup_running_) return;
    lookup_running_ = true;
    resolver_function fn = config_.options.resolve ? config_.options.resolve : resolver_function(system_lookup);
    auto deliver = [channel = channel_, executor = ioc_.get_executor(), owner = weak_from_this()](resolution&& r) {
        std::lock_guard const lock(channel->mutex);
        if (!channel->open) return;
        net::post(executor, [owner, r = std::move(r)]() mutable {
            if (auto const p = owner.lock()) p->on_lookup(std::move(r));
        });
    };
    try {
        std::thread([fn = std::move(fn), deliver, host = config_.endpoint.host, port = config_.endpoint.port] {
            resolution r;
            try {
                r = fn(host, port);
            } catch (const std::exception& e) {
                r = resolution{{}, e.what()};
            }
            deliver(std::move(r));
        }).detach();
    } catch (const std::system_error& e) {
        deliver(resolution{{}, fmt::format("cannot start a lookup thread: {}", e.what())});
    }
}

void pool::on_lookup(resolution&& r) {
    lookup_running_ = false;
    auto const waiters = std::exchange(lookup_waiters_, {});
    for (auto const& [c, generation] : waiters) c->on_lookup(generation, r);
}

void pool::drop_lookup(const connection_base* c) noexcept {
    std::erase_if(lookup_waiters_, [c](auto const& w) { return w.first.get() == c; });
}

void pool::fail_later(std::function<void(response_summary)>&& done, clock_type::time_point posted, std::string error) {
    net::post(ioc_, [done = std::move(done), posted, error = std::move(error)]() mutable {
        response_summary s = transport_failure(std::move(error));
        s.elapsed = since(posted);
        done(std::move(s));
    });
}

void pool::close() {
    closed_ = true;
    std::deque<pending> queued = std::exchange(queue_, {});
    for (pending& p : queued) fail_later(std::move(p.done), p.posted, "client closed");
    std::vector<std::shared_ptr<connection_base>> idle = std::exchange(idle_, {});
    for (auto& c : idle) c->close();
}

void pool::abort() {
    close();
    aborted_ = true;
    {
        std::lock_guard const lock(channel_->mutex);
        channel_->open = false;  // the client may be destroyed next, then the io_context
    }
    std::vector<connection_base*> const busy = busy_;  // abort() never destroys synchronously
    for (connection_base* c : busy) c->abort();
}

}  // namespace

struct webhook_client::impl final : pool {
    using pool::pool;
};

webhook_client::webhook_client(net::io_context& ioc, endpoint_url endpoint, client_options options)
    : impl_(std::make_shared<impl>(ioc, std::move(endpoint), std::move(options))) {}

webhook_client::~webhook_client() {
    if (impl_) impl_->abort();
}

void webhook_client::post(outgoing_request request, std::function<void(response_summary)> done) {
    impl_->post(std::move(request), std::move(done));
}

std::size_t webhook_client::in_flight() const noexcept { return impl_->in_flight(); }

void webhook_client::close() { impl_->close(); }

}  // namespace outboxd::http
