#pragma once
// The LISTEN connection: idle, never inside a transaction, its socket awaited
// with Boost.Asio so a NOTIFY wakes the relay the instant it arrives.
//
// A notification is only a nudge: it carries nothing, and a lost one is
// harmless because the relay drains after every (re)connect and sweeps.
// On any error the connection is dropped and rebuilt with backoff; the
// blocking connect runs on `blocking`, never on the event loop's thread.
//
// An idle connection to a database that went silent (network partition,
// failover to another address) never becomes readable, and TCP keepalive
// does not notice when something on the path still answers for the peer. So
// after keepalive_timeout / 2 without traffic the listener pings (SELECT 1,
// on `blocking`, the socket wait paused meanwhile) and drops the connection
// when no answer comes within another keepalive_timeout / 2.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <pqxx/connection>

#include "core/db_backoff.hpp"

namespace outboxd::pg {

class listener {
public:
    struct callbacks {
        std::function<void()> on_notify;     // one or more notifications arrived
        std::function<void()> on_connected;  // LISTEN is active again: drain now
        std::function<void(const std::string& why)> on_lost;
    };

    // keepalive_timeout 0: no pings.
    listener(boost::asio::io_context& ioc, boost::asio::any_io_executor blocking, std::string dsn,
             std::string channel, callbacks cb,
             std::chrono::milliseconds keepalive_timeout = std::chrono::milliseconds(0));
    ~listener();
    listener(const listener&) = delete;
    listener& operator=(const listener&) = delete;

    // First connection, synchronously, so a bad URL or password fails the
    // start instead of retrying forever. Throws what libpqxx throws.
    void connect_now();
    // Starts waiting on the socket (after connect_now).
    void start();
    // Stops waiting and closes the connection; no callbacks after this.
    void stop();

private:
    void arm();
    void arm_ping();
    void ping();
    void on_readable(const boost::system::error_code& ec);
    void lose(const std::string& why);
    void schedule_reconnect();
    void adopt(std::shared_ptr<pqxx::connection> conn);

    boost::asio::io_context& ioc_;
    boost::asio::any_io_executor blocking_;
    std::string dsn_;
    std::string channel_;
    callbacks cb_;
    std::shared_ptr<pqxx::connection> conn_;
    boost::asio::posix::stream_descriptor socket_;
    boost::asio::steady_timer retry_timer_;
    boost::asio::steady_timer ping_timer_;
    std::chrono::milliseconds keepalive_timeout_;
    bool pinging_ = false;  // the connection is on `blocking` for a ping: hands off
    db_backoff backoff_;
    bool stopped_ = false;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace outboxd::pg
