#include "pg/producer.hpp"

#include <pqxx/pqxx>

#include "pg/params.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {

producer::producer(std::string dsn, std::string schema)
    : queries_(schema),
      session_(std::move(dsn), std::chrono::milliseconds(0),
               [this](pqxx::connection& c) { queries_.prepare<q::enqueue>(c); }) {}

void producer::connect() { session_.connect(); }

std::int64_t producer::enqueue(const new_event& e) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::work tx(c);
        const auto r = exec_prepared(tx, q::enqueue::args{.topic = e.topic,
                                                          .payload = e.payload,
                                                          .ordering_key = nullable(e.ordering_key),
                                                          .idempotency_key = nullable(e.idempotency_key),
                                                          .headers = e.headers,
                                                          .delay_ms = static_cast<long long>(e.delay.count())});
        tx.commit();
        return r.one()[q::enqueue::col::enqueue].as<std::int64_t>();
    });
}

std::string producer::message_prefix() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec<q::message_prefix>(tx, queries_).one()[q::message_prefix::col::prefix].as<std::string>();
    });
}

}  // namespace outboxd::pg
