#pragma once
// The WAL wake-up (relay.wake = "wal"): a logical replication connection
// that reports each commit of a transaction that inserted into the outbox,
// with no trigger and nothing paid by producers beyond WAL they write anyway.
//
// libpqxx 6.4 cannot open replication connections, so this is raw libpq in
// non-blocking mode, its socket awaited with Boost.Asio on the event loop:
//   connect (replication=database; on its own thread, never the claim
//   thread or the event loop)
//   -> CREATE_REPLICATION_SLOT <unique> TEMPORARY LOGICAL pgoutput
//      (waits for every transaction in progress to end: sent, then awaited)
//   -> START_REPLICATION SLOT <unique> LOGICAL 0/0 (proto_version '1',
//      publication_names '<publication>')
//   -> CopyData, decoded by core/pgoutput: on_commit at each commit that
//      inserted into the outbox's tables; standby status updates with the
//      position processed at every reply request and every status interval,
//      so the slot never holds WAL back.
// Under load the relay pauses the stream: the connection is closed, and the
// slot goes with it. A WAL sender streaming thousands of commits a second
// spends a send() per message, three per commit (31-38 µs of its CPU a
// commit under 32 producers, more than the relay's claims save), while the
// relay then claims on its own. resume connects again and creates a new
// slot, exactly as after a lost connection, minus the warnings. (A second
// START_REPLICATION on the same connection after CopyDone is no way back:
// a logical WAL sender does not reset its "streaming done" state, and ends
// the new stream at once.)
// The slot is temporary: it disappears when the connection ends, however it
// ends (exit, kill -9, network). Events committed while there is no stream
// are not in any stream; on_connected tells the relay to claim once the
// stream runs again, and the relay polls while it does not.
//
// A silent server is noticed: every status update asks for a reply, and no
// byte for keepalive_timeout drops the connection.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <chrono>
#include <functional>
#include <memory>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "core/db_backoff.hpp"
#include "core/pgoutput.hpp"

struct pg_conn;

namespace outboxd::pg {

// Why the first replication connection was refused, so the relay can exit
// with a code that says what to fix.
struct wal_connect_error : std::runtime_error {
    enum class kind { unavailable, no_replication_privilege, no_wal_senders };
    wal_connect_error(kind k, const std::string& message) : std::runtime_error(message), why(k) {}
    kind why;
};

class wal_listener {
public:
    struct callbacks {
        // Transactions that inserted into the outbox committed: their ids,
        // comma-separated. The WAL can show a commit a moment before the
        // transaction is visible to other sessions.
        std::function<void(std::string xids)> on_commit;
        // The stream runs (again): claim now. resumed: after a pause, not
        // after the start or a lost connection.
        std::function<void(bool resumed)> on_connected;
        std::function<void(const std::string& why)> on_lost;
    };

    // dsn: the relay's connection string (replication=database is added).
    // keepalive_timeout 0: no liveness check beyond TCP's.
    wal_listener(boost::asio::io_context& ioc, std::string dsn, std::string schema, callbacks cb,
                 std::chrono::milliseconds keepalive_timeout);
    ~wal_listener();
    wal_listener(const wal_listener&) = delete;
    wal_listener& operator=(const wal_listener&) = delete;

    // First connection, synchronously (at startup, before the event loop
    // runs), so a refused role or a server out of WAL senders fails the
    // start. Throws wal_connect_error.
    void connect_now();
    // Creates the slot and starts streaming, asynchronously.
    void start();
    // Closes the connection (the slot goes with it); no callbacks after this.
    void stop();
    // Closes the connection while streaming (a stream still starting is
    // left alone: on_connected follows), with no on_lost: the relay claims
    // on its own meanwhile.
    void pause();
    // Streams again after pause(), from a new slot. Always followed by
    // on_connected (at once if the stream never paused) or on_lost.
    void resume();

    // The connection string of the replication connection (tests, logs: redact it).
    [[nodiscard]] static std::string replication_dsn(const std::string& dsn);

private:
    enum class phase { idle, creating_slot, starting, streaming };

    void begin_slot();
    void send(const std::string& command, phase next);
    void arm_read();
    void on_readable();
    bool read_results();
    void read_stream();
    void send_status(bool reply_requested);
    void flush();
    void arm_status();
    void lose(const std::string& why);
    void close();
    void schedule_reconnect();
    void adopt(pg_conn* conn);
    void connect_after(std::chrono::milliseconds delay);

    boost::asio::io_context& ioc_;
    std::string dsn_;
    std::string schema_;
    std::string publication_;
    callbacks cb_;
    std::chrono::milliseconds keepalive_timeout_;
    std::chrono::milliseconds status_interval_;
    pg_conn* conn_ = nullptr;
    std::string slot_;
    phase phase_ = phase::idle;
    std::optional<pgoutput::decoder> decoder_;
    std::chrono::steady_clock::time_point last_received_{};
    std::chrono::steady_clock::time_point slot_requested_{};
    boost::asio::posix::stream_descriptor socket_;
    boost::asio::steady_timer retry_timer_;
    boost::asio::steady_timer status_timer_;
    boost::asio::thread_pool connector_{1};  // blocking connects, off the event loop and the claim thread
    db_backoff backoff_;
    std::uint64_t generation_ = 0;  // which connection a pending wait belongs to
    bool reading_ = false;
    bool writing_ = false;
    bool stopped_ = false;
    bool paused_ = false;    // closed by pause(), not lost
    bool resuming_ = false;  // the connection being made follows a pause
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace outboxd::pg
