#include "pg/listener.hpp"

#include <algorithm>
#include <random>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <pqxx/pqxx>

#include "core/dsn.hpp"
#include "core/log.hpp"
#include "core/sql_ident.hpp"

namespace outboxd::pg {

namespace net = boost::asio;

namespace {

constexpr std::chrono::milliseconds first_retry{100};
constexpr std::chrono::milliseconds max_retry{5'000};

std::shared_ptr<pqxx::connection> open_listening(const std::string& dsn, const std::string& channel) {
    auto conn = std::make_shared<pqxx::connection>(dsn);
    pqxx::nontransaction tx(*conn);
    tx.exec("LISTEN " + quote_ident(channel));
    return conn;
}

}  // namespace

listener::listener(net::io_context& ioc, net::any_io_executor blocking, std::string dsn, std::string channel,
                   callbacks cb)
    : ioc_(ioc), blocking_(std::move(blocking)), dsn_(std::move(dsn)), channel_(std::move(channel)),
      cb_(std::move(cb)), socket_(ioc), retry_timer_(ioc) {}

listener::~listener() {
    *alive_ = false;
    stop();
}

void listener::connect_now() { conn_ = open_listening(dsn_, channel_); }

void listener::start() {
    socket_.assign(conn_->sock());
    arm();
}

void listener::stop() {
    stopped_ = true;
    retry_timer_.cancel();
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
}

void listener::on_readable(const boost::system::error_code& ec) {
    if (ec == net::error::operation_aborted || stopped_) return;
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
    retry_delay_ = retry_delay_.count() == 0 ? first_retry : std::min(retry_delay_ * 2, max_retry);
    // Jitter: many relays reconnecting after one database restart spread out.
    const auto jittered = retry_delay_ / 2 + std::chrono::milliseconds(rng() % (retry_delay_.count() / 2 + 1));
    retry_timer_.expires_after(jittered);
    retry_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive || stopped_) return;
        net::post(blocking_, [this, alive, dsn = dsn_, channel = channel_] {
            std::shared_ptr<pqxx::connection> fresh;
            std::string error;
            try {
                fresh = open_listening(dsn, channel);
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
    retry_delay_ = std::chrono::milliseconds(0);
    log::info("listen connection restored", {{"channel", channel_}});
    socket_.assign(conn_->sock());
    if (cb_.on_connected) cb_.on_connected();
    arm();
}

}  // namespace outboxd::pg
