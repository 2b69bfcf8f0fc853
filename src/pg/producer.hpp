#pragma once
// A producer's database work: enqueue events through the outbox's own
// enqueue() (sql/0001), each in its own durable transaction. Applications
// call enqueue() in their own transactions instead; this is `outboxd
// enqueue`'s. Blocking; not thread-safe.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "pg/named_queries.hpp"
#include "pg/session.hpp"

namespace outboxd::pg {

struct new_event {
    std::string topic;
    std::string payload;  // JSON text
    std::optional<std::string> ordering_key;
    std::optional<std::string> idempotency_key;
    std::string headers = "{}";  // JSON object of strings
    std::chrono::milliseconds delay{0};
};

class producer {
public:
    producer(std::string dsn, std::string schema);

    // Connects now (otherwise the first call does). Throws on failure.
    void connect();

    // Commits the event; returns its id.
    [[nodiscard]] std::int64_t enqueue(const new_event& e);

    // What this outbox's message ids start with (sql/0005, "msg_<hex>_").
    [[nodiscard]] std::string message_prefix();

private:
    query_book queries_;
    session session_;
};

}  // namespace outboxd::pg
