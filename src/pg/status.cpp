#include "pg/status.hpp"

#include <pqxx/pqxx>

#include "pg/named_queries.hpp"
#include "pg/store.hpp"
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
        out.claiming = row[col::claiming].as<std::int64_t>();
        out.windows = row[col::windows].as<std::int64_t>();
        if (row[col::destination].is_null()) continue;
        out.destinations.push_back({row[col::destination].c_str(), row[col::open].as<std::int64_t>()});
    }
    return out;
}

bool outbox_windows_set_up(pqxx::connection& conn, const std::string& schema) {
    const query_book book(schema);
    pqxx::nontransaction tx(conn);
    using col = q::windows_set_up::col;
    const auto row = exec_params(tx, book, q::windows_set_up::args{.schema = schema}).one();
    return row[col::txid_default].as<bool>() && row[col::txid_index].as<bool>();
}

std::optional<windows_report> windows_status(pqxx::connection& conn, const std::string& schema) {
    const query_book book(schema);
    pqxx::read_transaction tx(conn);
    std::vector<window_cursor_state> cursors;
    {
        using col = q::windows_cursors_status::col;
        for (const auto& row : exec<q::windows_cursors_status>(tx, book)) {
            window_cursor_state c;
            c.slot = row[col::slot].as<int>();
            if (!row[col::owner].is_null()) c.owner = row[col::owner].as<std::string>();
            c.owner_alive = row[col::owner_alive].as<bool>(false);
            c.snap_a = row[col::snap_a].as<std::string>();
            if (!row[col::snap_b].is_null()) c.snap_b = row[col::snap_b].as<std::string>();
            c.system_identifier = row[col::system_identifier].as<std::int64_t>();
            c.checkpoint_age_seconds = row[col::checkpoint_age_seconds].as<double>();
            cursors.push_back(std::move(c));
        }
    }
    const auto server = read_server_position(tx, book);
    auto report = judge_windows(cursors, server);
    if (!report || report->verdict != window_verdict::fine) return report;
    using col = q::windows_holding_back::col;
    for (const auto& row : exec<q::windows_holding_back>(tx, book)) {
        holding_transaction t;
        t.xid = row[col::xid].as<std::string>();
        if (!row[col::gid].is_null()) t.gid = row[col::gid].as<std::string>();
        if (!row[col::prepared_by].is_null()) t.prepared_by = row[col::prepared_by].as<std::string>();
        if (!row[col::pid].is_null()) t.pid = row[col::pid].as<std::int64_t>();
        if (!row[col::state].is_null()) t.state = row[col::state].as<std::string>();
        if (!row[col::application_name].is_null()) t.application_name = row[col::application_name].as<std::string>();
        if (!row[col::age_seconds].is_null()) t.age_seconds = row[col::age_seconds].as<double>();
        report->holding_back.push_back(std::move(t));
    }
    return report;
}

}  // namespace outboxd::pg
