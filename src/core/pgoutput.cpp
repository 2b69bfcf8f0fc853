#include "core/pgoutput.hpp"

#include <fmt/format.h>

namespace outboxd::pgoutput {

namespace {

// A cursor over one message; every read checks the length.
class reader {
public:
    explicit reader(std::string_view bytes) : rest_(bytes) {}

    bool u8(std::uint8_t& out) {
        if (rest_.empty()) return false;
        out = static_cast<std::uint8_t>(rest_.front());
        rest_.remove_prefix(1);
        return true;
    }
    template <typename T>
    bool big_endian(T& out) {
        if (rest_.size() < sizeof(T)) return false;
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < sizeof(T); ++i) v = (v << 8) | static_cast<std::uint8_t>(rest_[i]);
        out = static_cast<T>(v);
        rest_.remove_prefix(sizeof(T));
        return true;
    }
    bool cstring(std::string& out) {
        const auto end = rest_.find('\0');
        if (end == std::string_view::npos) return false;
        out.assign(rest_.substr(0, end));
        rest_.remove_prefix(end + 1);
        return true;
    }
    [[nodiscard]] std::string_view rest() const noexcept { return rest_; }

private:
    std::string_view rest_;
};

void put_be64(std::string& out, std::uint64_t v) {
    for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

decoder::result malformed(std::string why) {
    decoder::result r;
    r.malformed = true;
    r.error = std::move(why);
    return r;
}

}  // namespace

std::string format_lsn(lsn l) {
    return fmt::format("{:X}/{:X}", static_cast<std::uint32_t>(l >> 32), static_cast<std::uint32_t>(l));
}

std::int64_t pg_time_from_unix_us(std::int64_t unix_us) noexcept {
    // 2000-01-01 00:00:00 UTC is 946684800 s after the Unix epoch.
    return unix_us - 946'684'800LL * 1'000'000LL;
}

std::string status_update(lsn processed, std::int64_t pg_time_us, bool reply_requested) {
    std::string out;
    out.reserve(34);
    out.push_back('r');
    put_be64(out, processed);  // written
    put_be64(out, processed);  // flushed
    put_be64(out, processed);  // applied
    put_be64(out, static_cast<std::uint64_t>(pg_time_us));
    out.push_back(reply_requested ? 1 : 0);
    return out;
}

decoder::result decoder::feed(std::string_view copy_data) {
    reader r(copy_data);
    std::uint8_t kind = 0;
    if (!r.u8(kind)) return malformed("empty CopyData message");
    if (kind == 'k') {
        lsn wal_end = 0;
        std::int64_t server_time = 0;
        std::uint8_t reply = 0;
        if (!r.big_endian(wal_end) || !r.big_endian(server_time) || !r.u8(reply)) {
            return malformed("short keepalive message");
        }
        // Everything the server sent before this keepalive has been read;
        // between transactions that is everything up to its WAL end.
        if (!in_transaction_ && wal_end > processed_) processed_ = wal_end;
        result out;
        out.reply_now = reply != 0;
        return out;
    }
    if (kind == 'w') {
        lsn start = 0;
        lsn wal_end = 0;
        std::int64_t sent = 0;
        if (!r.big_endian(start) || !r.big_endian(wal_end) || !r.big_endian(sent)) {
            return malformed("short XLogData header");
        }
        (void)wal_end;  // the commit's own end is what counts as processed
        return message(r.rest());
    }
    return malformed(fmt::format("unexpected CopyData message type {}", static_cast<int>(kind)));
}

decoder::result decoder::message(std::string_view m) {
    reader r(m);
    std::uint8_t kind = 0;
    if (!r.u8(kind)) return malformed("empty pgoutput message");
    result out;
    switch (kind) {
        case 'B': {  // Begin: final LSN, commit time, xid
            lsn final_lsn = 0;
            std::int64_t at = 0;
            std::uint32_t xid = 0;
            if (!r.big_endian(final_lsn) || !r.big_endian(at) || !r.big_endian(xid)) return malformed("short Begin");
            in_transaction_ = true;
            inserted_ = false;
            xid_ = xid;
            return out;
        }
        case 'R': {  // Relation: id, namespace, name, replica identity, columns...
            std::uint32_t id = 0;
            std::string nspname;
            std::string relname;
            if (!r.big_endian(id) || !r.cstring(nspname) || !r.cstring(relname)) return malformed("short Relation");
            // A relation id can be reused for another table after a drop:
            // each Relation message says what the id means from now on.
            if (nspname == schema_ && tables_.contains(relname)) {
                watched_.insert(id);
            } else {
                watched_.erase(id);
            }
            return out;
        }
        case 'I': {  // Insert: relation id, 'N', tuple
            std::uint32_t id = 0;
            if (!r.big_endian(id)) return malformed("short Insert");
            if (watched_.contains(id)) inserted_ = true;
            return out;
        }
        case 'C': {  // Commit: flags, commit LSN, end LSN, commit time
            std::uint8_t flags = 0;
            lsn commit_lsn = 0;
            lsn end_lsn = 0;
            std::int64_t at = 0;
            if (!r.u8(flags) || !r.big_endian(commit_lsn) || !r.big_endian(end_lsn) || !r.big_endian(at)) {
                return malformed("short Commit");
            }
            out.wake = in_transaction_ && inserted_;
            if (out.wake) out.xid = xid_;
            in_transaction_ = false;
            inserted_ = false;
            if (end_lsn > processed_) processed_ = end_lsn;
            return out;
        }
        default:
            // Origin, Type, Update, Delete, Truncate, Message: nothing to wake for.
            return out;
    }
}

std::string publication_name(std::string_view schema) {
    constexpr std::string_view prefix = "outboxd_";
    constexpr std::size_t max_bytes = 63;  // NAMEDATALEN - 1
    std::string name = std::string(prefix) + std::string(schema);
    if (name.size() <= max_bytes) return name;
    std::uint32_t hash = 2166136261u;  // FNV-1a
    for (const unsigned char c : schema) {
        hash ^= c;
        hash *= 16777619u;
    }
    const auto suffix = fmt::format("_{:08x}", hash);
    std::size_t keep = max_bytes - prefix.size() - suffix.size();
    // Never cut a UTF-8 character in two: back up over continuation bytes.
    while (keep > 0 && (static_cast<unsigned char>(schema[keep]) & 0xC0) == 0x80) --keep;
    return std::string(prefix) + std::string(schema.substr(0, keep)) + suffix;
}

std::string publication_names_option(std::string_view publication) {
    std::string ident = "\"";
    for (const char c : publication) {
        if (c == '"') ident += '"';
        ident += c;
    }
    ident += '"';
    std::string literal = "'";
    for (const char c : ident) {
        if (c == '\'') literal += '\'';
        literal += c;
    }
    literal += '\'';
    return literal;
}

}  // namespace outboxd::pgoutput
