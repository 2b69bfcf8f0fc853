#include "app/commands.hpp"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "app/cli.hpp"
#include "app/exit_codes.hpp"
#include "app/relay.hpp"
#include "core/config.hpp"
#include "core/consume_choice.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/embedded_sql.hpp"
#include "core/integer.hpp"
#include "core/log.hpp"
#include "core/migration_set.hpp"
#include "core/pgoutput.hpp"
#include "core/redact.hpp"
#include "core/routing.hpp"
#include "core/signing.hpp"
#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "core/topic_pattern.hpp"
#include "pg/named_queries.hpp"
#include "pg/conninfo.hpp"
#include "pg/consume_setup.hpp"
#include "pg/dead_letters.hpp"
#include "pg/producer.hpp"
#include "pg/status.hpp"
#include "pg/migrator.hpp"
#include "pg/named_queries.hpp"

namespace outboxd::app {
namespace {

std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
}

std::string option_or_env(const parsed_args& args, std::string_view option, const char* env_name,
                          std::optional<std::string> fallback = std::nullopt) {
    if (auto v = args.get(option)) return *v;
    if (auto v = env(env_name)) return *v;
    if (fallback) return *fallback;
    throw fatal_error(exit_usage, fmt::format("missing --{} (or {})", option, env_name));
}

template <typename F>
auto usage_checked(std::string_view option, F&& parse) {
    try {
        return parse();
    } catch (const std::invalid_argument& e) {
        throw fatal_error(exit_usage, fmt::format("--{}: {}", option, e.what()));
    }
}

std::int64_t integer_option(const parsed_args& args, std::string_view option, std::int64_t fallback, std::int64_t min,
                            std::int64_t max) {
    const auto text = args.get(option);
    if (!text) return fallback;
    return usage_checked(option, [&] { return parse_integer(*text, min, max); });
}

std::chrono::milliseconds duration_option(const parsed_args& args, std::string_view option,
                                          std::chrono::milliseconds fallback) {
    const auto text = args.get(option);
    if (!text) return fallback;
    return usage_checked(option, [&] { return parse_duration(*text); });
}

// Every secret the configuration holds, for the log's last line of defence.
std::vector<std::string> secrets_of(const config& c) {
    std::vector<std::string> out;
    if (auto pw = password_of(c.database_url)) out.push_back(std::move(*pw));
    for (const auto& d : c.destinations) {
        for (const auto& s : d.signing_secrets) out.push_back(base64_encode(s.key()));
        for (auto& s : quotable_secrets(d)) out.push_back(std::move(s));
    }
    return out;
}

// The effective configuration: the --config file (or OUTBOXD_CONFIG), then
// OUTBOXD_* variables, then flags. Any error is a usage error (exit 2).
config load_config(const parsed_args& args, bool destinations_required, bool database_required = true) {
    config_sources sources;
    auto path = args.get("config");
    if (!path) path = env("OUTBOXD_CONFIG");
    if (path) {
        std::ifstream in(*path, std::ios::binary);
        if (!in) {
            throw fatal_error(exit_usage,
                              fmt::format("cannot read the configuration file {}: {}", *path, std::strerror(errno)));
        }
        sources.file_text.emplace(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        sources.file_name = *path;
    }
    sources.env = [](std::string_view name) { return env(std::string(name).c_str()); };
    sources.flags = [&args](std::string_view flag) { return args.all(flag); };
    sources.database_url_error = [](const std::string& url) { return pg::conninfo_error(url); };
    sources.destinations_required = destinations_required;
    sources.database_required = database_required;
    try {
        auto c = resolve_config(sources);
        log::set_level(log::parse_level(c.log_level));
        log::set_format(log::parse_format(c.log_format));
        log::never_show(secrets_of(c));
        return c;
    } catch (const config_error& e) {
        throw fatal_error(exit_usage, e.what());
    }
}

// The connection string outboxd uses: the configured one, naming itself in
// pg_stat_activity, bounding connection attempts (a black-holed host is
// reported instead of hanging) and giving up on a silent database in seconds.
std::string effective_dsn(const config& c) {
    return with_connection_defaults(c.database_url, c.db_connect_timeout, c.db_keepalive_timeout);
}

// Schema and connection string of the commands that only talk to the database.
struct database_target {
    std::string schema;
    std::string dsn;
};

database_target database_of(const parsed_args& args) {
    const auto c = load_config(args, /*destinations_required=*/false);
    return {c.schema, effective_dsn(c)};
}

std::unique_ptr<pqxx::connection> connect(const std::string& dsn) {
    try {
        return std::make_unique<pqxx::connection>(dsn);
    } catch (const std::exception& e) {
        throw database_unavailable(e, dsn);
    }
}

// ---- commands -------------------------------------------------------------

int cmd_sql(const parsed_args& args) {
    // The schema as `migrate` would see it (flag, OUTBOXD_SCHEMA, the
    // configuration file); no database is needed to print SQL.
    const auto schema = load_config(args, /*destinations_required=*/false, /*database_required=*/false).schema;
    std::string bootstrap;
    for (const auto& query : embedded::queries()) {
        if (query.name == "bootstrap") bootstrap = query.sql;
    }
    std::cout << migration_script(schema, bootstrap, embedded::migrations());
    return exit_ok;
}

int cmd_migrate(const parsed_args& args) {
    const auto [schema, dsn] = database_of(args);
    auto conn = connect(dsn);
    try {
        const auto result = pg::migrate(*conn, schema);
        log::info(result.applied.empty() ? "outbox is up to date" : "outbox migrated",
                  {{"schema", schema}, {"version", fmt::format("{}", result.version)},
                   {"applied", fmt::format("{}", result.applied.size())}});
        return exit_ok;
    } catch (const pg::schema_too_new& e) {
        throw fatal_error(exit_schema_too_new, e.what());
    } catch (const pqxx::broken_connection& e) {
        throw database_unavailable(e, dsn);
    }
}

// Maps "the outbox is not there" and "older than this binary" (a column a
// later migration adds) to exit 4; other errors pass through.
template <typename F>
auto with_installed_outbox(const std::string& schema, F&& f) {
    try {
        return f();
    } catch (const pqxx::sql_error& err) {
        const auto& state = err.sqlstate();
        if (state == "42883" || state == "42P01" || state == "3F000") {
            throw fatal_error(exit_schema_missing,
                              fmt::format("the outbox is not installed in schema {}; run `outboxd migrate`",
                                          quote_ident(schema)));
        }
        if (state == "42703") {
            throw fatal_error(exit_schema_missing,
                              fmt::format("the outbox in schema {} is older than this binary; run `outboxd migrate`",
                                          quote_ident(schema)));
        }
        throw;
    }
}

// Runs f(tx, schema) in one transaction on the configured outbox: a database
// that cannot be reached is exit 3, an outbox that is not there exit 4.
// Returns the schema.
template <typename F>
std::string in_outbox_transaction(const parsed_args& args, F&& f) {
    const auto [schema, dsn] = database_of(args);
    auto conn = connect(dsn);
    try {
        with_installed_outbox(schema, [&] {
            pqxx::work tx(*conn);
            f(tx, schema);
            tx.commit();
        });
    } catch (const pqxx::broken_connection& e) {
        throw database_unavailable(e, dsn);
    }
    return schema;
}

// Installs or removes the wake-up triggers (README "Wake-up modes"), in one
// transaction.
int cmd_wake_trigger(const parsed_args& args) {
    namespace q = pg::q;
    const bool install = args.subcommand == "install";
    const auto schema = in_outbox_transaction(args, [&](pqxx::work& tx, const std::string& name) {
        const pg::query_book book(name);
        tx.exec(book.sql<q::wake_trigger_drop_events>());
        tx.exec(book.sql<q::wake_trigger_drop_deliveries>());
        if (install) tx.exec(book.sql<q::wake_triggers_create>());
    });
    log::info(install ? "wake-up trigger installed" : "wake-up trigger removed", {{"schema", schema}});
    return exit_ok;
}

// The statements that put the database in the state relay.wake = MODE needs
// (README "Wake-up modes"): the notify triggers for auto and notify, the
// publication the WAL stream reads for wal, neither for poll. Publication DDL
// is transactional: all of it commits or none.
//
// column_lists (PostgreSQL 15 and later): the publication sends only the key
// of each inserted row; the wake-up needs no more, and the server's WAL
// sender then never renders payloads and headers as text.
std::vector<std::string> wake_setup_statements(const std::string& schema, const std::string& mode,
                                               bool column_lists) {
    const pg::query_book book(schema);
    namespace q = pg::q;
    const auto publication = quote_ident(pgoutput::publication_name(schema));
    std::vector<std::string> out{book.bare_sql<q::wake_trigger_drop_events>(),
                                 book.bare_sql<q::wake_trigger_drop_deliveries>(),
                                 fmt::format("DROP PUBLICATION IF EXISTS {};", publication)};
    if (mode == "auto" || mode == "notify") {
        out.push_back(book.bare_sql<q::wake_triggers_create>());
    } else if (mode == "wal") {
        // Inserts only: the relay wakes for new work, never for its own
        // updates and deletes. deliveries too, as the trigger did: a dead
        // letter replayed to one destination comes back there.
        out.push_back(fmt::format("CREATE PUBLICATION {} FOR TABLE {}.events{}, {}.deliveries{} "
                                  "WITH (publish = 'insert');",
                                  publication, quote_ident(schema), column_lists ? " (id)" : "", quote_ident(schema),
                                  column_lists ? " (event_id)" : ""));
    }
    return out;
}

int cmd_wake_setup(const parsed_args& args) {
    const auto& mode = args.subcommand;
    if (args.flag("print")) {
        const auto schema = load_config(args, /*destinations_required=*/false, /*database_required=*/false).schema;
        // No schema name in the comments: a name with a line break in it would end the comment.
        fmt::print("-- outboxd wake-setup {}\n", mode);
        if (mode == "wal") fmt::print("-- (PostgreSQL 13 and 14: without the column lists (id) and (event_id))\n");
        fmt::print("BEGIN;\n");
        for (const auto& statement : wake_setup_statements(schema, mode, /*column_lists=*/true)) {
            fmt::print("{}\n", statement);
        }
        fmt::print("COMMIT;\n");
        return exit_ok;
    }
    const auto schema = in_outbox_transaction(args, [&](pqxx::work& tx, const std::string& name) {
        const bool column_lists =
            tx.exec("SELECT current_setting('server_version_num')::int >= 150000")[0][0].as<bool>();
        for (const auto& statement : wake_setup_statements(name, mode, column_lists)) tx.exec(statement);
    });
    log::info("wake-up set up", {{"schema", schema}, {"mode", mode}});
    return exit_ok;
}

// Puts in the database what relay.consume = MODE needs (README
// "Consumption modes"), in one transaction. Taking the txid default away
// while a windows relay runs would hide every later event from its windows:
// refused, checked in the transaction that holds the events table's lock.
// Exit 8 while a relay reading windows is alive on this outbox: what the
// caller is about to change would pull the ground from under it.
void refuse_while_windows_relays_run(pqxx::work& tx, const pg::query_book& book, std::string_view what_to_do) {
    const auto relays = tx.exec(book.sql<pg::q::windows_relays_alive>())[0][0].as<long long>();
    if (relays > 0) {
        throw fatal_error(exit_db_unsuitable,
                          fmt::format("{} relay(s) with relay.consume = \"windows\" are running on this outbox; {}",
                                      relays, what_to_do));
    }
}

int cmd_consume_setup(const parsed_args& args) {
    const auto& mode = args.subcommand;
    if (args.flag("print")) {
        const auto schema = load_config(args, /*destinations_required=*/false, /*database_required=*/false).schema;
        fmt::print("-- outboxd consume-setup {}\nBEGIN;\n", mode);
        for (const auto& statement : pg::consume_setup_statements(schema, mode)) fmt::print("{}\n", statement);
        fmt::print("COMMIT;\n");
        return exit_ok;
    }
    const auto schema = in_outbox_transaction(args, [&](pqxx::work& tx, const std::string& name) {
        for (const auto& statement : pg::consume_setup_statements(name, mode)) tx.exec(statement);
        if (mode == "claims") {
            refuse_while_windows_relays_run(tx, pg::query_book(name),
                                            "stop them, or restart them with relay.consume = \"claims\", then run "
                                            "`outboxd consume-setup claims` again");
        }
    });
    log::info("consumption set up", {{"schema", schema}, {"mode", mode}});
    return exit_ok;
}

// Forgets every window cursor (README "Consumption modes"): the next windows
// relay starts from the beginning of the outbox. Under a lock that keeps
// relays from taking or writing cursors until it commits, and only while
// none runs: a running relay would go on from the position it holds in
// memory, and its next checkpoint would find no row.
int cmd_cursor_reset(const parsed_args& args) {
    long long removed = 0;
    const auto schema = in_outbox_transaction(args, [&](pqxx::work& tx, const std::string& name) {
        const pg::query_book book(name);
        tx.exec(book.sql<pg::q::cursors_lock>());
        refuse_while_windows_relays_run(tx, book, "stop every relay, then run `outboxd cursor reset` again");
        removed = tx.exec(book.sql<pg::q::cursors_reset>())[0][0].as<long long>();
    });
    log::info("window cursors reset: the next windows relay reads every event still in the outbox",
              {{"schema", schema}, {"cursors", fmt::format("{}", removed)}});
    return exit_ok;
}

int cmd_enqueue(const parsed_args& args) {
    const auto [schema, dsn] = database_of(args);
    pg::new_event e;
    e.topic = option_or_env(args, "topic", "OUTBOXD_TOPIC");
    if (auto p = args.get("payload")) {
        e.payload = *p;
    } else {
        e.payload.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    // Validated, never re-serialised: the text reaches PostgreSQL as given,
    // so numbers keep every digit (jsonb stores them exactly).
    if (!nlohmann::json::accept(e.payload)) {
        try {
            const auto for_its_message = nlohmann::json::parse(e.payload);
            (void)for_its_message;
        } catch (const nlohmann::json::parse_error& err) {
            throw fatal_error(exit_invalid_input, fmt::format("payload is not valid JSON: {}", err.what()));
        }
    }
    e.ordering_key = args.get("key");
    e.idempotency_key = args.get("idempotency-key");
    nlohmann::json headers = nlohmann::json::object();
    for (const auto& h : args.all("header")) {
        const auto eq = h.find('=');
        if (eq == std::string::npos || eq == 0) {
            throw fatal_error(exit_usage, fmt::format("--header: expected NAME=VALUE, got '{}'", h));
        }
        headers[h.substr(0, eq)] = h.substr(eq + 1);
    }
    e.headers = headers.dump();
    e.delay = duration_option(args, "delay", std::chrono::milliseconds(0));

    pg::producer producer(dsn, schema);
    try {
        producer.connect();
    } catch (const std::exception& err) {
        throw database_unavailable(err, dsn);
    }
    try {
        // Read before the event is written: once it is committed, nothing
        // may fail the command (a retrying script would enqueue it twice).
        const auto prefix = with_installed_outbox(schema, [&] { return producer.message_prefix(); });
        const auto id = with_installed_outbox(schema, [&] { return producer.enqueue(e); });
        // The id on stdout (for scripts), and the webhook-id consumers will see.
        std::cout << id << '\n';
        log::info("enqueued", {{"event_id", fmt::format("{}", id)}, {"message_id", fmt::format("{}{}", prefix, id)}});
        return exit_ok;
    } catch (const pqxx::sql_error& err) {
        // Class 22 (data exception) and 23 (integrity constraint): bad input.
        const auto& state = err.sqlstate();
        if (state.starts_with("22") || state.starts_with("23")) {
            throw fatal_error(exit_invalid_input, fmt::format("event refused: {}", primary_message(err.what())));
        }
        throw;
    }
}

// ---- status -----------------------------------------------------------------

// Counts of one row of `outboxd status` (a topic, or a destination).
struct status_counts {
    std::int64_t pending = 0;
    std::int64_t waiting_on_key = 0;
    std::int64_t scheduled = 0;
    std::int64_t in_flight = 0;
    std::int64_t retrying = 0;
    std::int64_t dead = 0;
    double oldest_pending_seconds = 0;
    std::optional<std::string> last_error;

    void add(const pg::work_status& w, bool name_destination) {
        pending += w.pending;
        waiting_on_key += w.waiting_on_key;
        scheduled += w.scheduled;
        in_flight += w.in_flight;
        retrying += w.retrying;
        dead += w.dead;
        oldest_pending_seconds = std::max(oldest_pending_seconds, w.oldest_pending_seconds);
        if (!last_error && w.last_error) {
            last_error = name_destination && w.destination ? fmt::format("{}: {}", *w.destination, *w.last_error)
                                                           : *w.last_error;
        }
    }
    [[nodiscard]] nlohmann::json json() const {
        nlohmann::json j{{"pending", pending},     {"waiting_on_key", waiting_on_key},
                         {"scheduled", scheduled}, {"in_flight", in_flight},
                         {"retrying", retrying},   {"dead", dead},
                         {"oldest_pending_seconds", oldest_pending_seconds}};
        j["last_error"] = last_error ? nlohmann::json(*last_error) : nlohmann::json();
        return j;
    }
};

// Work of events not fanned out, without the routes to tell whose it is.
constexpr std::string_view unrouted_bucket = "*";
constexpr std::string_view no_route_bucket = "(no route)";

struct status_view {
    std::map<std::string, status_counts> topics;
    std::map<std::string, status_counts> destinations;
    std::map<std::string, std::string> circuits;  // destination -> what the live relays report
    std::optional<windows_report> windows;        // nullopt: read by claims
    // The live relays (with live leases: registered in `relays`), and how
    // many of them claim and read windows (sql/0015; older ones say neither).
    std::int64_t live_relays = 0;
    std::int64_t claiming_relays = 0;
    std::int64_t windows_relays = 0;
    // What a relay with relay.consume = "auto" (and live leases) started now
    // would choose: whether an outbox will switch, and why not yet.
    consume_choice auto_choice;
};

status_view read_status(pqxx::connection& conn, const config& c) {
    status_view v;
    const auto work = pg::outbox_status(conn, c.schema);
    std::optional<route_table> routes;
    if (!c.destinations.empty()) routes.emplace(c);
    for (const auto& d : c.destinations) v.destinations[d.name];  // every configured one, idle or not
    for (const auto& w : work) {
        v.topics[w.topic].add(w, true);
        if (w.destination) {
            v.destinations[*w.destination].add(w, false);
        } else if (!routes) {
            v.destinations[std::string(unrouted_bucket)].add(w, false);
        } else if (const auto to = routes->match(w.topic); to.empty()) {
            v.destinations[std::string(no_route_bucket)].add(w, false);
        } else {
            for (const auto i : to) v.destinations[c.destinations[i].name].add(w, false);
        }
    }
    const auto reports = pg::published_circuits(conn, c.schema);
    v.live_relays = reports.live_relays;
    v.claiming_relays = reports.claiming;
    v.windows_relays = reports.windows;
    consume_facts facts;
    facts.windows_set_up = pg::outbox_windows_set_up(conn, c.schema);
    facts.live_relay_modes.assign(static_cast<std::size_t>(reports.claiming), "claims");
    facts.live_relay_modes.insert(facts.live_relay_modes.end(), static_cast<std::size_t>(reports.windows), "windows");
    facts.live_relay_modes.insert(facts.live_relay_modes.end(),
                                  static_cast<std::size_t>(reports.live_relays - reports.claiming - reports.windows), "");
    v.auto_choice = choose_consume_mode(facts);
    for (auto& [name, counts] : v.destinations) {
        if (name == unrouted_bucket || name == no_route_bucket) continue;
        std::int64_t open = 0;
        for (const auto& r : reports.destinations) open += r.destination == name ? r.open : 0;
        v.circuits[name] = reports.live_relays == 0 ? "-"
                           : open == 0              ? "closed"
                           : open == reports.live_relays
                               ? "open"
                               : fmt::format("open {}/{}", open, reports.live_relays);
    }
    v.windows = pg::windows_status(conn, c.schema);
    return v;
}

std::string render_status(const status_view& v) {
    std::string out = fmt::format("{:<32} {:>9} {:>14} {:>9} {:>9} {:>9} {:>9} {:>14}\n", "topic", "pending",
                                  "waiting_on_key", "scheduled", "in_flight", "retrying", "dead", "oldest_pending");
    for (const auto& [topic, t] : v.topics) {
        out += fmt::format("{:<32} {:>9} {:>14} {:>9} {:>9} {:>9} {:>9} {:>13.1f}s\n", topic, t.pending,
                           t.waiting_on_key, t.scheduled, t.in_flight, t.retrying, t.dead, t.oldest_pending_seconds);
        if (t.last_error) out += fmt::format("    last error: {}\n", *t.last_error);
    }
    out += fmt::format("\n{:<32} {:>9} {:>14} {:>9} {:>9} {:>9} {:>9} {:>14} {:>9}\n", "destination", "pending",
                       "waiting_on_key", "scheduled", "in_flight", "retrying", "dead", "oldest_pending", "circuit");
    for (const auto& [name, d] : v.destinations) {
        const auto circuit = v.circuits.find(name);
        out += fmt::format("{:<32} {:>9} {:>14} {:>9} {:>9} {:>9} {:>9} {:>13.1f}s {:>9}\n", name, d.pending,
                           d.waiting_on_key, d.scheduled, d.in_flight, d.retrying, d.dead, d.oldest_pending_seconds,
                           circuit == v.circuits.end() ? "-" : circuit->second);
    }
    out += fmt::format("\nrelays: {} live ({} claiming, {} reading windows)\n", v.live_relays, v.claiming_relays,
                       v.windows_relays);
    out += fmt::format("a relay started now with relay.consume = \"auto\" would {} ({})\n",
                       v.auto_choice.mode == "windows" ? "read windows" : "claim", describe(v.auto_choice.why));
    if (v.windows) {
        out += '\n';
        for (const auto& line : windows_lines(*v.windows)) out += line + '\n';
    }
    return out;
}

nlohmann::json windows_json(const windows_report& w) {
    const auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(); };
    auto holding = nlohmann::json::array();
    for (const auto& t : w.holding_back) {
        holding.push_back({{"xid", t.xid},
                           {"gid", opt(t.gid)},
                           {"prepared_by", opt(t.prepared_by)},
                           {"pid", opt(t.pid)},
                           {"state", opt(t.state)},
                           {"application_name", opt(t.application_name)},
                           {"age_seconds", opt(t.age_seconds)}});
    }
    return {{"cursors", w.cursors},
            {"held", w.held},
            {"relays", w.relays},
            {"oldest_checkpoint_seconds", w.oldest_checkpoint_seconds},
            {"oldest_checkpoint_slot", w.oldest_checkpoint_slot},
            {"refusal", w.refusal.empty() ? nlohmann::json() : nlohmann::json(w.refusal)},
            {"holding_back", std::move(holding)}};
}

std::string render_status_json(const status_view& v) {
    // One object per line, like `dead list --json`: topics, then destinations,
    // then the live relays, then the windows (only where relays read them).
    std::string out;
    for (const auto& [topic, t] : v.topics) {
        auto j = t.json();
        j["topic"] = topic;
        out += j.dump() + '\n';
    }
    for (const auto& [name, d] : v.destinations) {
        auto j = d.json();
        j["destination"] = name;
        const auto circuit = v.circuits.find(name);
        j["circuit"] = circuit == v.circuits.end() ? nlohmann::json() : nlohmann::json(circuit->second);
        out += j.dump() + '\n';
    }
    out += nlohmann::json{{"relays",
                           {{"live", v.live_relays}, {"claiming", v.claiming_relays}, {"windows", v.windows_relays}}}}
               .dump() +
           '\n';
    out += nlohmann::json{{"consume_auto", {{"mode", v.auto_choice.mode}, {"because", describe(v.auto_choice.why)}}}}
               .dump() +
           '\n';
    if (v.windows) out += nlohmann::json{{"windows", windows_json(*v.windows)}}.dump() + '\n';
    return out;
}

volatile std::sig_atomic_t watch_stopped = 0;

int cmd_status(const parsed_args& args) {
    const auto c = load_config(args, /*destinations_required=*/false);
    const auto dsn = effective_dsn(c);
    const bool json = args.flag("json");
    auto conn = connect(dsn);
    if (!args.flag("watch")) {
        const auto v = with_installed_outbox(c.schema, [&] { return read_status(*conn, c); });
        std::cout << (json ? render_status_json(v) : render_status(v));
        return exit_ok;
    }
    // A live view: redrawn in place every --interval (JSON: the lines again,
    // after an empty line) until SIGINT or SIGTERM. A lost connection is
    // reported on the screen and tried again at the next refresh.
    const auto interval = duration_option(args, "interval", std::chrono::seconds(2));
    if (interval < std::chrono::milliseconds(100)) throw fatal_error(exit_usage, "--interval: at least 100ms");
    std::signal(SIGINT, [](int) { watch_stopped = 1; });
    std::signal(SIGTERM, [](int) { watch_stopped = 1; });
    while (watch_stopped == 0) {
        std::string screen;
        try {
            if (!conn) conn = connect(dsn);
            const auto v = with_installed_outbox(c.schema, [&] { return read_status(*conn, c); });
            screen = json ? render_status_json(v) : render_status(v);
        } catch (const fatal_error& e) {
            if (e.code != exit_db_unavailable) throw;
            screen = fmt::format("{}\n", e.what());
        } catch (const pqxx::broken_connection& e) {
            conn.reset();
            screen = fmt::format("database connection lost: {}\n", scrub_secrets(e.what(), dsn));
        }
        if (json) {
            std::cout << screen << '\n' << std::flush;
        } else {
            // Home, the new view with each line's old tail erased, then
            // erase whatever the previous view left below it.
            std::string lines = fmt::format("every {}, Ctrl-C to stop\n\n{}", format_duration(interval), screen);
            std::string redraw = "\x1b[H";
            for (std::size_t at = 0, nl; (nl = lines.find('\n', at)) != std::string::npos; at = nl + 1) {
                redraw += lines.substr(at, nl - at) + "\x1b[K\n";
            }
            std::cout << redraw << "\x1b[J" << std::flush;
        }
        for (auto waited = std::chrono::milliseconds(0); waited < interval && watch_stopped == 0;
             waited += std::chrono::milliseconds(50)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    return exit_ok;
}

pg::dead_filter dead_filter_of(const parsed_args& args) {
    pg::dead_filter f;
    if (const auto topic = args.get("topic")) {
        f.topic = usage_checked("topic", [&] { return topic_pattern::parse(*topic).to_regex(); });
    }
    if (args.get("older-than")) f.older_than = duration_option(args, "older-than", {});
    if (args.get("id")) f.id = integer_option(args, "id", 0, 1, std::numeric_limits<std::int64_t>::max());
    return f;
}

int cmd_dead(const parsed_args& args) {
    const auto filter = dead_filter_of(args);
    if (args.subcommand == "list" && filter.id) throw fatal_error(exit_usage, "--id applies to `dead replay` only");
    if (args.subcommand == "replay" && !filter.id && !filter.topic && !filter.older_than && !args.flag("all")) {
        throw fatal_error(exit_usage, "`outboxd dead replay` needs --id N, a filter (--topic, --older-than) or --all");
    }
    if (args.subcommand == "purge" && !filter.older_than) {
        throw fatal_error(exit_usage, "`outboxd dead purge` needs --older-than (e.g. --older-than 0s for all)");
    }
    const auto [schema, dsn] = database_of(args);
    auto conn = connect(dsn);
    return with_installed_outbox(schema, [&] {
        if (args.subcommand == "list") {
            const auto limit = static_cast<std::size_t>(integer_option(args, "limit", 100, 1, 1'000'000));
            const auto dead = pg::list_dead(*conn, schema, filter, limit);
            if (args.flag("json")) {
                for (const auto& d : dead) {
                    nlohmann::json j{{"id", d.id}, {"message_id", d.message_id}, {"topic", d.topic},
                                     {"attempts", d.attempts},
                                     {"last_error", d.last_error}, {"response_excerpt", d.response_excerpt},
                                     {"created_at", d.created_at}, {"died_at", d.died_at}};
                    j["ordering_key"] = d.ordering_key ? nlohmann::json(*d.ordering_key) : nlohmann::json();
                    j["last_status"] = d.last_status ? nlohmann::json(*d.last_status) : nlohmann::json();
                    j["destination"] = d.destination ? nlohmann::json(*d.destination) : nlohmann::json();
                    // The payload as stored (PostgreSQL's JSON text), spliced in
                    // rather than parsed: a parse would round its numbers.
                    auto line = j.dump();
                    line.pop_back();
                    std::cout << line << R"(,"payload":)" << d.payload << "}\n";
                }
                return exit_ok;
            }
            for (const auto& d : dead) {
                std::cout << fmt::format("{}  {}  {}  destination={}  key={}  attempts={}  status={}  died_at={}\n    {}\n",
                                         d.id, d.message_id, d.topic, d.destination.value_or("(all)"),
                                         d.ordering_key.value_or("-"), d.attempts,
                                         d.last_status ? fmt::format("{}", *d.last_status) : "-", d.died_at,
                                         d.last_error);
            }
            return exit_ok;
        }
        if (args.subcommand == "replay") {
            const auto ids = pg::replay_dead(*conn, schema, filter);
            // Committed: from here the ids are printed whatever else fails.
            for (const auto id : ids) std::cout << id << '\n';
            std::cout << std::flush;
            std::size_t left = 0;
            try {
                left = pg::count_dead(*conn, schema, filter);
            } catch (const std::exception& e) {
                log::warn("could not count the dead letters left", {{"error", scrub_secrets(e.what(), dsn)}});
            }
            if (left > 0) {
                const auto why = fmt::format("{} dead letter{} matching the filter not replayed: {} event is still "
                                             "in the outbox (an earlier replay not finished), or it died just now; "
                                             "replay again later",
                                             left, left == 1 ? "" : "s", left == 1 ? "its" : "their");
                if (filter.id && ids.empty()) throw fatal_error(exit_invalid_input, why);
                log::warn(why);
            }
            if (filter.id && ids.empty()) {
                throw fatal_error(exit_invalid_input, fmt::format("no dead letter with id {}; nothing replayed "
                                                                  "(`outboxd dead list` shows them)",
                                                                  *filter.id));
            }
            log::info("replayed dead letters", {{"count", fmt::format("{}", ids.size())}});
            return exit_ok;
        }
        const bool dry_run = args.flag("dry-run");
        const auto purged = pg::purge_dead(*conn, schema, *filter.older_than, filter.topic, dry_run);
        log::info(dry_run ? "would purge dead letters (dry run: nothing deleted)" : "purged dead letters",
                  {{"count", fmt::format("{}", purged)}});
        std::cout << purged << '\n';
        return exit_ok;
    });
}

std::string make_lease_owner() {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    std::random_device rd;
    return fmt::format("{}:{}:{:06x}", host, getpid(), rd() & 0xFFFFFF);
}

// Secrets belong in the environment (signing_secrets_env), not in a file
// that is copied, committed and read by everyone who can read the config.
void warn_about_secrets_in_file(const config& c) {
    for (const auto& d : c.destinations) {
        if (d.signing_secrets_in_file.empty()) continue;
        log::warn("signing secrets are written in the configuration file; prefer signing_secrets_env",
                  {{"destination", d.name}, {"at", d.signing_secrets_in_file}});
    }
}

int cmd_run(const parsed_args& args) {
    relay_options o;
    o.settings = load_config(args, /*destinations_required=*/true);
    warn_about_secrets_in_file(o.settings);
    o.dsn = effective_dsn(o.settings);
    o.lease_owner = make_lease_owner();
    if (args.flag("once")) o.mode = run_mode::once;
    // SIGHUP: the file again; the environment and flags are as at startup.
    o.reload = [args] {
        auto c = load_config(args, /*destinations_required=*/true);
        warn_about_secrets_in_file(c);
        return c;
    };
    return run_relay(o);
}

// Validates everything `run` would, and prints the effective configuration
// with every secret redacted. Touches no database and no endpoint.
int cmd_check_config(const parsed_args& args) {
    const auto c = load_config(args, /*destinations_required=*/true);
    warn_about_secrets_in_file(c);
    std::cout << render_config(c);
    return exit_ok;
}

int dispatch(const parsed_args& args) {
    if (args.version) {
        std::cout << "outboxd " << OUTBOXD_VERSION << '\n';
        return exit_ok;
    }
    if (args.help || args.command.empty()) {
        std::cout << usage_text();
        return args.help ? exit_ok : exit_usage;
    }
    // Every command reads the configuration first (load_config), which sets
    // the log level and format: flag, environment or file. The line saying
    // why a command stopped is written in the chosen format even when the
    // configuration is what is wrong: the flag or environment, if valid.
    try {
        if (const auto format = option_or_env(args, "log-format", "OUTBOXD_LOG_FORMAT", std::string()); !format.empty()) {
            log::set_format(log::parse_format(format));
        }
    } catch (const std::exception&) {
        // Reported by load_config, with where the bad value came from.
    }
    if (args.command == "sql") return cmd_sql(args);
    if (args.command == "migrate") return cmd_migrate(args);
    if (args.command == "enqueue") return cmd_enqueue(args);
    if (args.command == "run") return cmd_run(args);
    if (args.command == "check-config") return cmd_check_config(args);
    if (args.command == "status") return cmd_status(args);
    if (args.command == "dead") return cmd_dead(args);
    if (args.command == "wake-trigger") return cmd_wake_trigger(args);
    if (args.command == "wake-setup") return cmd_wake_setup(args);
    if (args.command == "consume-setup") return cmd_consume_setup(args);
    if (args.command == "cursor") return cmd_cursor_reset(args);
    throw fatal_error(exit_usage, fmt::format("unknown command '{}'", args.command));
}

}  // namespace

// Why the process could not do what it was asked: a plain line on stderr
// (a person reads it), or, when the logs are JSON, a record like the others
// (a log pipeline reads it, and that is the line it most needs).
void report(std::string_view message, int code) noexcept {
    try {
        if (log::current_format() == log::format::json) {
            log::write(log::level::error, one_line(message), {{"exit_code", fmt::format("{}", code)}});
            return;
        }
        std::cerr << "outboxd: " << one_line(message) << '\n' << std::flush;
    } catch (...) {  // nothing left to tell anyone with
    }
}

int run_main(int argc, const char* const* argv) noexcept {
    try {
        return dispatch(parse_args(argc, argv));
    } catch (const fatal_error& e) {
        report(e.what(), e.code);
        return e.code;
    } catch (const pqxx::insufficient_privilege& e) {
        // SQLSTATE 42501; libpqxx 6.4 throws this class without the code.
        const auto error = permission_denied(primary_message(e.what()));
        report(error.what(), error.code);
        return error.code;
    } catch (const std::exception& e) {
        report(fmt::format("unexpected error (a bug: please report it): {}", e.what()), exit_internal);
        return exit_internal;
    } catch (...) {
        report("unexpected error (a bug: please report it)", exit_internal);
        return exit_internal;
    }
}

}  // namespace outboxd::app
