#include "pg/listener.hpp"

#include <algorithm>
#include <random>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/dsn.hpp"
#include "core/log.hpp"
#include "core/sql_ident.hpp"
#include "pg/stall_watchdog.hpp"

namespace outboxd::pg {

namespace net = boost::asio;

namespace {

std::shared_ptr<pqxx::connection> open_listening(const std::string& dsn, const std::string& channel,
                                                 std::chrono::milliseconds answer_within) {
    auto conn = std::make_shared<pqxx::connection>(dsn);  // bounded by connect_timeout
    conn->inhibit_reactivation(true);  // a lost connection is replaced by us, never revived by libpqxx
    with_deadline(*conn, answer_within, [&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        tx.exec("LISTEN " + quote_ident(channel));
    });
    return conn;
}

}  // namespace

listener::listener(net::io_context& ioc, net::any_io_executor blocking, std::string dsn, std::string channel,
                   callbacks cb, std::chrono::milliseconds keepalive_timeout)
    : ioc_(ioc), blocking_(std::move(blocking)), dsn_(std::move(dsn)), channel_(std::move(channel)),
      cb_(std::move(cb)), socket_(ioc), retry_timer_(ioc), ping_timer_(ioc), keepalive_timeout_(keepalive_timeout) {}

listener::~listener() {
    *alive_ = false;
    stop();
}

void listener::connect_now() { conn_ = open_listening(dsn_, channel_, keepalive_timeout_ / 2); }

void listener::start() {
    socket_.assign(conn_->sock());
    arm();
}

void listener::stop() {
    stopped_ = true;
    retry_timer_.cancel();
    ping_timer_.cancel();
    // Hand the descriptor back before libpq closes it: Asio must never close
    // (or keep watching) a socket it does not own.
    if (socket_.is_open()) socket_.release();
    conn_.reset();
}

void listener::arm() {
    // A notification that came in with an earlier reply sits in libpq's
    // buffer and will never make the socket readable again: drain first.
    bool notified = false;
    try {
        while (conn_->get_notifs() > 0) notified = true;
    } catch (const std::exception& e) {
        lose(e.what());
        return;
    }
    if (notified && cb_.on_notify) cb_.on_notify();
    if (stopped_ || !conn_) return;
    socket_.async_wait(net::posix::stream_descriptor::wait_read,
                       [this, alive = alive_](const boost::system::error_code& ec) {
                           if (*alive) on_readable(ec);
                       });
    arm_ping();
}

// Restarted at every wake-up: only a quiet connection is pinged.
void listener::arm_ping() {
    if (keepalive_timeout_.count() <= 0) return;
    ping_timer_.expires_after(keepalive_timeout_ / 2);
    ping_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
        if (!ec && *alive) ping();
    });
}

void listener::ping() {
    if (stopped_ || !conn_ || pinging_) return;
    pinging_ = true;
    // Nothing on this thread reads the connection until the ping is back
    // (libpq connections are not thread-safe); arm() resumes the wait and
    // picks up any notification that came with the answer.
    socket_.cancel();
    net::post(blocking_, [this, alive = alive_, conn = conn_, limit = keepalive_timeout_ / 2] {
        std::string error;
        try {
            with_deadline(*conn, limit, [](pqxx::connection& c) {
                pqxx::nontransaction tx(c);
                tx.exec("SELECT 1");
            });
        } catch (const std::exception& e) {
            error = e.what();
            if (error.empty()) error = "ping failed";
        }
        net::post(ioc_, [this, alive, error] {
            if (!*alive) return;
            pinging_ = false;
            if (stopped_ || !conn_) return;
            if (!error.empty()) {
                lose(error);
                return;
            }
            arm();
        });
    });
}

void listener::on_readable(const boost::system::error_code& ec) {
    // During a ping the connection belongs to the ping; it re-arms.
    if (ec == net::error::operation_aborted || stopped_ || pinging_) return;
    if (ec) {
        lose(ec.message());
        return;
    }
    if (!conn_ || !conn_->is_open()) {
        lose("connection closed");
        return;
    }
    arm();
}

void listener::lose(const std::string& why) {
    ping_timer_.cancel();
    if (socket_.is_open()) socket_.release();
    conn_.reset();
    if (stopped_) return;
    const auto reason = scrub_secrets(why, dsn_);
    log::warn("listen connection lost; reconnecting", {{"reason", reason}});
    if (cb_.on_lost) cb_.on_lost(reason);
    schedule_reconnect();
}

void listener::schedule_reconnect() {
    static thread_local std::minstd_rand rng{std::random_device{}()};
    const auto delay = backoff_.next();
    retry_timer_.expires_after(jittered(delay, static_cast<std::uint32_t>(rng())));
    retry_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive || stopped_) return;
        net::post(blocking_, [this, alive, dsn = dsn_, channel = channel_, limit = keepalive_timeout_ / 2] {
            std::shared_ptr<pqxx::connection> fresh;
            std::string error;
            try {
                fresh = open_listening(dsn, channel, limit);
            } catch (const std::exception& e) {
                error = scrub_secrets(e.what(), dsn);
            }
            net::post(ioc_, [this, alive, fresh, error]() mutable {
                if (!*alive || stopped_) return;
                if (!fresh) {
                    log::warn("listen reconnect failed", {{"reason", error}});
                    schedule_reconnect();
                    return;
                }
                adopt(std::move(fresh));
            });
        });
    });
}

void listener::adopt(std::shared_ptr<pqxx::connection> conn) {
    conn_ = std::move(conn);
    backoff_.reset();
    log::info("listen connection restored", {{"channel", channel_}});
    socket_.assign(conn_->sock());
    if (cb_.on_connected) cb_.on_connected();
    arm();
}

}  // namespace outboxd::pg
