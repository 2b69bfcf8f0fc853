// The relay's claims: events (three variants, by where the scan starts) and
// deliveries, one prepared statement per claim size.
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "core/sql_ident.hpp"
#include "pg/event_columns.hpp"
#include "pg/sql_arrays.hpp"
#include "pg/store.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {
namespace {

// The columns every claim returns: id, topic, ordering_key, payload,
// headers, attempts, age_us (a claim without one of them does not compile).
// Decoded row by row: a row that cannot be decoded comes back with the
// reason (and its id and attempt, to dead-letter it under our lease) instead
// of failing the whole claim, whose other rows would stay leased unsent.
template <typename Q>
event read_claimed(const row_of<Q>& row) {
    using col = typename Q::col;
    event e;
    e.id = row[col::id].template as<std::int64_t>();
    e.attempt = row[col::attempts].template as<std::int32_t>();
    e.topic = row[col::topic].c_str();
    if (const auto key = row[col::ordering_key]; !key.is_null()) e.ordering_key = std::string(key.c_str(), key.size());
    const auto payload = row[col::payload];
    e.payload.assign(payload.c_str(), payload.size());
    try {
        e.headers = parse_headers(row[col::headers].c_str());
    } catch (const std::exception&) {
        // Not the parser's text: it quotes the offending bytes.
        e.undecodable = undecodable_headers;
    }
    if (const auto age = row[col::age_us]; !age.is_null()) {
        e.age_at_claim = std::chrono::microseconds(std::max<long long>(0, age.template as<long long>()));
    }
    return e;
}

// An event claim's rows: the events, then one more row (id NULL) that says
// what is due next and where the claim stopped.
template <typename Q>
claim_result read_claim(const rows_of<Q>& rows) {
    using col = typename Q::col;
    claim_result out;
    out.events.reserve(rows.size());
    for (const auto& row : rows) {
        if (row[col::id].is_null()) {
            if (const auto next = row[col::next_due_ms]; !next.is_null()) {
                out.next_due = std::chrono::milliseconds(std::max<long long>(0, next.template as<long long>()));
            }
            out.deliveries_due = row[col::deliveries_due].template as<bool>();
            if (const auto at = row[col::watermark_at]; !at.is_null()) {
                out.last = claim_watermark{at.c_str(), row[col::watermark_id].template as<std::int64_t>()};
            }
            out.low_mark = row[col::low_mark].c_str();
            out.picked = row[col::picked].template as<std::size_t>();
            out.picked_keyed = row[col::picked_keyed].template as<bool>();
            continue;
        }
        auto e = read_claimed(row);
        e.key_pending = row[col::key_pending].template as<bool>();
        e.tid = row[col::tid].c_str();
        if (const auto head = row[col::run_head]; !head.is_null()) e.run_head = head.template as<std::int64_t>();
        if (const auto hold = row[col::hold]; !hold.is_null()) e.hold = hold.c_str();
        if (const auto only = row[col::destinations]; !only.is_null()) e.only_to = destination_names(only.c_str());
        out.events.push_back(std::move(e));
    }
    return out;
}

std::string prepared_name(std::string_view query, std::size_t size) { return fmt::format("{}_{}", query, size); }

// The event claim's three variants (claim_from), with and without its
// per-key part.
struct full_claims {
    using beginning = q::claim;
    using low_mark = q::claim_from;
    using drain_watermark = q::claim_after;
};
struct unkeyed_claims {
    using beginning = q::claim_unkeyed;
    using low_mark = q::claim_unkeyed_from;
    using drain_watermark = q::claim_unkeyed_after;
};

template <typename Family>
std::string claim_text(const std::string& schema, std::size_t size, claim_from from,
                       const std::string& known_destination) {
    const auto limit = fmt::format("{}", size);
    switch (from) {
        case claim_from::low_mark:
            return Family::low_mark::text(schema, {.claim_size = limit, .known_destination = known_destination});
        case claim_from::drain_watermark:
            return Family::drain_watermark::text(schema, {.claim_size = limit, .known_destination = known_destination});
        case claim_from::beginning:
            break;
    }
    return Family::beginning::text(schema, {.claim_size = limit, .known_destination = known_destination});
}

template <typename Family>
std::string_view name_of(claim_from from) {
    return from == claim_from::low_mark          ? Family::low_mark::name
           : from == claim_from::drain_watermark ? Family::drain_watermark::name
                                                 : Family::beginning::name;
}

// One claim of a family, as a prepared statement or (transaction pooling)
// with its text.
template <typename Family>
claim_result run_claim_of(pqxx::transaction_base& tx, const std::optional<std::string>& text, std::size_t size,
                          const std::string& owner, long long lease_ms, const std::optional<claim_watermark>& after,
                          const std::optional<std::string>& low_mark, bool followed) {
    const auto run = [&]<typename Args>(const Args& args) {
        return text ? read_claim(exec_params(tx, *text, args))
                    : read_claim(exec_prepared(tx, prepared_name(query_of<Args>::name, size), args));
    };
    if (after) {
        return run(typename Family::drain_watermark::args{
            .owner = owner, .lease_ms = lease_ms, .watermark_at = after->available_at, .watermark_id = after->id});
    }
    if (low_mark) {
        return run(typename Family::low_mark::args{
            .owner = owner, .lease_ms = lease_ms, .low_mark = *low_mark, .followed = followed});
    }
    return run(typename Family::beginning::args{.owner = owner, .lease_ms = lease_ms});
}

}  // namespace

std::string store::claim_sql(std::size_t size, claim_from from, bool unkeyed) const {
    return unkeyed ? claim_text<unkeyed_claims>(schema_, size, from, known_destination_)
                   : claim_text<full_claims>(schema_, size, from, known_destination_);
}

std::string store::claim_deliveries_sql(std::size_t size) const {
    return q::claim_deliveries::text(schema_, {.claim_size = fmt::format("{}", size)});
}

claim_result store::claim(std::size_t limit, std::chrono::milliseconds lease,
                          const std::optional<claim_watermark>& after, const std::optional<std::string>& low_mark,
                          bool followed, bool unkeyed) {
    return session_.run([&](pqxx::connection& c) {
        hold_session_lock(c);
        pqxx::nontransaction tx(c);
        const auto size = claim_size(limit);
        const auto lease_ms = static_cast<long long>(lease.count());
        const auto from = after ? claim_from::drain_watermark : low_mark ? claim_from::low_mark : claim_from::beginning;
        // Unprepared behind a transaction pooler (no prepared statements there).
        const auto text = transaction_pooling_ ? std::optional<std::string>(claim_sql(size, from, unkeyed)) : std::nullopt;
        return unkeyed ? run_claim_of<unkeyed_claims>(tx, text, size, owner_, lease_ms, after, low_mark, followed)
                       : run_claim_of<full_claims>(tx, text, size, owner_, lease_ms, after, low_mark, followed);
    });
}

std::vector<event> store::claim_deliveries(std::size_t limit, std::chrono::milliseconds lease,
                                           std::span<const std::string> destinations) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const q::claim_deliveries::args args{
            .owner = owner_,
            .lease_ms = static_cast<long long>(lease.count()),
            .destinations = text_array(destinations),
            .windows = consume_windows_};
        const auto r = transaction_pooling_
                           ? exec_params(tx, claim_deliveries_sql(claim_size(limit)), args)
                           : exec_prepared(tx, prepared_name(q::claim_deliveries::name, claim_size(limit)), args);
        std::vector<event> out;
        out.reserve(r.size());
        for (const auto& row : r) {
            auto e = read_claimed(row);
            const auto destination = row[q::claim_deliveries::col::destination];
            e.destination = std::string(destination.c_str(), destination.size());
            out.push_back(std::move(e));
        }
        return out;
    });
}

// Size 0 claims nothing and still reports what is due next.
void store::prepare_claims(pqxx::connection& c) const {
    for (std::size_t size = 0; size <= largest_claim; size = std::max<std::size_t>(1, size * 2)) {
        for (const auto from : {claim_from::beginning, claim_from::low_mark, claim_from::drain_watermark}) {
            c.prepare(prepared_name(name_of<full_claims>(from), size), claim_sql(size, from, false));
            c.prepare(prepared_name(name_of<unkeyed_claims>(from), size), claim_sql(size, from, true));
        }
        c.prepare(prepared_name(q::claim_deliveries::name, size), claim_deliveries_sql(size));
    }
}

void store::unprepare_claims(pqxx::connection& c) const {
    for (std::size_t size = 0; size <= largest_claim; size = std::max<std::size_t>(1, size * 2)) {
        for (const auto name : {q::claim::name, q::claim_from::name, q::claim_after::name, q::claim_unkeyed::name,
                                 q::claim_unkeyed_from::name, q::claim_unkeyed_after::name, q::claim_deliveries::name}) {
            c.unprepare(prepared_name(name, size));
        }
    }
}

}  // namespace outboxd::pg
