#include "pg/session.hpp"

#include <fmt/format.h>

#include "core/text.hpp"

namespace outboxd::pg {

session::session(std::string dsn, std::chrono::milliseconds statement_timeout,
                 std::function<void(pqxx::connection&)> set_up)
    : dsn_(std::move(dsn)), statement_timeout_(statement_timeout), set_up_(std::move(set_up)) {}

session::~session() = default;

std::chrono::milliseconds session::call_limit() const noexcept {
    return statement_timeout_.count() > 0 ? statement_timeout_ + answer_margin : statement_timeout_;
}

void session::connect() {
    conn_.reset();
    auto c = std::make_unique<pqxx::connection>(dsn_);  // bounded by connect_timeout
    // A lost connection is dropped and made anew by conn(); libpqxx 6 must
    // not reconnect by itself inside a later statement of the same call (a
    // rollback, say), where our deadline watches the old socket, not the new.
    c->inhibit_reactivation(true);
    if (set_up_) with_deadline(*c, call_limit(), [&](pqxx::connection& cc) { set_up_(cc); });
    conn_ = std::move(c);
}

bool session::connected() const noexcept { return conn_ && conn_->is_open(); }

void session::disconnect() noexcept { conn_.reset(); }

pqxx::connection& session::conn() {
    if (!connected()) connect();
    return *conn_;
}

void session::lost(const pqxx::broken_connection& e) {
    conn_.reset();
    // libpq's words alone read like riddles ("Could not obtain client
    // encoding: not connected."); say what happens next.
    throw pqxx::broken_connection(fmt::format(
        "lost the connection to the database; reconnecting at the next statement ({})", one_line(e.what())));
}

}  // namespace outboxd::pg
