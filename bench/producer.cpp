// outboxd-bench-producer: commits benchmark events, one per transaction, and
// remembers when each COMMIT returned (CLOCK_MONOTONIC, comparable with the
// receiver's clock: same machine, system-wide clock).
//
//   outboxd-bench-producer --database-url URL --run TAG --out FILE
//       [--target outboxd|baseline|probe] [--schema NAME] [--topic T] [--keys K]
//       --mode paced --rate R --count C [--connections N]
//       --mode flat  --duration SECONDS  [--connections N]
//       --mode bulk  --count C
//
// Targets:
//   outboxd   SELECT <schema>.enqueue($1, $2::jsonb)   (outboxd's public API)
//   baseline  INSERT INTO baseline.events (topic, payload) ... RETURNING id
//   probe     the same into baseline.commit_probe, which no relay reads: one
//             connection flat out there measures how long a durable commit
//             takes right now on this (shared) disk
// Each event's payload is {"r": TAG, "p": connection, "n": sequence}, so the
// receiver's copy is matched to its commit without trusting the relay.
//
// --keys K (outboxd target only): events get ordering keys "k0".."k<K-1>",
// round-robin over all connections' events (paced: event k has key k % K;
// flat: a connection's n-th event has key (n * connections + p) % K; bulk:
// row g has key g % K), so every key is shared by every connection.
//
// Modes:
//   paced  C events in total at R per second over all connections, on an
//          absolute schedule (a late event is sent at once, not skipped)
//   flat   every connection commits as fast as it can for SECONDS
//   bulk   C events in ONE transaction and one INSERT ... SELECT (the backlog
//          scenario; one commit time for all, latency is not measured)
// Every connection connects and prepares its statement before the clock starts.
//
// Output: FILE gets one line per committed event, `p <TAB> n <TAB> id <TAB>
// commit_ns <TAB> key ("-" for none) <TAB> begin_ns` (begin_ns: just before
// the transaction's BEGIN, so the analysis knows which events of a key must
// arrive in order: one whose COMMIT returned before another began); stdout
// gets one JSON summary line.

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

namespace {

std::int64_t monotonic_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void sleep_until_ns(std::int64_t at) noexcept {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(at / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(at % 1'000'000'000);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
    }
}

enum class target { outboxd, baseline, probe };
enum class mode { paced, flat, bulk };

struct options {
    std::string url;
    target tgt = target::outboxd;
    std::string schema = "outbox";
    std::string topic = "bench";
    mode m = mode::flat;
    int connections = 1;
    double rate = 0;
    long long count = 0;
    double duration_s = 0;
    long long run = 0;
    int keys = 0;  // 0: no ordering keys
    std::string out;
};

struct committed {
    int p;
    long long n;
    long long id;
    std::int64_t at_ns;
    int key;  // -1: none
    std::int64_t begin_ns;
};

struct worker_result {
    std::vector<committed> events;
    long long errors = 0;
    std::string last_error;
};

// Double quotes are the only thing to escape in an identifier.
std::string quote_ident(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"') out.push_back('"');
        out.push_back(c);
    }
    out.push_back('"');
    return out;
}

std::string insert_sql(const options& o) {
    if (o.tgt == target::outboxd && o.keys > 0) {
        return fmt::format("SELECT {}.enqueue($1, $2::jsonb, $3)", quote_ident(o.schema));
    }
    if (o.tgt == target::outboxd) return fmt::format("SELECT {}.enqueue($1, $2::jsonb)", quote_ident(o.schema));
    if (o.tgt == target::baseline) {
        return "INSERT INTO baseline.events (topic, payload) VALUES ($1, $2::jsonb) RETURNING id";
    }
    return "INSERT INTO baseline.commit_probe (topic, payload) VALUES ($1, $2::jsonb) RETURNING id";
}

// One statement, so the outbox's NOTIFY trigger fires once. It inserts into
// the events table directly (a documented part of the installed schema)
// rather than calling enqueue() 100,000 times: the backlog measures the
// relay's drain, and a row-by-row PL/pgSQL load would only make the
// benchmark slower.
std::string bulk_sql(const options& o) {
    const auto table = o.tgt == target::outboxd ? fmt::format("{}.events", quote_ident(o.schema))
                                                : std::string("baseline.events");
    if (o.keys > 0) {
        return fmt::format(
            "INSERT INTO {} (topic, ordering_key, payload) SELECT $1, 'k' || (g % {}), "
            "jsonb_build_object('r', $2::bigint, 'p', 0, 'n', g) "
            "FROM generate_series(0, $3::bigint - 1) g ORDER BY g RETURNING id",
            table, o.keys);
    }
    return fmt::format(
        "INSERT INTO {} (topic, payload) SELECT $1, jsonb_build_object('r', $2::bigint, 'p', 0, 'n', g) "
        "FROM generate_series(0, $3::bigint - 1) g ORDER BY g RETURNING id",
        table);
}

// At most this many failed transactions per connection before it gives up:
// a benchmark against a broken database should end, not spin.
constexpr long long max_errors = 100;

void run_worker(const options& o, int p, std::latch& ready, std::latch& go, const std::int64_t& t0,
                worker_result& res) {
    std::unique_ptr<pqxx::connection> conn;
    try {
        conn = std::make_unique<pqxx::connection>(o.url);
        conn->prepare("ins", insert_sql(o));
    } catch (const std::exception& e) {
        res.errors = 1;
        res.last_error = e.what();
        ready.count_down();
        go.wait();
        return;
    }
    ready.count_down();
    go.wait();

    const std::int64_t start = t0;
    // paced: this connection sends the events k with k % connections == p.
    const double interval_ns = o.m == mode::paced ? 1e9 / o.rate : 0;
    const std::int64_t stop_at = start + static_cast<std::int64_t>(o.duration_s * 1e9);
    res.events.reserve(o.m == mode::paced ? static_cast<std::size_t>(o.count / o.connections + 1) : 1 << 16);

    long long n = 0;
    for (long long k = p;; k += o.connections) {
        if (o.m == mode::paced) {
            if (k >= o.count) break;
            sleep_until_ns(start + static_cast<std::int64_t>(static_cast<double>(k) * interval_ns));
        } else if (monotonic_ns() >= stop_at) {
            break;
        }
        const auto payload = fmt::format(R"({{"r":{},"p":{},"n":{}}})", o.run, p, n);
        const int key = o.keys == 0 ? -1
                        : static_cast<int>((o.m == mode::paced ? k : n * o.connections + p) % o.keys);
        try {
            const auto begin_ns = monotonic_ns();
            pqxx::work tx(*conn);
            const auto row = key < 0 ? tx.exec_prepared1("ins", o.topic, payload)
                                     : tx.exec_prepared1("ins", o.topic, payload, fmt::format("k{}", key));
            const auto id = row[0].as<long long>();
            tx.commit();
            res.events.push_back({p, n, id, monotonic_ns(), key, begin_ns});
        } catch (const pqxx::in_doubt_error& e) {
            // May or may not have committed: if it did, the receiver reports it
            // as an event nobody committed, which the analysis shows.
            ++res.errors;
            res.last_error = e.what();
        } catch (const std::exception& e) {
            ++res.errors;
            res.last_error = e.what();
            if (!conn->is_open()) {
                try {
                    conn = std::make_unique<pqxx::connection>(o.url);
                    conn->prepare("ins", insert_sql(o));
                } catch (const std::exception&) {
                }
            }
        }
        ++n;  // a failed event keeps its number: never reused
        if (res.errors >= max_errors) break;
    }
}

void run_bulk(const options& o, worker_result& res, std::int64_t& start_ns) {
    pqxx::connection conn(o.url);
    start_ns = monotonic_ns();
    pqxx::work tx(conn);
    const auto r = tx.exec_params(bulk_sql(o), o.topic, o.run, o.count);
    tx.commit();
    const auto at = monotonic_ns();
    res.events.reserve(r.size());
    long long n = 0;
    for (const auto& row : r) {
        const int key = o.keys == 0 ? -1 : static_cast<int>(n % o.keys);
        res.events.push_back({0, n, row[0].as<long long>(), at, key, start_ns});
        ++n;
    }
}

[[noreturn]] void usage(std::string_view why) {
    std::cerr << "outboxd-bench-producer: " << why
              << "\nusage: outboxd-bench-producer --database-url URL --run TAG --out FILE [--target outboxd|baseline]\n"
                 "       [--schema NAME] [--topic T] [--connections N] [--keys K]\n"
                 "       --mode paced --rate R --count C | --mode flat --duration S | --mode bulk --count C\n";
    std::exit(2);
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (i + 1 >= argc) usage(fmt::format("{} needs a value", a));
        const std::string v = argv[++i];
        if (a == "--database-url") o.url = v;
        else if (a == "--target") {
            if (v == "outboxd") o.tgt = target::outboxd;
            else if (v == "baseline") o.tgt = target::baseline;
            else if (v == "probe") o.tgt = target::probe;
            else usage("--target is outboxd, baseline or probe");
        } else if (a == "--schema") o.schema = v;
        else if (a == "--topic") o.topic = v;
        else if (a == "--mode") {
            if (v == "paced") o.m = mode::paced;
            else if (v == "flat") o.m = mode::flat;
            else if (v == "bulk") o.m = mode::bulk;
            else usage("--mode is paced, flat or bulk");
        } else if (a == "--connections") o.connections = std::stoi(v);
        else if (a == "--rate") o.rate = std::stod(v);
        else if (a == "--count") o.count = std::stoll(v);
        else if (a == "--duration") o.duration_s = std::stod(v);
        else if (a == "--run") o.run = std::stoll(v);
        else if (a == "--out") o.out = v;
        else if (a == "--keys") o.keys = std::stoi(v);
        else usage(fmt::format("unknown option {}", a));
    }
    if (o.url.empty() || o.out.empty()) usage("--database-url and --out are required");
    if (o.connections < 1 || o.connections > 512) usage("--connections must be 1..512");
    if (o.m == mode::paced && (o.rate <= 0 || o.count <= 0)) usage("paced needs --rate and --count");
    if (o.m == mode::flat && (o.duration_s <= 0 || o.duration_s > 3600)) usage("flat needs --duration (0..3600 s)");
    if (o.m == mode::bulk && o.count <= 0) usage("bulk needs --count");
    if (o.m == mode::bulk && o.tgt == target::probe) usage("bulk has no probe target");
    if (o.keys < 0 || (o.keys > 0 && o.tgt != target::outboxd)) usage("--keys K >= 0, outboxd target only");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse(argc, argv);
    std::vector<worker_result> results;
    std::int64_t start_ns = 0;

    try {
        if (o.m == mode::bulk) {
            results.resize(1);
            run_bulk(o, results[0], start_ns);
        } else {
            results.resize(static_cast<std::size_t>(o.connections));
            std::latch ready(o.connections);
            std::latch go(1);
            std::int64_t t0 = 0;
            std::vector<std::thread> threads;
            threads.reserve(results.size());
            for (int p = 0; p < o.connections; ++p) {
                threads.emplace_back([&, p] { run_worker(o, p, ready, go, t0, results[static_cast<std::size_t>(p)]); });
            }
            ready.wait();
            // Everyone is connected and prepared; the clock starts now. The
            // latch orders this write before the workers read t0.
            t0 = monotonic_ns();
            start_ns = t0;
            go.count_down();
            for (auto& t : threads) t.join();
        }
    } catch (const std::exception& e) {
        std::cerr << "outboxd-bench-producer: " << e.what() << '\n';
        return 1;
    }
    const auto end_ns = monotonic_ns();

    std::FILE* f = std::fopen(o.out.c_str(), "w");
    if (!f) {
        std::cerr << "outboxd-bench-producer: cannot write " << o.out << '\n';
        return 1;
    }
    long long total = 0;
    long long errors = 0;
    std::int64_t last_commit = start_ns;
    std::string last_error;
    for (const auto& r : results) {
        for (const auto& e : r.events) {
            if (e.key < 0) {
                fmt::print(f, "{}\t{}\t{}\t{}\t-\t{}\n", e.p, e.n, e.id, e.at_ns, e.begin_ns);
            } else {
                fmt::print(f, "{}\t{}\t{}\t{}\tk{}\t{}\n", e.p, e.n, e.id, e.at_ns, e.key, e.begin_ns);
            }
            last_commit = std::max(last_commit, e.at_ns);
        }
        total += static_cast<long long>(r.events.size());
        errors += r.errors;
        if (!r.last_error.empty()) last_error = r.last_error;
    }
    if (std::fclose(f) != 0) {
        std::cerr << "outboxd-bench-producer: cannot write " << o.out << '\n';
        return 1;
    }
    // The summary is read by the orchestrator; the error text is for humans.
    std::string err_json;
    for (char c : last_error.substr(0, 200)) {
        if (c == '"' || c == '\\') err_json.push_back('\\');
        err_json.push_back(static_cast<unsigned char>(c) < 0x20 ? ' ' : c);
    }
    fmt::print("{{\"committed\": {}, \"errors\": {}, \"start_ns\": {}, \"last_commit_ns\": {}, \"end_ns\": {}, "
               "\"last_error\": \"{}\"}}\n",
               total, errors, start_ns, last_commit, end_ns, err_json);
    return errors > 0 && total == 0 ? 1 : 0;
}
