#include "pg/wal_listener.hpp"

#include <unistd.h>

#include <random>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <libpq-fe.h>

#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/log.hpp"

namespace outboxd::pg {

namespace net = boost::asio;
using namespace std::chrono_literals;

namespace {

std::string one_line(const char* message) {
    std::string s = message != nullptr ? message : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// A slot name unique to this connection: lower-case letters, digits and
// underscores, as PostgreSQL requires.
std::string unique_slot_name() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("outboxd_{}_{:08x}", ::getpid(), static_cast<std::uint32_t>(rng()));
}

std::int64_t pg_now_us() {
    const auto unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    return pgoutput::pg_time_from_unix_us(unix_us);
}

}  // namespace

wal_listener::wal_listener(net::io_context& ioc, std::string dsn, std::string schema, callbacks cb,
                           std::chrono::milliseconds keepalive_timeout)
    : ioc_(ioc), dsn_(std::move(dsn)), schema_(std::move(schema)), publication_(pgoutput::publication_name(schema_)),
      cb_(std::move(cb)), keepalive_timeout_(keepalive_timeout),
      status_interval_(keepalive_timeout.count() > 0 ? std::min<std::chrono::milliseconds>(10s, keepalive_timeout / 3)
                                                     : 10s),
      socket_(ioc), retry_timer_(ioc), status_timer_(ioc) {}

wal_listener::~wal_listener() {
    *alive_ = false;
    stop();
    connector_.join();
}

std::string wal_listener::replication_dsn(const std::string& dsn) { return with_default(dsn, "replication", "database"); }

void wal_listener::connect_now() {
    PGconn* c = PQconnectdb(replication_dsn(dsn_).c_str());
    if (PQstatus(c) != CONNECTION_OK) {
        const auto message = scrub_secrets(one_line(PQerrorMessage(c)), dsn_);
        PQfinish(c);
        using k = wal_connect_error::kind;
        // PostgreSQL 15 and 16+ word the refusal differently.
        if (message.find("replication role") != std::string::npos ||
            message.find("start WAL sender") != std::string::npos) {
            throw wal_connect_error(k::no_replication_privilege, message);
        }
        if (message.find("max_wal_senders") != std::string::npos) throw wal_connect_error(k::no_wal_senders, message);
        throw wal_connect_error(k::unavailable, message);
    }
    conn_ = c;
}

void wal_listener::start() {
    if (conn_ == nullptr) return;
    PQsetnonblocking(conn_, 1);
    socket_.assign(PQsocket(conn_));
    begin_slot();
}

void wal_listener::stop() {
    stopped_ = true;
    retry_timer_.cancel();
    close();
}

void wal_listener::close() {
    ++generation_;
    status_timer_.cancel();
    // Hand the descriptor back before libpq closes it: Asio must never close
    // (or keep watching) a socket it does not own.
    if (socket_.is_open()) socket_.release();
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
    phase_ = phase::idle;
    reading_ = false;
    writing_ = false;
}

void wal_listener::begin_slot() {
    slot_ = unique_slot_name();
    decoder_.emplace(schema_, std::set<std::string>{"events", "deliveries"});
    slot_requested_ = std::chrono::steady_clock::now();
    last_received_ = slot_requested_;
    log::info("creating a temporary replication slot for the WAL wake-up (it waits for the transactions in progress "
              "to end)",
              {{"slot", slot_}, {"publication", publication_}});
    // NOEXPORT_SNAPSHOT: nothing reads the slot's snapshot; the old spelling
    // works on every server since PostgreSQL 10.
    send(fmt::format("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT", slot_),
         phase::creating_slot);
}

void wal_listener::send(const std::string& command, phase next) {
    if (PQsendQuery(conn_, command.c_str()) == 0) {
        lose(one_line(PQerrorMessage(conn_)));
        return;
    }
    phase_ = next;
    flush();
    if (conn_ != nullptr) arm_read();
}

void wal_listener::flush() {
    if (conn_ == nullptr) return;
    const int r = PQflush(conn_);
    if (r < 0) {
        lose(one_line(PQerrorMessage(conn_)));
        return;
    }
    if (r == 1 && !writing_) {
        writing_ = true;
        socket_.async_wait(net::posix::stream_descriptor::wait_write,
                           [this, alive = alive_, gen = generation_](const boost::system::error_code& ec) {
                               if (!*alive || gen != generation_) return;
                               writing_ = false;
                               if (!ec) flush();
                           });
    }
}

void wal_listener::arm_read() {
    if (reading_ || conn_ == nullptr) return;
    reading_ = true;
    socket_.async_wait(net::posix::stream_descriptor::wait_read,
                       [this, alive = alive_, gen = generation_](const boost::system::error_code& ec) {
                           if (!*alive || gen != generation_ || stopped_) return;
                           reading_ = false;
                           if (ec) {
                               lose(ec.message());
                               return;
                           }
                           on_readable();
                       });
}

void wal_listener::on_readable() {
    if (PQconsumeInput(conn_) == 0) {
        lose(one_line(PQerrorMessage(conn_)));
        return;
    }
    last_received_ = std::chrono::steady_clock::now();
    if (phase_ == phase::streaming) {
        read_stream();
    } else if (!read_results()) {
        return;
    }
    if (conn_ != nullptr && !stopped_) arm_read();
}

// The answers to CREATE_REPLICATION_SLOT and START_REPLICATION. False when
// the connection was dropped.
bool wal_listener::read_results() {
    while (conn_ != nullptr && PQisBusy(conn_) == 0) {
        PGresult* r = PQgetResult(conn_);
        if (r == nullptr) {
            // The slot exists (its command is complete): stream from it.
            if (phase_ == phase::creating_slot) {
                send(fmt::format("START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {})",
                                 slot_, pgoutput::publication_names_option(publication_)),
                     phase::starting);
                return conn_ != nullptr;
            }
            lose("the server ended the replication command without streaming");
            return false;
        }
        const auto status = PQresultStatus(r);
        if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) {
            PQclear(r);
            continue;
        }
        if (status == PGRES_COPY_BOTH && phase_ == phase::starting) {
            PQclear(r);
            phase_ = phase::streaming;
            backoff_.reset();
            const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                                    slot_requested_);
            const bool resumed = std::exchange(resuming_, false);
            log::info(resumed ? "WAL stream resumed" : "WAL stream started",
                      {{"slot", slot_}, {"after", format_duration(took)}});
            if (cb_.on_connected) cb_.on_connected(resumed);
            if (stopped_ || conn_ == nullptr) return false;
            arm_status();
            read_stream();
            return conn_ != nullptr;
        }
        const std::string state = PQresultErrorField(r, PG_DIAG_SQLSTATE) != nullptr
                                      ? PQresultErrorField(r, PG_DIAG_SQLSTATE)
                                      : "";
        std::string message = one_line(PQresultErrorMessage(r));
        PQclear(r);
        if (message.empty()) message = fmt::format("unexpected answer {}", PQresStatus(status));
        // Settings or grants, not an outage: say what to do, loudly.
        if (state == "53400" || state == "55000" || state == "42501" || state == "42704") {
            log::error("the WAL wake-up cannot start its replication stream; claiming every poll_interval until it "
                       "can (README: Wake-up modes, relay.wake = \"wal\")",
                       {{"error", scrub_secrets(message, dsn_)}, {"sqlstate", state}});
        }
        lose(message);
        return false;
    }
    return conn_ != nullptr;
}

void wal_listener::read_stream() {
    std::string xids;
    bool reply = false;
    while (conn_ != nullptr) {
        char* buffer = nullptr;
        const int n = PQgetCopyData(conn_, &buffer, 1);
        if (n > 0) {
            const auto r = decoder_->feed(std::string_view(buffer, static_cast<std::size_t>(n)));
            PQfreemem(buffer);
            if (r.malformed) {
                lose("undecodable replication message: " + r.error);
                return;
            }
            if (r.wake) xids += fmt::format("{}{}", xids.empty() ? "" : ",", r.xid);
            reply = reply || r.reply_now;
            continue;
        }
        if (n == 0) break;  // the rest has not arrived yet
        if (n == -1) {
            // The server ended the stream: its reason is in the result.
            std::string why = "the server ended the replication stream";
            if (PGresult* res = PQgetResult(conn_); res != nullptr) {
                const auto m = one_line(PQresultErrorMessage(res));
                if (!m.empty()) why += ": " + m;
                PQclear(res);
            }
            lose(why);
            return;
        }
        lose(one_line(PQerrorMessage(conn_)));
        return;
    }
    if (!xids.empty() && cb_.on_commit) cb_.on_commit(std::move(xids));
    if (reply && !stopped_ && conn_ != nullptr) send_status(false);
}

void wal_listener::send_status(bool reply_requested) {
    if (conn_ == nullptr || phase_ != phase::streaming) return;
    const auto message = pgoutput::status_update(decoder_->processed(), pg_now_us(), reply_requested);
    if (PQputCopyData(conn_, message.data(), static_cast<int>(message.size())) < 0) {
        lose(one_line(PQerrorMessage(conn_)));
        return;
    }
    flush();  // 0 (would block) above: the next status update says the same, later
}

void wal_listener::arm_status() {
    status_timer_.expires_after(status_interval_);
    status_timer_.async_wait([this, alive = alive_, gen = generation_](const boost::system::error_code& ec) {
        if (ec || !*alive || gen != generation_ || stopped_ || phase_ != phase::streaming) return;
        if (keepalive_timeout_.count() > 0 && std::chrono::steady_clock::now() - last_received_ > keepalive_timeout_) {
            lose(fmt::format("no answer from the server for {}", format_duration(keepalive_timeout_)));
            return;
        }
        // Asking for a reply keeps last_received_ fresh on a quiet stream.
        send_status(keepalive_timeout_.count() > 0);
        if (conn_ != nullptr) arm_status();
    });
}

void wal_listener::pause() {
    if (stopped_ || paused_ || phase_ != phase::streaming) return;
    log::info("WAL stream paused under load (its slot is dropped; the relay claims on its own)", {{"slot", slot_}});
    close();
    paused_ = true;
}

void wal_listener::resume() {
    if (stopped_) return;
    if (paused_) {
        paused_ = false;
        resuming_ = true;
        connect_after(std::chrono::milliseconds::zero());
        return;
    }
    if (phase_ == phase::streaming) {
        // Never paused (see pause()): it is up; say so, once the caller is done.
        net::post(ioc_, [this, alive = alive_, gen = generation_] {
            if (!*alive || gen != generation_ || stopped_ || phase_ != phase::streaming) return;
            if (cb_.on_connected) cb_.on_connected(true);
        });
    }
    // Otherwise connecting or starting: on_connected or on_lost follows.
}

void wal_listener::lose(const std::string& why) {
    close();
    resuming_ = false;
    if (stopped_) return;
    const auto reason = scrub_secrets(why, dsn_);
    log::warn("WAL stream lost; reconnecting", {{"reason", reason}});
    if (cb_.on_lost) cb_.on_lost(reason);
    schedule_reconnect();
}

void wal_listener::schedule_reconnect() {
    static thread_local std::minstd_rand rng{std::random_device{}()};
    connect_after(jittered(backoff_.next(), static_cast<std::uint32_t>(rng())));
}

void wal_listener::connect_after(std::chrono::milliseconds delay) {
    retry_timer_.expires_after(delay);
    retry_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive || stopped_ || paused_) return;
        net::post(connector_, [this, alive, dsn = dsn_] {
            PGconn* c = PQconnectdb(replication_dsn(dsn).c_str());
            std::string error;
            if (PQstatus(c) != CONNECTION_OK) {
                error = scrub_secrets(one_line(PQerrorMessage(c)), dsn);
                PQfinish(c);
                c = nullptr;
            }
            net::post(ioc_, [this, alive, c, error] {
                if (!*alive || stopped_) {
                    if (c != nullptr) PQfinish(c);
                    return;
                }
                if (c == nullptr) {
                    if (std::exchange(resuming_, false)) {
                        // Lost after all: the relay polls until it is back.
                        lose(error);
                        return;
                    }
                    log::warn("WAL stream reconnect failed", {{"reason", error}});
                    schedule_reconnect();
                    return;
                }
                adopt(c);
            });
        });
    });
}

void wal_listener::adopt(pg_conn* conn) {
    conn_ = conn;
    start();
}

}  // namespace outboxd::pg
