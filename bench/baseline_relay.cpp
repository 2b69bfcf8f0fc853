// outboxd-bench-baseline: the textbook outbox relay, as tutorials write it,
// so that the benchmark can report outboxd's figures as ratios to it.
//
//   outboxd-bench-baseline --database-url URL --setup
//       create schema `baseline` with its events table (idempotent) and exit;
//       also the benchmark's commit-latency probe table
//   outboxd-bench-baseline --database-url URL --url http://HOST:PORT/PATH
//       [--batch 100] [--interval-ms 500] [--max-runtime-s 3600]
//       relay until SIGTERM/SIGINT (then finish the batch in hand, exit 0)
//
// The loop, deliberately unoptimised (it is the yardstick, not a rival):
//   BEGIN;
//   SELECT id, payload FROM baseline.events WHERE published_at IS NULL
//     ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED;
//   POST each event in turn over one keep-alive connection, waiting for each
//     response (synchronous Beast client);
//   UPDATE baseline.events SET published_at = now() WHERE id = ANY(delivered);
//   COMMIT;
//   a full batch: go again at once; otherwise sleep 500 ms.
// Row locks and the transaction stay open across the HTTP calls, and
// published rows stay in the table, exactly as in the tutorials.
//
// The sync client has no deadlines (Asio's blocking calls ignore
// SO_RCVTIMEO); the receiver is local and always answers, and the benchmark
// bounds the relay's life from outside (SIGTERM, then SIGKILL).

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <signal.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <pqxx/pqxx>

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

constexpr std::string_view setup_sql = R"sql(
CREATE SCHEMA IF NOT EXISTS baseline;
CREATE TABLE IF NOT EXISTS baseline.events (
    id           bigserial   PRIMARY KEY,
    topic        text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX IF NOT EXISTS events_unpublished_idx ON baseline.events (id) WHERE published_at IS NULL;
-- Not part of the relay: the benchmark's commit-latency probe writes here.
CREATE TABLE IF NOT EXISTS baseline.commit_probe (
    id      bigserial PRIMARY KEY,
    topic   text      NOT NULL,
    payload jsonb     NOT NULL
);
)sql";

constexpr std::string_view claim_sql =
    "SELECT id, topic, payload::text FROM baseline.events WHERE published_at IS NULL "
    "ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED";
constexpr std::string_view mark_sql = "UPDATE baseline.events SET published_at = now() WHERE id = ANY($1::bigint[])";

struct options {
    std::string dsn;
    bool setup = false;
    std::string host;
    std::string port = "80";
    std::string target = "/";
    long long batch = 100;
    int interval_ms = 500;
    int max_runtime_s = 3600;
};

// SIGINT/SIGTERM are blocked and read synchronously: the sleep between polls
// is a sigtimedwait, so a signal ends the sleep at once and never interrupts
// a statement or a request half way.
sigset_t stop_signals() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    return s;
}

// Waits up to `ms` for a stop signal; true if one arrived.
bool stop_requested(int ms) {
    const sigset_t s = stop_signals();
    timespec ts{};
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = static_cast<long>(ms % 1000) * 1'000'000;
    for (;;) {
        const int sig = sigtimedwait(&s, nullptr, &ts);
        if (sig > 0) return true;
        if (errno == EINTR) continue;  // another signal; the wait restarts (bounded by rare signals)
        return false;                  // EAGAIN: timed out
    }
}

class http_sender {
public:
    explicit http_sender(const options& o) : opts_(o), socket_(ioc_) {}

    // POSTs one event and waits for the answer; true on 2xx.
    bool post(std::string_view id, std::string_view topic, std::string body) {
        beast::error_code ec;
        if (!socket_.is_open()) {
            tcp::resolver resolver(ioc_);
            const auto results = resolver.resolve(opts_.host, opts_.port, ec);
            if (ec) return fail("resolve", ec);
            net::connect(socket_, results, ec);
            if (ec) return fail("connect", ec);
            socket_.set_option(tcp::no_delay(true), ec);
        }
        http::request<http::string_body> req{http::verb::post, opts_.target, 11};
        req.set(http::field::host, opts_.host + ":" + opts_.port);
        req.set(http::field::content_type, "application/json");
        req.set("webhook-id", beast::string_view(id.data(), id.size()));
        req.set("outbox-topic", beast::string_view(topic.data(), topic.size()));
        req.body() = std::move(body);
        req.prepare_payload();
        http::write(socket_, req, ec);
        if (ec) return fail("write", ec);
        http::response<http::string_body> res;
        http::read(socket_, buffer_, res, ec);
        if (ec) return fail("read", ec);
        if (!res.keep_alive()) close();
        return res.result_int() >= 200 && res.result_int() < 300;
    }

private:
    bool fail(std::string_view what, const beast::error_code& ec) {
        std::cerr << "outboxd-bench-baseline: http " << what << ": " << ec.message() << '\n';
        close();
        return false;
    }
    void close() {
        beast::error_code ignored;
        socket_.close(ignored);
        buffer_.clear();
    }

    const options& opts_;
    net::io_context ioc_;
    tcp::socket socket_;
    beast::flat_buffer buffer_;
};

std::string array_literal(const std::vector<long long>& ids) {
    std::string out = "{";
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) out.push_back(',');
        out += std::to_string(ids[i]);
    }
    out.push_back('}');
    return out;
}

int relay(const options& o) {
    http_sender sender(o);
    std::unique_ptr<pqxx::connection> conn;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.max_runtime_s);
    while (std::chrono::steady_clock::now() < deadline) {
        if (stop_requested(0)) return 0;
        std::size_t got = 0;
        try {
            if (!conn || !conn->is_open()) {
                conn = std::make_unique<pqxx::connection>(o.dsn);
                conn->prepare("claim", std::string(claim_sql));
                conn->prepare("mark", std::string(mark_sql));
            }
            pqxx::work tx(*conn);
            const auto rows = tx.exec_prepared("claim", o.batch);
            got = rows.size();
            std::vector<long long> delivered;
            delivered.reserve(got);
            for (const auto& row : rows) {
                const auto id = row[0].as<long long>();
                if (!sender.post(row[0].c_str(), row[1].c_str(), std::string(row[2].c_str(), row[2].size()))) break;
                delivered.push_back(id);
            }
            if (!delivered.empty()) tx.exec_prepared("mark", array_literal(delivered));
            tx.commit();
            if (delivered.size() < got) got = 0;  // an HTTP failure: back off like an empty poll
        } catch (const std::exception& e) {
            std::cerr << "outboxd-bench-baseline: " << e.what() << '\n';
            conn.reset();
            got = 0;
        }
        if (static_cast<long long>(got) < o.batch && stop_requested(o.interval_ms)) return 0;
    }
    std::cerr << "outboxd-bench-baseline: --max-runtime-s reached\n";
    return 0;
}

[[noreturn]] void usage(std::string_view why) {
    std::cerr << "outboxd-bench-baseline: " << why
              << "\nusage: outboxd-bench-baseline --database-url URL (--setup | --url http://HOST:PORT/PATH)\n"
                 "       [--batch 100] [--interval-ms 500] [--max-runtime-s 3600]\n";
    std::exit(2);
}

void parse_url(std::string_view url, options& o) {
    constexpr std::string_view scheme = "http://";
    if (!url.starts_with(scheme)) usage("--url must start with http://");
    url.remove_prefix(scheme.size());
    const auto slash = url.find('/');
    const auto authority = url.substr(0, slash);
    o.target = slash == std::string_view::npos ? "/" : std::string(url.substr(slash));
    const auto colon = authority.rfind(':');
    o.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) o.port = std::string(authority.substr(colon + 1));
    if (o.host.empty()) usage("--url has no host");
}

options parse(int argc, char** argv) {
    options o;
    bool have_url = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--setup") {
            o.setup = true;
            continue;
        }
        if (i + 1 >= argc) usage(fmt::format("{} needs a value", a));
        const std::string v = argv[++i];
        if (a == "--database-url") o.dsn = v;
        else if (a == "--url") {
            parse_url(v, o);
            have_url = true;
        } else if (a == "--batch") o.batch = std::stoll(v);
        else if (a == "--interval-ms") o.interval_ms = std::stoi(v);
        else if (a == "--max-runtime-s") o.max_runtime_s = std::stoi(v);
        else usage(fmt::format("unknown option {}", a));
    }
    if (o.dsn.empty()) usage("--database-url is required");
    if (!o.setup && !have_url) usage("--url is required");
    if (o.batch < 1 || o.interval_ms < 0 || o.max_runtime_s < 1) usage("bad --batch, --interval-ms or --max-runtime-s");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse(argc, argv);
    try {
        if (o.setup) {
            pqxx::connection conn(o.dsn);
            pqxx::work tx(conn);
            tx.exec(std::string(setup_sql));
            tx.commit();
            return 0;
        }
    } catch (const std::exception& e) {
        std::cerr << "outboxd-bench-baseline: setup failed: " << e.what() << '\n';
        return 1;
    }
    const sigset_t s = stop_signals();
    sigprocmask(SIG_BLOCK, &s, nullptr);
    return relay(o);
}
