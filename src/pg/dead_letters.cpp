#include "pg/dead_letters.hpp"

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "pg/named_queries.hpp"
#include "pg/params.hpp"
#include "pg/sql_arrays.hpp"
#include "pg/typed_query.hpp"

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
    const query_book book(schema);
    pqxx::nontransaction tx(conn);
    const auto older = as_text(filter.older_than);
    const auto r = exec_params(tx, book,
                               q::dead_list::args{.topic_regex = nullable(filter.topic),
                                                  .older_than_ms = nullable(older),
                                                  .max_rows = static_cast<long long>(limit)});
    using col = q::dead_list::col;
    std::vector<dead_letter> out;
    for (const auto& row : r) {
        dead_letter d;
        d.id = row[col::id].as<std::int64_t>();
        d.topic = row[col::topic].c_str();
        if (!row[col::ordering_key].is_null()) d.ordering_key = row[col::ordering_key].c_str();
        d.attempts = row[col::attempts].as<int>();
        if (!row[col::last_status].is_null()) d.last_status = row[col::last_status].as<int>();
        d.last_error = text_or_empty(row[col::last_error]);
        d.response_excerpt = text_or_empty(row[col::response_excerpt]);
        d.created_at = row[col::created_at].c_str();
        d.died_at = row[col::died_at].c_str();
        d.payload = row[col::payload].c_str();
        if (!row[col::destination].is_null()) d.destination = row[col::destination].c_str();
        d.message_id = row[col::message_id].c_str();
        out.push_back(std::move(d));
    }
    return out;
}

std::vector<std::int64_t> replay_dead(pqxx::connection& conn, const std::string& schema, const dead_filter& filter) {
    const query_book book(schema);
    pqxx::work tx(conn);
    const auto id = as_text(filter.id);
    const auto older = as_text(filter.older_than);
    // Two statements: the replay must see what a relay that held these
    // events' locks committed (see dead_replay_lock in queries.sql).
    (void)exec_params(tx, book, q::dead_replay_serialize::args{.schema = schema});
    std::vector<std::int64_t> locked_ids;
    for (const auto& row : exec_params(tx, book,
                                       q::dead_replay_lock::args{.id = nullable(id),
                                                                 .topic_regex = nullable(filter.topic),
                                                                 .older_than_ms = nullable(older)})) {
        locked_ids.push_back(row[q::dead_replay_lock::col::id].as<std::int64_t>());
    }
    const auto locked = number_array(locked_ids, [](std::int64_t i) { return i; });
    const auto r = exec_params(tx, book,
                               q::dead_replay::args{.id = nullable(id),
                                                    .topic_regex = nullable(filter.topic),
                                                    .older_than_ms = nullable(older),
                                                    .locked_ids = locked});
    tx.commit();
    std::vector<std::int64_t> ids;
    for (const auto& row : r) ids.push_back(row[q::dead_replay::col::id].as<std::int64_t>());
    return ids;
}

std::size_t count_dead(pqxx::connection& conn, const std::string& schema, const dead_filter& filter) {
    const query_book book(schema);
    pqxx::nontransaction tx(conn);
    const auto id = as_text(filter.id);
    const auto older = as_text(filter.older_than);
    return exec_params(tx, book,
                       q::dead_replay_left::args{.id = nullable(id),
                                                 .topic_regex = nullable(filter.topic),
                                                 .older_than_ms = nullable(older)})
        .one()[q::dead_replay_left::col::count]
        .as<std::size_t>();
}

std::size_t purge_dead(pqxx::connection& conn, const std::string& schema, std::chrono::milliseconds older_than,
                       const std::optional<std::string>& topic, bool dry_run) {
    const query_book book(schema);
    pqxx::work tx(conn);
    const auto older_ms = static_cast<long long>(older_than.count());
    if (dry_run) {
        return exec_params(tx, book,
                           q::dead_purge_count::args{.older_than_ms = older_ms, .topic_regex = nullable(topic)})
            .one()[q::dead_purge_count::col::count]
            .as<std::size_t>();
    }
    const auto r = exec_params(tx, book, q::dead_purge::args{.older_than_ms = older_ms, .topic_regex = nullable(topic)});
    tx.commit();
    return r.size();
}

}  // namespace outboxd::pg
