#pragma once
// One database connection of the relay or a producer, made on first use and
// remade after it was lost. Every call runs under a deadline (see
// stall_watchdog.hpp). Blocking; not thread-safe.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <pqxx/connection>

namespace outboxd::pg {

class session {
public:
    // set_up: runs on every new connection (settings, prepared statements),
    // under the same deadline as a call. statement_timeout (0: none): every
    // call is given up, its connection cut, when not answered within it plus
    // answer_margin: the server never sees a query sent into a network
    // partition, so only our own deadline ends the wait.
    session(std::string dsn, std::chrono::milliseconds statement_timeout,
            std::function<void(pqxx::connection&)> set_up);
    // Time for the server's own cancellation to come back before we cut.
    static constexpr std::chrono::milliseconds answer_margin{2'000};
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    // Connects now (otherwise the first call does). Throws on failure.
    void connect();
    [[nodiscard]] bool connected() const noexcept;
    void disconnect() noexcept;

    // Runs f(connection) under the deadline. A lost connection is dropped, so
    // the next call starts afresh, and reported as a broken_connection that
    // says so.
    template <typename F>
    auto run(F&& f);

    [[nodiscard]] std::chrono::milliseconds call_limit() const noexcept;

private:
    pqxx::connection& conn();
    [[noreturn]] void lost(const pqxx::broken_connection& e);

    std::string dsn_;
    std::chrono::milliseconds statement_timeout_;
    std::function<void(pqxx::connection&)> set_up_;
    std::unique_ptr<pqxx::connection> conn_;
};

}  // namespace outboxd::pg

#include "pg/stall_watchdog.hpp"

namespace outboxd::pg {

template <typename F>
auto session::run(F&& f) {
    try {
        return with_deadline(conn(), call_limit(), std::forward<F>(f));
    } catch (const pqxx::broken_connection& e) {
        lost(e);
    }
}

}  // namespace outboxd::pg
