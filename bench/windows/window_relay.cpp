// outboxd-bench-windows: a relay prototype of commit-ordered windows
// (issue 14, docs/commit-ordered-windows.md), to measure the design end to
// end on the project benchmark beside today's outboxd. Not production code.
//
//   outboxd-bench-windows --database-url URL --schema S --setup
//       add to an outbox installed by `outboxd migrate --schema S` the
//       column `txid xid8 DEFAULT pg_current_xact_id()`, its (txid, id)
//       index and the cursor table, and put the cursor at the current
//       snapshot (idempotent); then exit
//   outboxd-bench-windows --database-url URL --schema S --url http://HOST:PORT/
//       [--concurrency 32] [--tick-ms 20] [--page 1000] [--max-queued 4000] [--log-reads] [--stats]
//       relay until SIGTERM/SIGINT; --log-reads prints one line per window
//       read to stderr (`ts=<unix s> read_us=<round trip> ids=<n>`), which
//       bench/long_transaction.sh reads; --stats a line a second about
//       the HTTP side (requests, round trips, events waiting behind a key)
//
// What it does, as the design says:
// * reads windows "committed after snapshot A and by snapshot B" with one
//   statement whose own snapshot is B (PgQ membership: the txid range
//   [xmax(A), xmax(B)) plus exact probes for the xids running at A), in id
//   order. A window of at most --page events comes with its events in that
//   one statement; a larger one is read as ids, then fetched by id a page
//   at a time while the events held in memory are under --max-queued;
// * sends unkeyed events at once (the webhook client's pool, --concurrency
//   connections, as outboxd's); keeps one FIFO per ordering key and sends a
//   key's next event only once its previous one got a 2xx;
// * keeps the cursor in memory and writes it to `cursors` as a checkpoint
//   at most once a second (A, and inside a window B and the id below which
//   everything is settled), fenced by the epoch it took at start; nothing is
//   written per event;
// * wakes on the outbox's NOTIFY and polls every --tick-ms besides. It
//   follows outboxd's automatic wake mode (src/core/wake_policy.hpp,
//   sql/0008) so producers pay for NOTIFY in both alike: idle (producers
//   notify) while fewer than 300 events a second come in; busy above that
//   (no NOTIFY; it reads back to back, and 2 ms after a read that found
//   nothing); idle again after 100 ms of empty reads. A producer that read
//   "busy" and commits after that switch is found by the tick (outboxd
//   watches such transactions every 10 ms instead).
//
// Left out (the benchmark never needs them): retries, parked keys, delayed
// events, dead letters (a failed delivery aborts the relay with a message),
// fan-out and routing (one destination), several relays and slots (one
// cursor, slot 0), cleanup by partition, signing, the xid-regression check.
//
// Threads: the main thread does all database work on its own connections;
// one thread runs the io_context of the HTTP client. They share `progress`
// (what is settled, for the checkpoint and the backpressure) under a mutex.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "core/event.hpp"
#include "core/url.hpp"
#include "core/webhook_request.hpp"
#include "http/webhook_client.hpp"

namespace {

namespace net = boost::asio;
using steady = std::chrono::steady_clock;

const std::string destination = "bench";  // the one destination (cursor key)

std::atomic<bool> stop_requested{false};
extern "C" void on_stop_signal(int) { stop_requested = true; }

[[noreturn]] void die(const std::string& why) {
    std::cerr << "outboxd-bench-windows: " << why << std::endl;
    std::_Exit(1);
}

std::string quote_ident(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"') out.push_back('"');
        out.push_back(c);
    }
    out.push_back('"');
    return out;
}

// The statements, with the schema substituted (S = the quoted schema).
std::string sql(std::string_view text, const std::string& schema) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == 'S' && i + 1 < text.size() && text[i + 1] == '.' && (i == 0 || text[i - 1] == ' ')) {
            out += schema;
        } else {
            out.push_back(text[i]);
        }
    }
    return out;
}

constexpr std::string_view setup_sql = R"sql(
ALTER TABLE S.events ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS events_txid_idx ON S.events (txid, id);
CREATE TABLE IF NOT EXISTS S.cursors (
    destination text        NOT NULL,
    slot        integer     NOT NULL,
    snap_a      pg_snapshot NOT NULL,
    snap_b      pg_snapshot,
    done_below  bigint      NOT NULL DEFAULT 0,
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (destination, slot)
);
INSERT INTO S.cursors (destination, slot, snap_a) VALUES ('bench', 0, pg_current_snapshot())
    ON CONFLICT DO NOTHING;
)sql";

// bench/windows/window.sql, read_window: the cursor is the relay's, passed
// in; B is this statement's own snapshot unless a window is being resumed.
// One row with a NULL id when the window is empty, so A can still move to B.
constexpr std::string_view read_window_sql = R"sql(
WITH c AS MATERIALIZED (
    SELECT $1::pg_snapshot AS snap_a, coalesce($2::pg_snapshot, pg_current_snapshot()) AS snap_b,
           $3::bigint AS done_below
)
SELECT w.id, c.snap_b::text
FROM c
LEFT JOIN LATERAL (
    SELECT e.id
    FROM S.events e
    WHERE e.txid >= pg_snapshot_xmax(c.snap_a) AND e.txid < pg_snapshot_xmax(c.snap_b)
      AND pg_visible_in_snapshot(e.txid, c.snap_b)
      AND e.id + 0 >= c.done_below
    UNION ALL
    SELECT e.id
    FROM pg_snapshot_xip(c.snap_a) x
    JOIN S.events e ON e.txid = x
    WHERE pg_visible_in_snapshot(x, c.snap_b)
      AND e.id + 0 >= c.done_below
) w ON true
ORDER BY w.id
)sql";

// The same window with the events themselves, at most $4 rows: a window
// that fits in one page (nearly every window of a live stream) costs one
// round trip instead of two. A larger one is read again as ids (read_window,
// with this B) and fetched in pages, as the design says.
constexpr std::string_view read_small_sql = R"sql(
WITH c AS MATERIALIZED (
    SELECT $1::pg_snapshot AS snap_a, coalesce($2::pg_snapshot, pg_current_snapshot()) AS snap_b,
           $3::bigint AS done_below
)
SELECT w.id, c.snap_b::text, w.topic, w.ordering_key, w.payload::text, w.headers::text
FROM c
LEFT JOIN LATERAL (
    SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers
    FROM S.events e
    WHERE e.txid >= pg_snapshot_xmax(c.snap_a) AND e.txid < pg_snapshot_xmax(c.snap_b)
      AND pg_visible_in_snapshot(e.txid, c.snap_b)
      AND e.id + 0 >= c.done_below
    UNION ALL
    SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers
    FROM pg_snapshot_xip(c.snap_a) x
    JOIN S.events e ON e.txid = x
    WHERE pg_visible_in_snapshot(x, c.snap_b)
      AND e.id + 0 >= c.done_below
) w ON true
ORDER BY w.id
LIMIT $4
)sql";

constexpr std::string_view fetch_page_sql = R"sql(
SELECT e.id, e.topic, e.ordering_key, e.payload::text, e.headers::text
FROM S.events e
WHERE e.id = ANY ($1::bigint[])
ORDER BY e.id
)sql";

// Fenced: a relay that lost the cursor writes nothing (and stops).
constexpr std::string_view checkpoint_sql = R"sql(
UPDATE S.cursors SET snap_a = $3::pg_snapshot, snap_b = $4::pg_snapshot, done_below = $5
WHERE destination = $1 AND slot = 0 AND epoch = $2
)sql";

constexpr std::string_view declare_sql = R"sql(
INSERT INTO S.relay_wake (owner, idle, until) VALUES ($1, $2, now() + interval '60 seconds')
ON CONFLICT (owner) DO UPDATE SET idle = excluded.idle, until = excluded.until
)sql";

struct options {
    std::string url;
    std::string schema = "outbox";
    std::string endpoint;
    bool setup = false;
    std::size_t concurrency = 32;
    int tick_ms = 20;
    std::size_t page = 1000;
    long max_queued = 4000;
    bool log_reads = false;
    bool stats = false;  // a line a second on stderr: requests, their round trips, what waits
};

// One window: its snapshots and the ids read from it that are not settled yet.
struct window_state {
    std::string snap_a;
    std::string snap_b;
    std::set<std::int64_t> unsettled;
    // The first id of the window not handed to the sender yet (max: all read).
    std::int64_t next_unread = 0;
};

// What the checkpoint needs to know, shared by the two threads.
struct progress {
    std::mutex mu;
    std::condition_variable room;  // signalled when an event settles
    std::map<std::uint64_t, window_state> windows;  // by sequence number: in commit order
    std::string settled_a;                          // every window before `windows` is settled
    long queued = 0;                                // handed to the sender, not settled
    std::string failure;                            // set by the sender: stop
};

struct wire_event {
    outboxd::event e;
    std::uint64_t window = 0;
};

// Runs on the io_context's thread only.
class sender {
public:
    sender(net::io_context& ioc, const options& o, std::string id_prefix, progress& prog)
        : client_(ioc, outboxd::parse_endpoint_url(o.endpoint),
                  outboxd::http::client_options{.max_connections = o.concurrency,
                                                .user_agent = fmt::format("outboxd/{}", OUTBOXD_VERSION)}),
          id_prefix_(std::move(id_prefix)),
          prog_(prog),
          stats_(o.stats) {}

    void accept(std::vector<wire_event>&& page) {
        for (auto& w : page) {
            if (!w.e.ordering_key) {
                send(std::move(w));
                continue;
            }
            // A key's events go one at a time, in window order: the head of
            // its FIFO is the one in flight.
            auto& q = keys_[*w.e.ordering_key];
            q.push_back(std::move(w));
            if (q.size() == 1) send_head(q);
        }
    }

    void close() { client_.close(); }

private:
    void send_head(std::deque<wire_event>& q) {
        // The head stays in the FIFO as a placeholder while it is in flight.
        send(wire_event{std::move(q.front().e), q.front().window});
    }

    void send(wire_event&& w) {
        const auto now_s = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
        w.e.attempt = 1;
        auto built = outboxd::build_request_headers(w.e, now_s, id_prefix_);
        if (built.error) fail(fmt::format("event {}: {}", w.e.id, *built.error));
        client_.post(outboxd::http::outgoing_request{std::move(w.e.payload), std::move(built.headers)},
                     [this, id = w.e.id, window = w.window, key = std::move(w.e.ordering_key)](
                         outboxd::http::response_summary r) { done(id, window, key, r); });
    }

    void done(std::int64_t id, std::uint64_t window, const std::optional<std::string>& key,
              const outboxd::http::response_summary& r) {
        if (stats_) count(r);
        if (r.transport_error || r.status < 200 || r.status > 299) {
            fail(fmt::format("event {}: delivery failed ({}): the prototype does not retry", id,
                             r.transport_error ? r.error : fmt::format("HTTP {}", r.status)));
            return;
        }
        {
            std::lock_guard lock(prog_.mu);
            prog_.windows.at(window).unsettled.erase(id);
            --prog_.queued;
        }
        prog_.room.notify_one();
        if (!key) return;
        auto it = keys_.find(*key);
        it->second.pop_front();
        if (it->second.empty()) {
            keys_.erase(it);
        } else {
            send_head(it->second);
        }
    }

    void fail(std::string why) {
        {
            std::lock_guard lock(prog_.mu);
            if (prog_.failure.empty()) prog_.failure = std::move(why);
        }
        prog_.room.notify_one();
    }

    void count(const outboxd::http::response_summary& r) {
        ++requests_;
        total_us_ += r.elapsed.count();
        max_us_ = std::max<std::int64_t>(max_us_, r.elapsed.count());
        const auto now = steady::now();
        if (now - stats_at_ < std::chrono::seconds(1)) return;
        std::size_t waiting = 0;
        for (const auto& [key, q] : keys_) waiting += q.size() - 1;
        std::cerr << fmt::format("stats: requests={} mean_us={} max_us={} in_client={} keys={} waiting_behind_key={}\n",
                                 requests_, total_us_ / std::max<std::int64_t>(1, requests_), max_us_,
                                 client_.in_flight(), keys_.size(), waiting);
        stats_at_ = now;
        requests_ = total_us_ = max_us_ = 0;
    }

    outboxd::http::webhook_client client_;
    std::string id_prefix_;
    progress& prog_;
    std::unordered_map<std::string, std::deque<wire_event>> keys_;
    bool stats_ = false;
    steady::time_point stats_at_ = steady::now();
    std::int64_t requests_ = 0, total_us_ = 0, max_us_ = 0;
};

class wake_receiver final : public pqxx::notification_receiver {
public:
    using pqxx::notification_receiver::notification_receiver;
    void operator()(const std::string&, int) override { woke = true; }
    bool woke = false;
};

std::string ids_literal(const std::vector<std::int64_t>& ids, std::size_t from, std::size_t n) {
    std::string s = "{";
    for (std::size_t i = from; i < from + n; ++i) {
        if (i > from) s.push_back(',');
        s += std::to_string(ids[i]);
    }
    s.push_back('}');
    return s;
}

// GCC 12 at -O2 warns falsely (-Wmaybe-uninitialized) inside nlohmann's iterators.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
outboxd::header_list parse_headers(const std::string& json) {
    outboxd::header_list out;
    if (json == "{}") return out;
    for (const auto& [name, value] : nlohmann::json::parse(json).items()) {
        out.emplace_back(name, value.is_string() ? value.get<std::string>() : value.dump());
    }
    return out;
}
#pragma GCC diagnostic pop

class relay {
public:
    explicit relay(const options& o)
        : o_(o),
          schema_(quote_ident(o.schema)),
          db_(o.url),
          listener_(o.url),
          wake_(listener_, "outboxd." + o.schema),
          owner_(fmt::format("windows-{}", ::getpid())) {
        // Checkpoints and idle declarations may be lost in a crash of the
        // server: a lost checkpoint only means events are sent again.
        db_.set_variable("synchronous_commit", "off");
        db_.prepare("read_window", sql(read_window_sql, schema_));
        db_.prepare("read_small", sql(read_small_sql, schema_));
        db_.prepare("fetch_page", sql(fetch_page_sql, schema_));
        db_.prepare("checkpoint", sql(checkpoint_sql, schema_));
        db_.prepare("declare", sql(declare_sql, schema_));
        pqxx::nontransaction tx(db_);
        const auto prefix = tx.exec1(fmt::format("SELECT {}.message_id(0)", schema_))[0].as<std::string>();
        id_prefix_ = prefix.substr(0, prefix.size() - 1);
        // Take the cursor: a new epoch fences any earlier owner's checkpoints.
        const auto row = tx.exec_params1(
            sql("UPDATE S.cursors SET owner = $2, epoch = epoch + 1 WHERE destination = $1 AND slot = 0 "
                "RETURNING epoch, snap_a::text, snap_b::text, done_below",
                schema_),
            destination, owner_);
        epoch_ = row[0].as<std::int64_t>();
        snap_a_ = row[1].as<std::string>();
        if (!row[2].is_null()) resume_ = {row[2].as<std::string>(), row[3].as<std::int64_t>()};
        prog_.settled_a = snap_a_;
        last_written_ = {snap_a_, row[2].is_null() ? std::string() : row[2].as<std::string>(), row[3].as<std::int64_t>()};
    }

    int run() {
        net::io_context ioc(1);
        auto guard = net::make_work_guard(ioc);
        sender s(ioc, o_, id_prefix_, prog_);
        std::thread io([&ioc] { ioc.run(); });
        // The io thread is joined whatever happens (a database gone at
        // shutdown throws here; a joinable thread's destructor would abort).
        const auto finish = [&] {
            net::post(ioc, [&s] { s.close(); });
            guard.reset();
            ioc.stop();
            io.join();
        };
        try {
            const int rc = loop(ioc, s);
            finish();
            return rc;
        } catch (...) {
            finish();
            throw;
        }
    }

private:
    int loop(net::io_context& ioc, sender& s) {
        declare(true);
        auto last_checkpoint = steady::now();
        auto last_declared = steady::now();
        // outboxd's automatic wake settings: busy_rate, busy_poll, idle_after.
        constexpr std::size_t busy_events_per_100ms = 30;
        constexpr auto busy_poll = std::chrono::milliseconds(2);
        constexpr auto idle_after = std::chrono::milliseconds(100);
        auto bucket_start = steady::now();  // events read in 100 ms buckets: the incoming rate
        std::size_t bucket_events = 0;
        auto last_found = steady::now();
        while (!stop_requested) {
            if (auto f = failure()) die(*f);
            const auto now = steady::now();
            if (now - last_checkpoint >= std::chrono::seconds(1)) {
                checkpoint();
                last_checkpoint = now;
            }
            if (now - last_declared >= std::chrono::seconds(10)) {  // keep relay_wake's row alive
                declare(idle_);
                last_declared = now;
            }
            if (pos_ < ids_.size()) {
                if (!wait_for_room()) continue;
                hand_over_page(ioc, s);
                continue;
            }
            if (now - bucket_start >= std::chrono::milliseconds(100)) {
                bucket_start = now;
                bucket_events = 0;
            }
            const bool found = read_window(ioc, s);
            if (found) {
                last_found = now;
                bucket_events += ids_.size();
                if (idle_ && bucket_events >= busy_events_per_100ms) declare(false);
                continue;
            }
            if (!idle_) {
                if (now - last_found >= idle_after) {
                    declare(true);
                    continue;  // read once more after the declaration
                }
                std::this_thread::sleep_for(busy_poll);
                continue;
            }
            listener_.get_notifs();
            if (wake_.woke) {
                wake_.woke = false;
                continue;
            }
            listener_.await_notification(0, o_.tick_ms * 1000L);
            wake_.woke = false;
        }
        checkpoint();
        pqxx::nontransaction tx(db_);
        tx.exec_params(sql("DELETE FROM S.relay_wake WHERE owner = $1", schema_), owner_);
        return 0;
    }

    std::optional<std::string> failure() {
        std::lock_guard lock(prog_.mu);
        if (prog_.failure.empty()) return std::nullopt;
        return prog_.failure;
    }

    // Until the sender holds fewer than max_queued - page events; false to
    // look at the clock and the stop flag again.
    bool wait_for_room() {
        std::unique_lock lock(prog_.mu);
        return prog_.room.wait_for(lock, std::chrono::milliseconds(100), [&] {
            return !prog_.failure.empty() || prog_.queued + static_cast<long>(o_.page) <= o_.max_queued;
        }) && prog_.failure.empty();
    }

    // Reads the next window (A = the last window's B) and its ids; true when
    // it holds events.
    bool read_window(net::io_context& ioc, sender& s) {
        const auto t0 = steady::now();
        const std::optional<std::string> resume_b = resume_ ? std::optional(resume_->first) : std::nullopt;
        const std::int64_t low = resume_ ? resume_->second : 0;
        resume_.reset();
        pqxx::nontransaction tx(db_);
        auto r = resume_b ? tx.exec_prepared("read_small", snap_a_, *resume_b, low, o_.page + 1)
                          : tx.exec_prepared("read_small", snap_a_, nullptr, low, o_.page + 1);
        const auto snap_b = r[0][1].as<std::string>();
        const bool small = r.size() <= o_.page;
        if (!small) r = tx.exec_prepared("read_window", snap_a_, snap_b, low);
        if (o_.log_reads) {
            const auto us = std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - t0).count();
            const auto unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch());
            std::cerr << fmt::format("ts={:.3f} read_us={} ids={}\n", unix_s.count(), us,
                                     r.size() == 1 && r[0][0].is_null() ? 0 : r.size());
        }
        ids_.clear();
        pos_ = 0;
        for (const auto& row : r) {
            if (!row[0].is_null()) ids_.push_back(row[0].as<std::int64_t>());
        }
        {
            std::lock_guard lock(prog_.mu);
            if (ids_.empty()) {
                if (prog_.windows.empty()) prog_.settled_a = snap_b;
                else prog_.windows.emplace(++window_seq_, window_state{snap_a_, snap_b, {}, max_id});
            } else {
                prog_.windows.emplace(++window_seq_, window_state{snap_a_, snap_b, {}, ids_.front()});
            }
        }
        snap_a_ = snap_b;
        if (small && !ids_.empty()) {
            pos_ = ids_.size();
            post_page(ioc, s, decode_page(r));
        }
        return !ids_.empty();
    }

    void hand_over_page(net::io_context& ioc, sender& s) {
        const auto n = std::min(o_.page, ids_.size() - pos_);
        pqxx::nontransaction tx(db_);
        const auto r = tx.exec_prepared("fetch_page", ids_literal(ids_, pos_, n));
        pos_ += n;
        post_page(ioc, s, decode_page(r, 1));
    }

    // Rows of (id, [B,] topic, ordering_key, payload, headers): `topic` is the
    // topic's column (read_small has B in column 1, fetch_page does not).
    std::vector<wire_event> decode_page(const pqxx::result& r, int topic = 2) const {
        std::vector<wire_event> page;
        page.reserve(r.size());
        for (const auto& row : r) {
            if (row[0].is_null()) continue;
            wire_event w;
            w.e.id = row[0].as<std::int64_t>();
            w.e.topic = row[topic].as<std::string>();
            if (!row[topic + 1].is_null()) w.e.ordering_key = row[topic + 1].as<std::string>();
            w.e.payload = row[topic + 2].as<std::string>();
            w.e.headers = parse_headers(row[topic + 3].as<std::string>());
            w.window = window_seq_;
            page.push_back(std::move(w));
        }
        return page;
    }

    void post_page(net::io_context& ioc, sender& s, std::vector<wire_event> page) {
        {
            std::lock_guard lock(prog_.mu);
            auto& win = prog_.windows.at(window_seq_);
            for (const auto& w : page) win.unsettled.insert(w.e.id);
            win.next_unread = pos_ < ids_.size() ? ids_[pos_] : max_id;
            prog_.queued += static_cast<long>(page.size());
        }
        net::post(ioc, [&s, page = std::move(page)]() mutable { s.accept(std::move(page)); });
    }

    // Writes the cursor if it moved: the oldest window not yet settled (its
    // A and B, and the id below which it is settled), or the last B.
    void checkpoint() {
        std::tuple<std::string, std::string, std::int64_t> c;
        {
            std::lock_guard lock(prog_.mu);
            auto& ws = prog_.windows;
            while (!ws.empty() && ws.begin()->second.unsettled.empty() && ws.begin()->second.next_unread == max_id) {
                prog_.settled_a = ws.begin()->second.snap_b;
                ws.erase(ws.begin());
            }
            if (ws.empty()) {
                c = {prog_.settled_a, std::string(), 0};
            } else {
                const auto& w = ws.begin()->second;
                const auto low = w.unsettled.empty() ? w.next_unread : std::min(*w.unsettled.begin(), w.next_unread);
                c = {w.snap_a, w.snap_b, low};
            }
        }
        if (c == last_written_) return;
        pqxx::nontransaction tx(db_);
        const auto& [a, b, low] = c;
        const auto r = b.empty() ? tx.exec_prepared("checkpoint", destination, epoch_, a, nullptr, 0)
                                 : tx.exec_prepared("checkpoint", destination, epoch_, a, b, low);
        if (r.affected_rows() != 1) die("the cursor was taken over (epoch moved): stopping");
        last_written_ = c;
    }

    void declare(bool idle) {
        pqxx::nontransaction tx(db_);
        tx.exec_prepared("declare", owner_, idle);
        idle_ = idle;
    }

    static constexpr std::int64_t max_id = std::numeric_limits<std::int64_t>::max();

    const options& o_;
    std::string schema_;
    pqxx::connection db_;
    pqxx::connection listener_;  // LISTEN only, never a query: notifications are not buffered behind one
    wake_receiver wake_;
    std::string owner_;
    std::string id_prefix_;
    std::int64_t epoch_ = 0;
    std::string snap_a_;  // the in-memory cursor: B of the last window read
    std::optional<std::pair<std::string, std::int64_t>> resume_;  // a checkpointed window to finish first
    std::vector<std::int64_t> ids_;  // the current window's ids, in id order
    std::size_t pos_ = 0;            // ids_ before this were handed to the sender
    std::uint64_t window_seq_ = 0;
    bool idle_ = true;
    progress prog_;
    std::tuple<std::string, std::string, std::int64_t> last_written_;
};

[[noreturn]] void usage(std::string_view why) {
    std::cerr << "outboxd-bench-windows: " << why
              << "\nusage: outboxd-bench-windows --database-url URL [--schema S] --setup\n"
                 "       outboxd-bench-windows --database-url URL [--schema S] --url ENDPOINT [--concurrency N]\n"
                 "                             [--tick-ms MS] [--page N] [--max-queued N] [--log-reads] [--stats]\n";
    std::exit(2);
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--setup" || a == "--log-reads" || a == "--stats") {
            (a == "--setup" ? o.setup : a == "--stats" ? o.stats : o.log_reads) = true;
            continue;
        }
        if (i + 1 >= argc) usage(fmt::format("{} needs a value", a));
        const std::string v = argv[++i];
        if (a == "--database-url") o.url = v;
        else if (a == "--schema") o.schema = v;
        else if (a == "--url") o.endpoint = v;
        else if (a == "--concurrency") o.concurrency = std::stoul(v);
        else if (a == "--tick-ms") o.tick_ms = std::stoi(v);
        else if (a == "--page") o.page = std::stoul(v);
        else if (a == "--max-queued") o.max_queued = std::stol(v);
        else usage(fmt::format("unknown option {}", a));
    }
    if (o.url.empty()) usage("--database-url is required");
    if (!o.setup && o.endpoint.empty()) usage("--url is required");
    if (o.page < 1 || o.max_queued < static_cast<long>(o.page) || o.tick_ms < 1) usage("bad --page/--max-queued/--tick-ms");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse(argc, argv);
    try {
        if (o.setup) {
            pqxx::connection c(o.url);
            pqxx::work tx(c);
            tx.exec(sql(setup_sql, quote_ident(o.schema)));
            tx.commit();
            return 0;
        }
        ::signal(SIGTERM, on_stop_signal);
        ::signal(SIGINT, on_stop_signal);
        relay r(o);
        return r.run();
    } catch (const std::exception& e) {
        die(e.what());
    }
}
