// The relay's wake-up bookkeeping (sql/0008). Unprepared statements: they
// run at most a few times a second, and poll mode must work behind a
// transaction pooler that keeps no prepared statements.
#include <pqxx/pqxx>

#include "pg/store.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {

void store::declare_wake(bool idle, std::chrono::milliseconds valid) {
    session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        (void)exec_params(tx, queries_,
                          q::declare_wake::args{.owner = owner_, .idle = idle,
                                                .valid_ms = static_cast<long long>(valid.count())});
    });
}

void store::forget_wake() {
    session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        (void)exec_params(tx, queries_, q::forget_wake::args{.owner = owner_});
    });
}

std::vector<xact_in_progress> store::transactions_in_progress() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::transactions_in_progress::col;
        std::vector<xact_in_progress> xacts;
        for (const auto& row : exec<q::transactions_in_progress>(tx, queries_)) {
            xact_in_progress x{row[col::xid].as<std::string>(), row[col::writes_events].as<bool>(), std::nullopt};
            if (!row[col::written_since_us].is_null()) {
                x.written_since = database_time(std::chrono::microseconds(row[col::written_since_us].as<std::int64_t>()));
            }
            xacts.push_back(std::move(x));
        }
        return xacts;
    });
}

std::string store::still_in_progress(const std::string& xids) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_, q::still_in_progress::args{.xids = xids})
            .one()[q::still_in_progress::col::xids]
            .as<std::string>();
    });
}

void store::notify(const std::string& channel) {
    session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        (void)exec_params(tx, queries_, q::notify_channel::args{.channel = channel});
    });
}

bool store::wake_trigger_installed() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_, q::wake_trigger_installed::args{.schema = schema_})
                   .one()[q::wake_trigger_installed::col::triggers]
                   .as<long long>() > 0;
    });
}

std::string store::not_yet_visible(const std::string& xids) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_, q::not_yet_visible::args{.xids = xids})
            .one()[q::not_yet_visible::col::xids]
            .as<std::string>();
    });
}

store::wal_readiness store::wal_wake_readiness(const std::string& publication) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::wal_wake_readiness::col;
        const auto row = exec_params(tx, queries_, q::wal_wake_readiness::args{.publication = publication,
                                                                               .schema = schema_})
                             .one();
        return wal_readiness{.role = row[col::role].as<std::string>(),
                             .wal_level = row[col::wal_level].as<std::string>(),
                             .may_replicate = row[col::may_replicate].as<bool>(),
                             .publication_ready = row[col::publication_ready].as<bool>(),
                             .free_slots = row[col::free_slots].as<long long>(),
                             .free_senders = row[col::free_senders].as<long long>()};
    });
}

}  // namespace outboxd::pg
