#include "pg/store.hpp"

#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "pg/migrator.hpp"
#include "pg/params.hpp"
#include "pg/stall_watchdog.hpp"

namespace outboxd::pg {
namespace {

// Stored error texts are bounded: a huge error page must not bloat the row.
constexpr std::size_t max_error_bytes = 2048;

header_list parse_headers(const char* json_text) {
    header_list out;
    const auto object = nlohmann::json::parse(json_text);  // the column CHECK guarantees an object of strings
    out.reserve(object.size());
    for (const auto& [name, value] : object.items()) out.emplace_back(name, value.get<std::string>());
    return out;
}

// A PostgreSQL array literal ({1,2,3}) of what `field` gives for each item.
template <typename Items, typename Field>
std::string number_array(const Items& items, Field field) {
    std::string out = "{";
    for (const auto& item : items) {
        if (out.size() > 1) out.push_back(',');
        out += fmt::format("{}", field(item));
    }
    out.push_back('}');
    return out;
}

// A text[] literal: every element double-quoted with " and \ escaped;
// nullopt becomes NULL.
template <typename Items, typename Field>
std::string text_array(const Items& items, Field field) {
    std::string out = "{";
    bool first = true;
    for (const auto& item : items) {
        if (!first) out.push_back(',');
        first = false;
        const std::optional<std::string> value = field(item);
        if (!value) {
            out += "NULL";
            continue;
        }
        out.push_back('"');
        for (const char ch : *value) {
            if (ch == '"' || ch == '\\') out.push_back('\\');
            out.push_back(ch);
        }
        out.push_back('"');
    }
    out.push_back('}');
    return out;
}

// Names joined by ',' (array_to_string in the claim): destination names
// never hold one, and unlike an array's text form nothing is quoted (an
// element "null" would be).
std::vector<std::string> destination_names(std::string_view array) {
    std::vector<std::string> out;
    while (!array.empty()) {
        const auto comma = array.find(',');
        out.emplace_back(array.substr(0, comma));
        if (comma == std::string_view::npos) break;
        array.remove_prefix(comma + 1);
    }
    return out;
}

std::optional<std::string> status_text(std::optional<int> status) {
    return status ? std::optional<std::string>(fmt::format("{}", *status)) : std::nullopt;
}

}  // namespace

store::store(std::string dsn, std::string schema, std::string lease_owner, bool relay_session, bool plan_once,
             std::chrono::milliseconds statement_timeout, std::optional<std::vector<std::string>> destinations)
    : dsn_(std::move(dsn)),
      schema_(std::move(schema)),
      owner_(std::move(lease_owner)),
      relay_session_(relay_session),
      plan_once_(plan_once),
      statement_timeout_(statement_timeout),
      destinations_(std::move(destinations)),
      queries_(schema_) {}

namespace {

std::chrono::milliseconds call_limit(std::chrono::milliseconds statement_timeout) {
    return statement_timeout.count() > 0 ? statement_timeout + store::answer_margin : statement_timeout;
}

}  // namespace

store::~store() = default;

void store::connect() {
    conn_.reset();
    auto c = std::make_unique<pqxx::connection>(dsn_);  // bounded by connect_timeout
    // A lost connection is dropped and made anew by conn(); libpqxx 6 must
    // not reconnect by itself inside a later statement of the same call (a
    // rollback, say), where our deadline watches the old socket, not the new.
    c->inhibit_reactivation(true);
    with_deadline(*c, call_limit(statement_timeout_), [&](pqxx::connection& cc) { set_up(cc); });
    conn_ = std::move(c);
}

void store::set_up(pqxx::connection& c) {
    if (statement_timeout_.count() > 0) {
        pqxx::nontransaction tx(c);
        // No statement of ours runs long: one that does is stuck (a lock, a
        // bad plan) and is better failed and retried. A transaction of ours
        // is never idle between statements for long either; one that is
        // holds row locks for a client that may be gone.
        tx.exec(fmt::format("SET statement_timeout = {}", statement_timeout_.count()));
        tx.exec(fmt::format("SET idle_in_transaction_session_timeout = {}", statement_timeout_.count()));
    }
    if (relay_session_) {
        pqxx::nontransaction tx(c);
        tx.exec("SET synchronous_commit = off");  // see the constructor's comment
    }
    if (plan_once_) {
        pqxx::nontransaction tx(c);
        // See the constructor's comment. A generic plan is made once, when
        // the outbox may be empty or small: made then, it would seq-scan (or
        // bitmap-scan) and sort all due rows at every later claim, however
        // large the backlog grows (measured: 676 ms per claim at 50,000 rows;
        // a 100k drain at 2,661 events/s), until autoanalyze replaces it.
        // Every claim has an index to use.
        for (const auto& setting : plan_once_settings()) tx.exec(setting);
    }
    // Size 0 claims nothing and still reports what is due next.
    for (std::size_t size = 0; size <= largest_claim; size = std::max<std::size_t>(1, size * 2)) {
        c.prepare(fmt::format("claim_{}", size), claim_sql(size, claim_from::beginning));
        c.prepare(fmt::format("claim_from_{}", size), claim_sql(size, claim_from::low_mark));
        c.prepare(fmt::format("claim_after_{}", size), claim_sql(size, claim_from::drain_watermark));
        c.prepare(fmt::format("claim_deliveries_{}", size), sized("claim_deliveries", size));
    }
    holds_session_lock_ = false;
    if (bound_to_session_) register_session(c);
    queries_.prepare(c, {"complete", "reschedule", "bury", "release", "enqueue", "fan_out",
                         "fan_out_deliveries", "fan_out_dead", "lock_events", "complete_deliveries",
                         "reschedule_delivery", "bury_delivery", "delete_finished_events",
                         "purge_idempotency_keys", "purge_dead_letters"});
}

// Claims are planned once and the plan serves whatever comes later, so it
// must not depend on the table being small when it was made. Each claim has
// an index that yields its rows in claim order; these settings price the
// other ways (a seq scan or a bitmap scan of every due row, then a sort) out
// of reach, though not out of existence. See the pg test "the claims'
// generic plans ...". (Not enable_sort = off: with it, the claim's UPDATE
// took 600 ms for 128 rows, for reasons not tracked down.)
std::vector<std::string> store::plan_once_settings() {
    return {"SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off", "SET enable_bitmapscan = off"};
}

namespace {

void fill(std::string& text, std::string_view placeholder, const std::string& value) {
    const auto at = text.find(placeholder);
    if (at == std::string::npos) throw std::logic_error(fmt::format("a claim in queries.sql lost its {}", placeholder));
    text.replace(at, placeholder.size(), value);
}

}  // namespace

// A claim of queries.sql with its size filled in.
std::string store::sized(std::string_view query, std::size_t size) const {
    auto text = queries_.sql(query);
    fill(text, "LIMIT :claim_size", fmt::format("LIMIT {}", size));
    return text;
}

// The event claim with its size and watermark filled in.
std::string store::claim_sql(std::size_t size, claim_from from) const {
    auto text = sized("claim", size);
    fill(text, "AND :after_watermark",
         from == claim_from::drain_watermark ? "AND (e.available_at, e.id) > ($3::timestamptz, $4::bigint)"
         : from == claim_from::low_mark      ? "AND e.available_at >= $3::timestamptz"
                                             : "AND true");
    fill(text, "WHEN :outside_drain", from == claim_from::drain_watermark ? "WHEN false" : "WHEN true");
    // Literals, like the size: the set is fixed for the connection's life.
    const auto known = destinations_ ? quote_literal(text_array(*destinations_, [](const std::string& d) {
        return std::optional(d);
    })) : std::string();
    fill(text, "AND :known_destination",
         destinations_ ? fmt::format("AND destination = ANY ({}::text[])", known) : "AND true");
    return text;
}

bool store::connected() const noexcept { return conn_ && conn_->is_open(); }

void store::disconnect() noexcept { conn_.reset(); }

pqxx::connection& store::conn() {
    if (!connected()) connect();
    return *conn_;
}

// Runs one statement; a lost connection is dropped so the next call starts
// afresh (libpqxx 6 would otherwise try to reactivate it behind our back).
template <typename F>
auto store::guarded(F&& f) {
    try {
        return with_deadline(conn(), call_limit(statement_timeout_), std::forward<F>(f));
    } catch (const pqxx::broken_connection& e) {
        conn_.reset();
        // libpq's words alone read like riddles ("Could not obtain client
        // encoding: not connected."); say what happens next.
        throw pqxx::broken_connection(fmt::format(
            "lost the connection to the database; reconnecting at the next statement ({})", one_line(e.what())));
    }
}

std::optional<int> store::schema_version() {
    return guarded([&](pqxx::connection& c) { return read_schema_version(c, schema_); });
}

namespace {

// The columns both claims return first: id, topic, ordering_key, payload,
// headers, attempts.
// Decoded row by row: a row that cannot be decoded comes back with the
// reason (and its id and attempt, to dead-letter it under our lease) instead
// of failing the whole claim, whose other rows would stay leased unsent.
event read_claimed(const pqxx::row& row) {
    event e;
    e.id = row[0].as<std::int64_t>();
    e.attempt = row[5].as<std::int32_t>();
    e.topic = row[1].c_str();
    if (!row[2].is_null()) e.ordering_key = std::string(row[2].c_str(), row[2].size());
    e.payload.assign(row[3].c_str(), row[3].size());
    try {
        e.headers = parse_headers(row[4].c_str());
    } catch (const std::exception&) {
        // Not the parser's text: it quotes the offending bytes.
        e.undecodable = "the event's headers cannot be decoded as UTF-8 JSON (the database's encoding is not "
                        "UTF-8?); it cannot be sent";
    }
    return e;
}

}  // namespace

claim_result store::claim(std::size_t limit, std::chrono::milliseconds lease,
                          const std::optional<claim_watermark>& after, const std::optional<std::string>& low_mark) {
    return guarded([&](pqxx::connection& c) {
        if (bound_to_session_ && !holds_session_lock_) register_session(c);
        pqxx::nontransaction tx(c);
        const auto size = claim_size(limit);
        const auto lease_ms = static_cast<long long>(lease.count());
        const auto r = after      ? tx.exec_prepared(fmt::format("claim_after_{}", size), owner_, lease_ms,
                                                     after->available_at, after->id)
                       : low_mark ? tx.exec_prepared(fmt::format("claim_from_{}", size), owner_, lease_ms, *low_mark)
                                  : tx.exec_prepared(fmt::format("claim_{}", size), owner_, lease_ms);
        claim_result out;
        out.events.reserve(r.size());
        for (const auto& row : r) {
            if (row[0].is_null()) {  // the extra row (always last)
                if (!row[7].is_null()) {
                    out.next_due = std::chrono::milliseconds(std::max<long long>(0, row[7].as<long long>()));
                }
                out.deliveries_due = row[8].as<bool>();
                if (!row[9].is_null()) out.last = claim_watermark{row[9].c_str(), row[10].as<std::int64_t>()};
                out.low_mark = row[12].c_str();
                out.picked = row[13].as<std::size_t>();
                continue;
            }
            auto e = read_claimed(row);
            e.key_pending = row[6].as<bool>();
            if (!row[11].is_null()) e.only_to = destination_names(row[11].c_str());
            out.events.push_back(std::move(e));
        }
        return out;
    });
}

std::vector<event> store::claim_deliveries(std::size_t limit, std::chrono::milliseconds lease,
                                           std::span<const std::string> destinations) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto r = tx.exec_prepared(
            fmt::format("claim_deliveries_{}", claim_size(limit)), owner_, static_cast<long long>(lease.count()),
            text_array(destinations, [](const std::string& d) { return std::optional(d); }));
        std::vector<event> out;
        out.reserve(r.size());
        for (const auto& row : r) {
            auto e = read_claimed(row);
            e.destination = std::string(row[6].c_str(), row[6].size());
            out.push_back(std::move(e));
        }
        return out;
    });
}

std::vector<std::int64_t> store::complete(std::span<const lease_ref> delivered) {
    if (delivered.empty()) return {};
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto r = tx.exec_prepared("complete", number_array(delivered, [](const lease_ref& d) { return d.id; }),
                                        number_array(delivered, [](const lease_ref& d) { return d.attempt; }), owner_);
        std::vector<std::int64_t> ids;
        ids.reserve(r.size());
        for (const auto& row : r) ids.push_back(row[0].as<std::int64_t>());
        return ids;
    });
}

bool store::reschedule(lease_ref e, std::chrono::milliseconds delay, std::string_view error) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto r = tx.exec_prepared("reschedule", e.id, e.attempt, owner_,
                                        static_cast<long long>(delay.count()),
                                        sanitize_text(error, max_error_bytes));
        return r.size() == 1;
    });
}

bool store::bury(lease_ref e, std::string_view error, std::optional<int> status, std::string_view response_excerpt) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto status_param = status_text(status);
        const auto r = tx.exec_prepared("bury", e.id, e.attempt, owner_, sanitize_text(error, max_error_bytes),
                                        nullable(status_param), sanitize_text(response_excerpt, max_error_bytes));
        return r.size() == 1;
    });
}

bool store::fan_out(lease_ref e, std::span<const owed_delivery> owed, std::span<const dead_delivery> dead) {
    return guarded([&](pqxx::connection& c) {
        pqxx::work tx(c);
        if (tx.exec_prepared("fan_out", e.id, e.attempt, owner_).empty()) return false;  // fenced out
        if (!owed.empty()) {
            tx.exec_prepared("fan_out_deliveries", e.id,
                             text_array(owed, [](const owed_delivery& o) { return std::optional(o.destination); }),
                             number_array(owed, [](const owed_delivery& o) { return o.due_in.count(); }),
                             number_array(owed, [](const owed_delivery& o) { return o.attempts; }),
                             text_array(owed, [](const owed_delivery& o) {
                                 return o.error ? std::optional(sanitize_text(*o.error, max_error_bytes))
                                                : std::nullopt;
                             }));
        }
        for (const auto& d : dead) {
            const auto status_param = status_text(d.status);
            tx.exec_prepared("fan_out_dead", e.id, d.destination, d.attempts, sanitize_text(d.error, max_error_bytes),
                             nullable(status_param), sanitize_text(d.response_excerpt, max_error_bytes));
        }
        // Nothing owed any more (all delivered or dead): the event is done.
        tx.exec_prepared("delete_finished_events", fmt::format("{{{}}}", e.id));
        tx.commit();
        return true;
    });
}

std::size_t store::finish_deliveries(const delivery_outcomes& outcomes) {
    if (outcomes.empty()) return 0;
    return guarded([&](pqxx::connection& c) {
        std::vector<std::int64_t> finishing;  // events that may have lost their last delivery
        for (const auto& d : outcomes.delivered) finishing.push_back(d.id);
        for (const auto& d : outcomes.dead) finishing.push_back(d.ref.id);
        const auto ids = number_array(finishing, [](std::int64_t id) { return id; });

        pqxx::work tx(c);
        std::size_t recorded = 0;
        if (!finishing.empty()) tx.exec_prepared("lock_events", ids);
        if (!outcomes.delivered.empty()) {
            const auto& done = outcomes.delivered;
            recorded += tx.exec_prepared("complete_deliveries",
                                         number_array(done, [](const delivery_ref& d) { return d.id; }),
                                         text_array(done, [](const delivery_ref& d) { return std::optional(d.destination); }),
                                         number_array(done, [](const delivery_ref& d) { return d.attempt; }), owner_)
                            .size();
        }
        for (const auto& r : outcomes.retries) {
            recorded += tx.exec_prepared("reschedule_delivery", r.ref.id, r.ref.destination, r.ref.attempt, owner_,
                                         static_cast<long long>(r.delay.count()),
                                         sanitize_text(r.error, max_error_bytes))
                            .size();
        }
        for (const auto& d : outcomes.dead) {
            const auto status_param = status_text(d.status);
            recorded += tx.exec_prepared("bury_delivery", d.ref.id, d.ref.destination, d.ref.attempt, owner_,
                                         sanitize_text(d.error, max_error_bytes), nullable(status_param),
                                         sanitize_text(d.response_excerpt, max_error_bytes))
                            .size();
        }
        if (!finishing.empty()) tx.exec_prepared("delete_finished_events", ids);
        tx.commit();
        return outcomes.delivered.size() + outcomes.retries.size() + outcomes.dead.size() - recorded;
    });
}

std::size_t store::release() {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return static_cast<std::size_t>(tx.exec_prepared("release", owner_).size());
    });
}

std::size_t store::forget_expired_key_holds() {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return static_cast<std::size_t>(tx.exec(queries_.sql("forget_expired_key_holds")).affected_rows());
    });
}

std::string store::message_prefix() {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return tx.exec1(queries_.sql("message_prefix"))[0].as<std::string>();
    });
}

std::vector<delivery_ref> store::bury_orphan_deliveries() {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        std::vector<delivery_ref> out;
        for (const auto& row : tx.exec(queries_.sql("bury_orphan_deliveries"))) {
            out.push_back({row[0].as<std::int64_t>(), row[1].c_str(), 0});
        }
        return out;
    });
}

std::int64_t store::purge_idempotency_keys(std::chrono::milliseconds retention) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return tx.exec_prepared1("purge_idempotency_keys", static_cast<long long>(retention.count()))[0]
            .as<std::int64_t>();
    });
}

std::size_t store::purge_dead_letters(std::chrono::milliseconds retention, std::size_t batch) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return static_cast<std::size_t>(
            tx.exec_prepared("purge_dead_letters", static_cast<long long>(retention.count()),
                             static_cast<long long>(batch))
                .size());
    });
}

std::int64_t store::enqueue(const new_event& e) {
    return guarded([&](pqxx::connection& c) {
        pqxx::work tx(c);
        const auto r = tx.exec_prepared1("enqueue", e.topic, e.payload, nullable(e.ordering_key),
                                         nullable(e.idempotency_key), e.headers,
                                         static_cast<long long>(e.delay.count()));
        tx.commit();
        return r[0].as<std::int64_t>();
    });
}

void store::bind_leases_to_session() {
    const bool fresh = !connected();
    bound_to_session_ = true;
    if (!fresh) {
        guarded([&](pqxx::connection& c) { register_session(c); });
    } else {
        (void)conn();  // set_up registers
    }
}

// Before any claim on a session: a lease it stamps is then covered by the
// lock (see register_relay), or, while our previous session still holds it,
// by that one.
void store::register_session(pqxx::connection& c) {
    // A previous session that we closed ends at the server a moment later:
    // a few tries cover that; one that lingers (a partition) is tried again
    // at the next claim.
    for (int attempt = 0; attempt < 10; ++attempt) {
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        pqxx::nontransaction tx(c);
        holds_session_lock_ = !tx.exec_params(queries_.sql("register_relay"), owner_).empty();
        if (holds_session_lock_) return;
    }
}

store::takeover store::take_over_dead_relays() {
    return guarded([&](pqxx::connection& c) {
        takeover out;
        pqxx::work tx(c);
        for (const auto& row : tx.exec_params(queries_.sql("find_dead_relays"), owner_)) {
            out.relays.push_back(row[0].as<std::string>());
        }
        if (!out.relays.empty()) {
            const auto owners = text_array(out.relays, [](const std::string& o) { return std::optional(o); });
            out.leases = tx.exec_params(queries_.sql("take_over_leases"), owners).size();
        }
        tx.commit();
        return out;
    });
}

}  // namespace outboxd::pg
