// outboxd-bench-receiver: the benchmark's webhook endpoint.
//
// A plain HTTP/1.1 keep-alive server on 127.0.0.1 that answers every request
// with 200 at once and remembers, per request, the CLOCK_MONOTONIC time the
// whole request had arrived, the `webhook-id` header and the body. It must
// never be the bottleneck: no per-request logging, TCP_NODELAY, a canned
// response written straight from static memory.
//
//   outboxd-bench-receiver [--port N] [--port-file F] [--threads N] [--out F]
//
// Control requests (never recorded), for the orchestrator:
//   GET  /_bench/count   number of requests recorded since the last dump
//   POST /_bench/dump    body = a file path: write the records there, forget
//                        them, answer with how many were written
// SIGTERM/SIGINT: write what is left to --out (if given) and exit 0.
//
// Output: one line per request, `monotonic_ns <TAB> webhook-id <TAB> body`.
// Bodies are JSON without tabs or newlines (what the benchmark sends).
//
// --nats URL (the JetStream scenarios): also makes sure the stream EVENTS
// (subjects events.>, file storage) exists and records every message stored
// in it from now on, through a push consumer without acks: a message
// reaches it once JetStream has stored it, the step whose acknowledgement
// outboxd waits for. The record's id is the message's Nats-Msg-Id. The
// control requests above count and dump these records too.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>
#include <nats/nats.h>

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

std::int64_t monotonic_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct record {
    std::int64_t at_ns;
    std::string id;
    std::string body;
};

// Everything received since the last dump. One short lock per request; with a
// handful of threads that is far below the cost of the request itself.
class journal {
public:
    void add(record r) {
        std::lock_guard lock(mu_);
        records_.push_back(std::move(r));
    }
    [[nodiscard]] std::size_t count() {
        std::lock_guard lock(mu_);
        return records_.size();
    }
    std::vector<record> take() {
        std::vector<record> out;
        out.reserve(1 << 16);
        std::lock_guard lock(mu_);
        out.swap(records_);
        return out;
    }

private:
    std::mutex mu_;
    std::vector<record> records_;
};

// Returns how many records were written, or -1 if the file could not be written.
long long write_records(const std::vector<record>& records, const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return -1;
    for (const auto& r : records) {
        fmt::print(f, "{}\t{}\t{}\n", r.at_ns, r.id, r.body);
    }
    const bool ok = std::fclose(f) == 0;
    return ok ? static_cast<long long>(records.size()) : -1;
}

constexpr std::string_view ok_empty = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

class session : public std::enable_shared_from_this<session> {
public:
    session(tcp::socket socket, journal& j) : socket_(std::move(socket)), journal_(j) {}

    void start() { read(); }

private:
    void read() {
        req_ = {};
        // No deadline on purpose: idle keep-alive connections belong to the
        // relay under test, which decides when to close them.
        http::async_read(socket_, buffer_, req_,
                         [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec) return;  // closed by the peer, or garbage: drop the connection
        const auto now = monotonic_ns();
        const std::string_view target(req_.target().data(), req_.target().size());
        if (target.starts_with("/_bench/")) {
            control(target);
            return;
        }
        const auto id_field = req_.find("webhook-id");
        std::string id = id_field == req_.end() ? std::string("-")
                                                : std::string(id_field->value().data(), id_field->value().size());
        journal_.add({now, std::move(id), std::move(req_.body())});
        keep_alive_ = req_.keep_alive();
        net::async_write(socket_, net::buffer(ok_empty.data(), ok_empty.size()),
                         [self = shared_from_this()](beast::error_code e, std::size_t) { self->on_written(e); });
    }

    void control(std::string_view target) {
        std::string answer;
        unsigned status = 200;
        if (target == "/_bench/count") {
            answer = fmt::format("{}\n", journal_.count());
        } else if (target == "/_bench/dump" && req_.method() == http::verb::post) {
            const auto written = write_records(journal_.take(), req_.body());
            if (written < 0) {
                status = 500;
                answer = fmt::format("cannot write {}\n", req_.body());
            } else {
                answer = fmt::format("{}\n", written);
            }
        } else {
            status = 404;
            answer = "unknown control request\n";
        }
        keep_alive_ = req_.keep_alive();
        control_reply_ = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{}",
                                     status, status == 200 ? "OK" : "Error", answer.size(), answer);
        net::async_write(socket_, net::buffer(control_reply_),
                         [self = shared_from_this()](beast::error_code e, std::size_t) { self->on_written(e); });
    }

    void on_written(beast::error_code ec) {
        if (ec) return;
        if (!keep_alive_) {
            beast::error_code ignored;
            socket_.shutdown(tcp::socket::shutdown_send, ignored);
            return;
        }
        read();
    }

    tcp::socket socket_;
    journal& journal_;
    beast::flat_buffer buffer_;
    http::request<http::string_body> req_;
    std::string control_reply_;
    bool keep_alive_ = true;
};

class server {
public:
    server(net::io_context& ioc, unsigned short port, journal& j) : acceptor_(ioc), journal_(j) {
        const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), port);
        acceptor_.open(ep.protocol());
        acceptor_.set_option(net::socket_base::reuse_address(true));
        acceptor_.bind(ep);
        acceptor_.listen(net::socket_base::max_listen_connections);
    }

    [[nodiscard]] unsigned short port() const { return acceptor_.local_endpoint().port(); }

    void accept() {
        acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
            if (ec == net::error::operation_aborted) return;
            if (!ec) {
                beast::error_code ignored;
                socket.set_option(tcp::no_delay(true), ignored);
                std::make_shared<session>(std::move(socket), journal_)->start();
            }
            accept();
        });
    }

    void close() {
        beast::error_code ignored;
        acceptor_.close(ignored);
    }

private:
    tcp::acceptor acceptor_;
    journal& journal_;
};

[[noreturn]] void usage() {
    std::cerr << "usage: outboxd-bench-receiver [--port N] [--port-file FILE] [--threads N] [--out FILE] [--nats URL]\n";
    std::exit(2);
}

void on_stored(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    const auto at = monotonic_ns();
    const char* id = "";
    (void)natsMsgHeader_Get(msg, "Nats-Msg-Id", &id);
    static_cast<journal*>(closure)->add(
        {at, id, std::string(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)))});
    natsMsg_Destroy(msg);
}

// The connection and subscription live until the process exits.
bool record_stream(const std::string& url, journal& j) {
    natsConnection* nc = nullptr;
    jsCtx* js = nullptr;
    auto s = natsConnection_ConnectTo(&nc, url.c_str());
    if (s == NATS_OK) s = natsConnection_JetStream(&js, nc, nullptr);
    if (s == NATS_OK) {
        const char* subjects[] = {"events.>"};
        jsStreamConfig sc;
        jsStreamConfig_Init(&sc);
        sc.Name = "EVENTS";
        sc.Subjects = subjects;
        sc.SubjectsLen = 1;
        sc.Storage = js_FileStorage;
        jsErrCode jerr = static_cast<jsErrCode>(0);
        jsStreamInfo* si = nullptr;
        s = js_AddStream(&si, js, &sc, nullptr, &jerr);
        if (s == NATS_OK) jsStreamInfo_Destroy(si);
        if (jerr == JSStreamNameExistErr) s = NATS_OK;
    }
    if (s == NATS_OK) {
        jsSubOptions so;
        jsSubOptions_Init(&so);
        so.Stream = "EVENTS";
        so.ManualAck = true;
        so.Config.AckPolicy = js_AckNone;
        so.Config.DeliverPolicy = js_DeliverNew;
        natsSubscription* sub = nullptr;
        s = js_Subscribe(&sub, js, "events.>", on_stored, &j, nullptr, &so, nullptr);
        if (s == NATS_OK) (void)natsSubscription_SetPendingLimits(sub, -1, -1);
    }
    if (s != NATS_OK) {
        std::cerr << "outboxd-bench-receiver: NATS " << url << ": " << natsStatus_GetText(s) << '\n';
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    unsigned short port = 0;
    int threads = 1;
    std::string port_file;
    std::string out;
    std::string nats_url;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (i + 1 >= argc) usage();
        const std::string v = argv[++i];
        if (a == "--port") {
            port = static_cast<unsigned short>(std::stoi(v));
        } else if (a == "--threads") {
            threads = std::max(1, std::stoi(v));
        } else if (a == "--port-file") {
            port_file = v;
        } else if (a == "--out") {
            out = v;
        } else if (a == "--nats") {
            nats_url = v;
        } else {
            usage();
        }
    }

    net::io_context ioc(threads);
    journal j;
    server srv(ioc, port, j);
    srv.accept();
    if (!nats_url.empty() && !record_stream(nats_url, j)) return 1;

    if (!port_file.empty()) {
        // Written whole under a temporary name, then renamed: a reader never
        // sees a half-written port.
        const auto tmp = port_file + ".tmp";
        {
            std::ofstream f(tmp);
            f << srv.port() << '\n';
        }
        std::rename(tmp.c_str(), port_file.c_str());
    }
    std::cout << "listening 127.0.0.1:" << srv.port() << std::endl;

    net::signal_set signals(ioc, SIGINT, SIGTERM);
    signals.async_wait([&](const beast::error_code& ec, int) {
        if (ec) return;
        srv.close();
        ioc.stop();
    });

    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back([&ioc] { ioc.run(); });
    ioc.run();
    for (auto& t : pool) t.join();

    if (!out.empty() && write_records(j.take(), out) < 0) {
        std::cerr << "outboxd-bench-receiver: cannot write " << out << '\n';
        return 1;
    }
    return 0;
}
