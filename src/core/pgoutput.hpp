#pragma once
// The little of PostgreSQL's logical replication stream that the WAL wake-up
// (relay.wake = "wal", src/pg/wal_listener.*) reads, decoded from bytes: no
// I/O, tested with buffers.
//
// Over START_REPLICATION every CopyData message is either XLogData ('w':
// start LSN, end LSN, send time, then one pgoutput message) or a primary
// keepalive ('k': the server's WAL end, its clock, whether it wants a reply
// now). pgoutput (protocol version 1) sends, per committed transaction that
// touched a published table, Begin ('B'), a Relation ('R') before the first
// change of each table in the session, the changes ('I' insert, ...) and
// Commit ('C'). The client answers with standby status updates ('r') that say
// how far it has processed, so the server may recycle the WAL behind it.
//
// All integers are big-endian (network order); timestamps are microseconds
// since 2000-01-01 00:00 UTC.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace outboxd::pgoutput {

using lsn = std::uint64_t;

// "16/B374D848", as PostgreSQL prints an LSN.
[[nodiscard]] std::string format_lsn(lsn l);

// Microseconds since PostgreSQL's epoch (2000-01-01 UTC) for a Unix time in
// microseconds: the clock field of a status update.
[[nodiscard]] std::int64_t pg_time_from_unix_us(std::int64_t unix_us) noexcept;

// 'r' standby status update: written = flushed = applied = `processed`.
// reply_requested: ask the server to answer with a keepalive at once.
[[nodiscard]] std::string status_update(lsn processed, std::int64_t pg_time_us, bool reply_requested = false);

// What a transaction that touched the outbox's tables looked like, decoded
// from the stream. Feed it every CopyData message in order; it says when a
// commit of a transaction that inserted into the watched tables went by,
// and how far the stream has been processed.
class decoder {
public:
    struct result {
        bool wake = false;           // a transaction inserting into a watched table committed
        std::uint32_t xid = 0;       // wake: its transaction id (Begin's)
        bool reply_now = false;      // the server asked for a status update at once
        bool malformed = false;      // the bytes made no sense: drop the connection
        std::string error;           // what was wrong (malformed)
    };

    // Watches tables called one of `tables` in schema `schema` (exact names,
    // as in pg_namespace/pg_class).
    decoder(std::string schema, std::set<std::string> tables)
        : schema_(std::move(schema)), tables_(std::move(tables)) {}

    result feed(std::string_view copy_data);

    // The furthest position processed: the end of the last commit, or the
    // server's WAL end of a keepalive that came outside any transaction.
    [[nodiscard]] lsn processed() const noexcept { return processed_; }
    [[nodiscard]] bool in_transaction() const noexcept { return in_transaction_; }

private:
    result message(std::string_view m);

    std::string schema_;
    std::set<std::string> tables_;
    std::set<std::uint32_t> watched_;  // relation ids of the watched tables
    bool in_transaction_ = false;
    bool inserted_ = false;            // the current transaction inserted into a watched table
    std::uint32_t xid_ = 0;            // the current transaction's id
    lsn processed_ = 0;
};

// The publication the WAL wake-up streams for `schema`: "outboxd_" followed
// by the schema name when that fits PostgreSQL's 63-byte identifiers;
// otherwise as much of the schema name as fits (whole UTF-8 characters) plus
// "_" and 8 hex digits of a hash of the full name, so two long schema names
// that share a prefix get different publications.
[[nodiscard]] std::string publication_name(std::string_view schema);

// The START_REPLICATION option value naming one publication: a
// single-quoted literal whose content is a double-quoted identifier
// (pgoutput splits and down-cases unquoted names).
[[nodiscard]] std::string publication_names_option(std::string_view publication);

}  // namespace outboxd::pgoutput
