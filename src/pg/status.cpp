#include "pg/status.hpp"

#include <pqxx/pqxx>

#include "pg/named_queries.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {

std::vector<work_status> outbox_status(pqxx::connection& conn, const std::string& schema) {
    const query_book book(schema);
    pqxx::nontransaction tx(conn);
    using col = q::status::col;
    std::vector<work_status> out;
    for (const auto& row : exec<q::status>(tx, book)) {
        work_status t;
        t.topic = row[col::topic].c_str();
        if (!row[col::destination].is_null()) t.destination = row[col::destination].c_str();
        t.pending = row[col::pending].as<std::int64_t>();
        t.waiting_on_key = row[col::waiting_on_key].as<std::int64_t>();
        t.scheduled = row[col::scheduled].as<std::int64_t>();
        t.in_flight = row[col::in_flight].as<std::int64_t>();
        t.retrying = row[col::retrying].as<std::int64_t>();
        t.dead = row[col::dead].as<std::int64_t>();
        t.oldest_pending_seconds = row[col::oldest_pending_seconds].as<double>();
        if (!row[col::last_error].is_null()) t.last_error = row[col::last_error].c_str();
        out.push_back(std::move(t));
    }
    return out;
}

circuit_reports published_circuits(pqxx::connection& conn, const std::string& schema) {
    const query_book book(schema);
    pqxx::nontransaction tx(conn);
    using col = q::circuits::col;
    circuit_reports out;
    for (const auto& row : exec<q::circuits>(tx, book)) {
        out.live_relays = row[col::relays].as<std::int64_t>();
        if (row[col::destination].is_null()) continue;
        out.destinations.push_back({row[col::destination].c_str(), row[col::open].as<std::int64_t>()});
    }
    return out;
}

}  // namespace outboxd::pg
