// The relay's store: its session, outcomes, release and housekeeping (the
// claims are in store_claim.cpp).
#include "pg/store.hpp"

#include <thread>
#include <utility>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "pg/migrator.hpp"
#include "pg/params.hpp"
#include "pg/sql_arrays.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {
namespace {

std::optional<std::string> status_text(std::optional<int> status) {
    return status ? std::optional<std::string>(fmt::format("{}", *status)) : std::nullopt;
}

// The statements the relay's session prepares (besides the claims): running
// one that is not in the list does not compile.
using prepared = query_list<q::complete, q::reschedule, q::bury, q::release, q::fan_out, q::fan_out_deliveries,
                            q::fan_out_dead, q::lock_events, q::complete_deliveries, q::reschedule_delivery,
                            q::bury_delivery, q::delete_finished_events, q::purge_idempotency_keys,
                            q::purge_dead_letters, q::hand_back, q::hand_back_delivery, q::read_window>;

}  // namespace

template <typename Args>
auto store::run(pqxx::transaction_base& tx, const Args& args) const {
    static_assert(prepared::contains<query_of<Args>>, "not prepared by the relay's session: add it to `prepared`");
    if (transaction_pooling_) return exec_params(tx, queries_, args);
    return exec_prepared(tx, args);
}

namespace {

// The claim's :known_destination: only deliveries to these destinations
// count as due. A literal, like the claim's size: the claims are prepared
// again when a reload changes the set.
std::string known_destination_sql(const std::optional<std::vector<std::string>>& destinations) {
    if (!destinations) return "true";
    return fmt::format("destination = ANY ({}::text[])",
                       quote_literal(text_array(*destinations)));
}

}  // namespace

store::store(std::string dsn, std::string schema, std::string lease_owner, bool relay_session, bool plan_once,
             std::chrono::milliseconds statement_timeout, std::optional<std::vector<std::string>> destinations)
    : schema_(std::move(schema)),
      owner_(std::move(lease_owner)),
      relay_session_(relay_session),
      plan_once_(plan_once),
      statement_timeout_(statement_timeout),
      known_destination_(known_destination_sql(destinations)),
      known_destinations_(destinations.value_or(std::vector<std::string>{})),
      queries_(schema_),
      session_(std::move(dsn), statement_timeout, [this](pqxx::connection& c) { set_up(c); }) {}

store::~store() = default;

void store::connect() { session_.connect(); }

bool store::connected() const noexcept { return session_.connected(); }

void store::disconnect() noexcept { session_.disconnect(); }

void store::set_up(pqxx::connection& c) {
    window_safety_due_ = true;  // perhaps another server: see check_window_server()
    if (transaction_pooling_) return;  // see set_transaction_pooling()
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
        for (const auto& setting : relay_session_settings()) tx.exec(setting);  // see the constructor's comment
    }
    if (plan_once_) {
        pqxx::nontransaction tx(c);
        // See the constructor's comment. A generic plan is made once, when
        // the outbox may be empty or small: made then, it would seq-scan (or
        // bitmap-scan) and sort all due rows at every later claim, however
        // large the backlog grows, until autoanalyze replaces it. Every
        // claim has an index to use.
        for (const auto& setting : plan_once_settings()) tx.exec(setting);
    }
    prepare_claims(c);
    prepared::prepare(queries_, c);
    holds_session_lock_ = false;
    if (bound_to_session_) register_session(c);
}

// synchronous_commit: see the constructor's comment. Not enable_seqscan =
// off: the outcome session's other statements (fan-outs, deliveries, key
// holds) then took plans that made a keyed run with retries 8x slower
// (tests/e2e/test_guarantees.py, three relays and a flaky receiver: 146 s
// against 19 s, and again 161 s and a failure with the statements as they
// are now); `complete` sets it around itself (complete_settings()). jit =
// off: the relay's statements are short, and JIT compiling one whose
// estimate grows with its page (read_window of a large window) costs several
// times its execution.
std::vector<std::string> store::relay_session_settings() { return {"SET synchronous_commit = off", "SET jit = off"}; }

// complete's plan is made once and kept until the table's statistics
// change. Made while the outbox was small, it was a sequential scan, which
// read the whole table at every batch as the outbox grew until the next
// autovacuum (a TID scan is priced at 10 random pages for an array of
// unknown length). Two round trips a batch, against a table's worth of pages.
std::vector<std::string> store::complete_settings() { return {"SET enable_seqscan = off"}; }

// Claims are planned once and the plan serves whatever comes later, so it
// must not depend on the table being small when it was made. Each claim has
// an index that yields its rows in claim order; these settings price the
// other ways (a seq scan or a bitmap scan of every due row, then a sort) out
// of reach, though not out of existence. See the pg test "the claims'
// generic plans ...". Not enable_sort = off, which made the claim's UPDATE
// far slower (bench/NOTES.md, "Database").
std::vector<std::string> store::plan_once_settings() {
    return {"SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off", "SET enable_bitmapscan = off"};
}

std::optional<int> store::schema_version() {
    return session_.run([&](pqxx::connection& c) { return read_schema_version(c, schema_); });
}

namespace {

// Where the leased row is: as the claim returned it, or (for a caller that
// does not know it) looked up by id. NULL if the row is gone: fenced out.
template <typename Queries>
std::optional<std::string> tid_of(pqxx::transaction_base& tx, const Queries& queries, const lease_ref& e) {
    if (!e.tid.empty()) return e.tid;
    const auto r = exec_params(tx, queries, q::event_tid::args{.id = e.id});
    if (r.empty()) return std::nullopt;
    return std::string(r[0][q::event_tid::col::tid].c_str());
}

// The key hold a run's follower was sent under; NULL for a leased row.
const char* hold_of(const lease_ref& e) { return e.hold.empty() ? nullptr : e.hold.c_str(); }

}  // namespace

std::vector<std::int64_t> store::complete(std::span<const lease_ref> delivered) {
    if (delivered.empty()) return {};
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const q::complete::args args{
            .ids = number_array(delivered, [](const lease_ref& d) { return d.id; }),
            .attempts = number_array(delivered, [](const lease_ref& d) { return d.attempt; }),
            .owner = owner_,
            .tids = text_array(delivered, [&](const lease_ref& d) { return tid_of(tx, queries_, d); }),
            .holds = text_array(delivered, [](const lease_ref& d) {
                return d.hold.empty() ? std::nullopt : std::optional(d.hold);
            })};
        // plan_once sessions have these for good; a transaction pooler
        // might hand them to another client (and plans custom anyway).
        const bool scoped = !plan_once_ && !transaction_pooling_;
        if (scoped) {
            for (const auto& setting : complete_settings()) tx.exec(setting);
        }
        const auto reset = [&] {
            if (scoped) tx.exec("RESET enable_seqscan");
        };
        const auto r = [&] {
            try {
                return run(tx, args);
            } catch (const pqxx::broken_connection&) {
                throw;  // the next connection starts without them
            } catch (...) {
                reset();
                throw;
            }
        }();
        reset();
        std::vector<std::int64_t> ids;
        ids.reserve(r.size());
        for (const auto& row : r) ids.push_back(row[q::complete::col::id].as<std::int64_t>());
        return ids;
    });
}

bool store::reschedule(lease_ref e, std::chrono::milliseconds delay, std::string_view error) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto tid = tid_of(tx, queries_, e);
        return run(tx, q::reschedule::args{.id = e.id,
                                           .attempt = e.attempt,
                                           .owner = owner_,
                                           .delay_ms = static_cast<long long>(delay.count()),
                                           .error = sanitize_text(error, max_error_bytes),
                                           .tid = nullable(tid),
                                           .hold = hold_of(e)})
                   .size() == 1;
    });
}

bool store::bury(lease_ref e, std::string_view error, std::optional<int> status, std::string_view response_excerpt) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto tid = tid_of(tx, queries_, e);
        const auto status_param = status_text(status);
        return run(tx, q::bury::args{.id = e.id,
                                     .attempt = e.attempt,
                                     .owner = owner_,
                                     .error = sanitize_text(error, max_error_bytes),
                                     .status = nullable(status_param),
                                     .response_excerpt = sanitize_text(response_excerpt, max_error_bytes),
                                     .tid = nullable(tid),
                                     .hold = hold_of(e)})
                   .size() == 1;
    });
}

bool store::fan_out(lease_ref e, std::span<const owed_delivery> owed, std::span<const dead_delivery> dead) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::work tx(c);
        const auto tid = tid_of(tx, queries_, e);
        if (run(tx, q::fan_out::args{.id = e.id,
                                     .attempt = e.attempt,
                                     .owner = owner_,
                                     .tid = nullable(tid),
                                     .hold = hold_of(e)}).empty()) {
            return false;  // fenced out
        }
        if (!owed.empty()) {
            (void)run(tx, q::fan_out_deliveries::args{
                              .id = e.id,
                              .destinations = text_array(
                                  owed, [](const owed_delivery& o) { return std::optional(o.destination); }),
                              .due_ms = number_array(owed, [](const owed_delivery& o) { return o.due_in.count(); }),
                              .attempts = number_array(owed, [](const owed_delivery& o) { return o.attempts; }),
                              .errors = text_array(owed, [](const owed_delivery& o) {
                                  return o.error ? std::optional(sanitize_text(*o.error, max_error_bytes))
                                                 : std::nullopt;
                              })});
        }
        for (const auto& d : dead) {
            const auto status_param = status_text(d.status);
            (void)run(tx, q::fan_out_dead::args{.id = e.id,
                                                .destination = d.destination,
                                                .attempts = d.attempts,
                                                .error = sanitize_text(d.error, max_error_bytes),
                                                .status = nullable(status_param),
                                                .response_excerpt =
                                                    sanitize_text(d.response_excerpt, max_error_bytes)});
        }
        // Nothing owed any more (all delivered or dead): the event is done.
        (void)run(tx, q::delete_finished_events::args{.ids = fmt::format("{{{}}}", e.id)});
        tx.commit();
        return true;
    });
}

std::size_t store::finish_deliveries(const delivery_outcomes& outcomes) {
    if (outcomes.empty()) return 0;
    return session_.run([&](pqxx::connection& c) {
        std::vector<std::int64_t> finishing;  // events that may have lost their last delivery
        for (const auto& d : outcomes.delivered) finishing.push_back(d.id);
        for (const auto& d : outcomes.dead) finishing.push_back(d.ref.id);
        const auto ids = number_array(finishing, [](std::int64_t id) { return id; });

        pqxx::work tx(c);
        std::size_t recorded = 0;
        if (!finishing.empty()) (void)run(tx, q::lock_events::args{.ids = ids});
        if (!outcomes.delivered.empty()) {
            const auto& done = outcomes.delivered;
            recorded += run(tx, q::complete_deliveries::args{
                                    .ids = number_array(done, [](const delivery_ref& d) { return d.id; }),
                                    .destinations = text_array(
                                        done, [](const delivery_ref& d) { return std::optional(d.destination); }),
                                    .attempts = number_array(done, [](const delivery_ref& d) { return d.attempt; }),
                                    .owner = owner_})
                            .size();
        }
        for (const auto& r : outcomes.retries) {
            recorded += run(tx, q::reschedule_delivery::args{.id = r.ref.id,
                                                             .destination = r.ref.destination,
                                                             .attempt = r.ref.attempt,
                                                             .owner = owner_,
                                                             .delay_ms = static_cast<long long>(r.delay.count()),
                                                             .error = sanitize_text(r.error, max_error_bytes)})
                            .size();
        }
        for (const auto& d : outcomes.dead) {
            const auto status_param = status_text(d.status);
            recorded += run(tx, q::bury_delivery::args{.id = d.ref.id,
                                                       .destination = d.ref.destination,
                                                       .attempt = d.ref.attempt,
                                                       .owner = owner_,
                                                       .error = sanitize_text(d.error, max_error_bytes),
                                                       .status = nullable(status_param),
                                                       .response_excerpt =
                                                           sanitize_text(d.response_excerpt, max_error_bytes)})
                            .size();
        }
        if (!finishing.empty()) (void)run(tx, q::delete_finished_events::args{.ids = ids});
        tx.commit();
        return outcomes.delivered.size() + outcomes.retries.size() + outcomes.dead.size() - recorded;
    });
}

std::size_t store::release_untracked(const held_leases& keep) {
    return session_.run([&](pqxx::connection& c) {
        hold_session_lock(c);
        pqxx::nontransaction tx(c);
        const auto same = [](std::int64_t id) { return id; };
        // Rare (after a failed claim): not prepared.
        return exec_params(tx, queries_, q::release_untracked::args{.owner = owner_,
                                                                   .keep_ids = number_array(keep.events, same),
                                                                   .keep_delivery_ids = number_array(keep.delivery_ids, same),
                                                                   .keep_delivery_destinations =
                                                                       text_array(keep.delivery_destinations)})
            .size();
    });
}

std::size_t store::release() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return run(tx, q::release::args{.owner = owner_}).size();
    });
}

std::size_t store::forget_expired_key_holds() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec<q::forget_expired_key_holds>(tx, queries_).affected_rows();
    });
}

std::string store::message_prefix() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec<q::message_prefix>(tx, queries_).one()[q::message_prefix::col::prefix].as<std::string>();
    });
}

std::vector<delivery_ref> store::bury_orphan_deliveries() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        std::vector<delivery_ref> out;
        for (const auto& row : exec<q::bury_orphan_deliveries>(tx, queries_)) {
            out.push_back({row[q::bury_orphan_deliveries::col::id].as<std::int64_t>(),
                           row[q::bury_orphan_deliveries::col::destination].c_str(), 0});
        }
        return out;
    });
}

std::int64_t store::purge_idempotency_keys(std::chrono::milliseconds retention) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return run(tx, q::purge_idempotency_keys::args{.retention_ms = static_cast<long long>(retention.count())})
            .one()[q::purge_idempotency_keys::col::purge_idempotency_keys]
            .as<std::int64_t>();
    });
}

std::size_t store::purge_dead_letters(std::chrono::milliseconds retention, std::size_t batch) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return run(tx, q::purge_dead_letters::args{.retention_ms = static_cast<long long>(retention.count()),
                                                   .batch = static_cast<long long>(batch)})
            .size();
    });
}

void store::publish_circuit(const std::string& destination, const std::string& state_json) {
    session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        (void)exec_params(tx, queries_,
                          q::publish_circuit::args{.owner = owner_, .destination = destination, .state = state_json});
    });
}

void store::reset_circuits() {
    session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        (void)exec_params(tx, queries_, q::reset_circuits::args{.owner = owner_});
    });
}

void store::set_destinations(const std::vector<std::string>& destinations) {
    known_destination_ = known_destination_sql(destinations);
    known_destinations_ = destinations;
    if (!connected()) return;  // a new connection prepares them
    session_.run([&](pqxx::connection& c) {
        unprepare_claims(c);
        prepare_claims(c);
    });
}

store::stats store::read_stats(std::int64_t cap) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto row = exec_params(tx, queries_, q::relay_stats::args{.cap = static_cast<long long>(cap)}).one();
        using col = q::relay_stats::col;
        return stats{row[col::backlog].as<std::int64_t>(), row[col::oldest_pending_seconds].as<double>(),
                     row[col::schema_version].as<int>()};
    });
}

std::size_t store::release_waiting_deliveries(const std::string& destination) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_, q::release_waiting_deliveries::args{.destination = destination})
            .affected_rows();
    });
}

std::size_t store::release_one_waiting_delivery(const std::string& destination) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_, q::release_one_waiting_delivery::args{.destination = destination})
            .affected_rows();
    });
}

bool store::hand_back(lease_ref e, std::chrono::milliseconds delay) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto tid = tid_of(tx, queries_, e);
        return run(tx, q::hand_back::args{.id = e.id,
                                          .attempt = e.attempt,
                                          .owner = owner_,
                                          .delay_ms = static_cast<long long>(delay.count()),
                                          .tid = nullable(tid),
                                          .hold = hold_of(e)})
                   .size() == 1;
    });
}

bool store::hand_back_delivery(const delivery_ref& d, std::chrono::milliseconds delay) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return run(tx, q::hand_back_delivery::args{.id = d.id,
                                                   .destination = d.destination,
                                                   .attempt = d.attempt,
                                                   .owner = owner_,
                                                   .delay_ms = static_cast<long long>(delay.count())})
                   .size() == 1;
    });
}

void store::bind_leases_to_session() {
    const bool fresh = !connected();
    bound_to_session_ = true;
    if (fresh) {
        session_.connect();  // set_up registers
    } else {
        session_.run([&](pqxx::connection& c) { register_session(c); });
    }
}

namespace {

// relays_consuming_otherwise, live_relay_modes: live relays and their mode,
// in a transaction of its own (the dead relays' locks it got go with it).
template <typename Args>
std::vector<store::registered_relay> read_live_relays(pqxx::connection& c, const query_book& book,
                                                      const Args& args) {
    using col = typename query_of<Args>::col;
    std::vector<store::registered_relay> out;
    pqxx::work tx(c);
    for (const auto& row : exec_params(tx, book, args)) {
        out.push_back({row[col::lease_owner].template as<std::string>(), row[col::consume].template as<std::string>()});
    }
    tx.commit();
    return out;
}

}  // namespace

// Before any claim on a session: a lease it stamps is then covered by the
// lock (see register_relay), or, while our previous session still holds it,
// by that one.
void store::register_session(pqxx::connection& c, int tries) {
    // A previous session that we closed ends at the server a moment later:
    // a few tries at connect cover that; one that lingers (a partition) is
    // tried once more at each claim, not waited for there.
    for (int attempt = 0; attempt < tries; ++attempt) {
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        {
            pqxx::nontransaction tx(c);
            const auto args = q::register_relay::args{.owner = owner_, .consume = consume_mode()};
            holds_session_lock_ = !exec_params(tx, queries_, args).empty();
        }
        if (holds_session_lock_) {
            // The first registration is checked by the relay at startup
            // (relays_consuming_otherwise()); a later one here, after it
            // committed, as at startup.
            if (std::exchange(registered_before_, true)) {
                auto others = read_live_relays(
                    c, queries_, q::relays_consuming_otherwise::args{.owner = owner_, .consume = consume_mode()});
                if (!others.empty()) throw consume_mode_conflict(std::move(others));
            }
            return;
        }
    }
}

std::vector<store::registered_relay> store::relays_consuming_otherwise() {
    return session_.run([&](pqxx::connection& c) {
        return read_live_relays(c, queries_,
                                q::relays_consuming_otherwise::args{.owner = owner_, .consume = consume_mode()});
    });
}

std::vector<store::registered_relay> store::live_relays() {
    return session_.run(
        [&](pqxx::connection& c) { return read_live_relays(c, queries_, q::live_relay_modes::args{.owner = owner_}); });
}

void store::hold_session_lock(pqxx::connection& c) {
    if (bound_to_session_ && !holds_session_lock_) register_session(c, 1);
}

store::takeover store::take_over_dead_relays() {
    return session_.run([&](pqxx::connection& c) {
        takeover out;
        pqxx::work tx(c);
        for (const auto& row : exec_params(tx, queries_, q::find_dead_relays::args{.owner = owner_})) {
            out.relays.push_back(row[q::find_dead_relays::col::lease_owner].as<std::string>());
        }
        if (!out.relays.empty()) {
            const auto owners = text_array(out.relays);
            out.leases = exec_params(tx, queries_, q::take_over_leases::args{.owners = owners}).size();
            out.cursors = exec_params(tx, queries_, q::free_dead_cursors::args{.owners = owners}).size();
        }
        tx.commit();
        return out;
    });
}

}  // namespace outboxd::pg
