#include "pg/dead_letters.hpp"

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "pg/named_queries.hpp"
#include "pg/params.hpp"

namespace outboxd::pg {
namespace {

std::optional<std::string> as_text(const std::optional<std::int64_t>& v) {
    return v ? std::optional<std::string>(fmt::format("{}", *v)) : std::nullopt;
}

std::optional<std::string> as_text(const std::optional<std::chrono::milliseconds>& v) {
    return v ? std::optional<std::string>(fmt::format("{}", v->count())) : std::nullopt;
}

std::string text_or_empty(const pqxx::field& f) { return f.is_null() ? std::string() : std::string(f.c_str()); }

}  // namespace

std::vector<dead_letter> list_dead(pqxx::connection& conn, const std::string& schema, const dead_filter& filter,
                                   std::size_t limit) {
    const query_book q(schema);
    pqxx::nontransaction tx(conn);
    const auto older = as_text(filter.older_than);
    const auto r = tx.exec_params(q.sql("dead_list"), nullable(filter.topic), nullable(older),
                                  static_cast<long long>(limit));
    std::vector<dead_letter> out;
    for (const auto& row : r) {
        dead_letter d;
        d.id = row[0].as<std::int64_t>();
        d.topic = row[1].c_str();
        if (!row[2].is_null()) d.ordering_key = row[2].c_str();
        d.attempts = row[3].as<int>();
        if (!row[4].is_null()) d.last_status = row[4].as<int>();
        d.last_error = text_or_empty(row[5]);
        d.response_excerpt = text_or_empty(row[6]);
        d.created_at = row[7].c_str();
        d.died_at = row[8].c_str();
        d.payload = row[9].c_str();
        if (!row[10].is_null()) d.destination = row[10].c_str();
        d.message_id = row[11].c_str();
        out.push_back(std::move(d));
    }
    return out;
}

std::vector<std::int64_t> replay_dead(pqxx::connection& conn, const std::string& schema, const dead_filter& filter) {
    const query_book q(schema);
    pqxx::work tx(conn);
    const auto id = as_text(filter.id);
    const auto older = as_text(filter.older_than);
    // Two statements: the replay must see what a relay that held these
    // events' locks committed (see dead_replay_lock in queries.sql).
    tx.exec_params(q.sql("dead_replay_serialize"), schema);
    std::string locked = "{";
    for (const auto& row :
         tx.exec_params(q.sql("dead_replay_lock"), nullable(id), nullable(filter.topic), nullable(older))) {
        if (locked.size() > 1) locked.push_back(',');
        locked += row[0].c_str();
    }
    locked.push_back('}');
    const auto r =
        tx.exec_params(q.sql("dead_replay"), nullable(id), nullable(filter.topic), nullable(older), locked);
    tx.commit();
    std::vector<std::int64_t> ids;
    for (const auto& row : r) ids.push_back(row[0].as<std::int64_t>());
    return ids;
}

std::size_t count_dead(pqxx::connection& conn, const std::string& schema, const dead_filter& filter) {
    const query_book q(schema);
    pqxx::nontransaction tx(conn);
    const auto id = as_text(filter.id);
    const auto older = as_text(filter.older_than);
    return tx.exec_params1(q.sql("dead_replay_left"), nullable(id), nullable(filter.topic), nullable(older))[0]
        .as<std::size_t>();
}

std::size_t purge_dead(pqxx::connection& conn, const std::string& schema, std::chrono::milliseconds older_than,
                       const std::optional<std::string>& topic, bool dry_run) {
    const query_book q(schema);
    pqxx::work tx(conn);
    if (dry_run) {
        return tx.exec_params1(q.sql("dead_purge_count"), static_cast<long long>(older_than.count()), nullable(topic))[0]
            .as<std::size_t>();
    }
    const auto r = tx.exec_params(q.sql("dead_purge"), static_cast<long long>(older_than.count()), nullable(topic));
    tx.commit();
    return r.size();
}

std::vector<topic_status> outbox_status(pqxx::connection& conn, const std::string& schema) {
    const query_book q(schema);
    pqxx::nontransaction tx(conn);
    std::vector<topic_status> out;
    for (const auto& row : tx.exec(q.sql("status"))) {
        topic_status t;
        t.topic = row["topic"].c_str();
        t.pending = row["pending"].as<std::int64_t>();
        t.waiting_on_key = row["waiting_on_key"].as<std::int64_t>();
        t.scheduled = row["scheduled"].as<std::int64_t>();
        t.in_flight = row["in_flight"].as<std::int64_t>();
        t.retrying = row["retrying"].as<std::int64_t>();
        t.dead = row["dead"].as<std::int64_t>();
        t.oldest_pending_seconds = row["oldest_pending_seconds"].as<double>();
        if (!row["last_error"].is_null()) t.last_error = row["last_error"].c_str();
        out.push_back(std::move(t));
    }
    return out;
}

}  // namespace outboxd::pg
