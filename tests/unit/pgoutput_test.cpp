#include "core/pgoutput.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>

namespace po = outboxd::pgoutput;

namespace {

// Builders for the server's side of the stream, byte by byte as the
// protocol documentation lays them out.
void be(std::string& out, std::uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string xlog(const std::string& message, std::uint64_t start = 0x1000, std::uint64_t end = 0x2000) {
    std::string out = "w";
    be(out, start, 8);
    be(out, end, 8);
    be(out, 123, 8);  // send time
    return out + message;
}

std::string keepalive(std::uint64_t wal_end, bool reply) {
    std::string out = "k";
    be(out, wal_end, 8);
    be(out, 456, 8);
    out.push_back(reply ? 1 : 0);
    return out;
}

std::string begin(std::uint32_t xid = 700) {
    std::string out = "B";
    be(out, 0x3000, 8);  // final LSN
    be(out, 789, 8);     // commit time
    be(out, xid, 4);
    return out;
}

std::string relation(std::uint32_t id, const std::string& nsp, const std::string& name) {
    std::string out = "R";
    be(out, id, 4);
    out += nsp;
    out.push_back('\0');
    out += name;
    out.push_back('\0');
    out.push_back('d');  // replica identity
    be(out, 1, 2);       // one column
    out.push_back(1);    // flags: key
    out += "id";
    out.push_back('\0');
    be(out, 20, 4);  // int8
    be(out, static_cast<std::uint32_t>(-1), 4);
    return out;
}

std::string insert(std::uint32_t id) {
    std::string out = "I";
    be(out, id, 4);
    out.push_back('N');
    be(out, 1, 2);
    out.push_back('t');
    be(out, 1, 4);
    out.push_back('7');
    return out;
}

std::string commit(std::uint64_t end_lsn) {
    std::string out = "C";
    out.push_back(0);
    be(out, end_lsn - 8, 8);  // commit LSN
    be(out, end_lsn, 8);
    be(out, 999, 8);
    return out;
}

std::string update(std::uint32_t id) {
    std::string out = "U";
    be(out, id, 4);
    out.push_back('N');
    be(out, 0, 2);
    return out;
}

}  // namespace

TEST_CASE("pgoutput: a commit of a transaction that inserted into the events table wakes") {
    po::decoder d("outbox", {"events", "deliveries"});
    CHECK_FALSE(d.feed(xlog(begin())).wake);
    CHECK(d.in_transaction());
    CHECK_FALSE(d.feed(xlog(relation(16400, "outbox", "events"))).wake);
    CHECK_FALSE(d.feed(xlog(insert(16400))).wake);
    const auto r = d.feed(xlog(commit(0x5028)));
    CHECK(r.wake);
    CHECK(r.xid == 700);
    CHECK_FALSE(r.malformed);
    CHECK_FALSE(d.in_transaction());
    CHECK(d.processed() == 0x5028);
}

TEST_CASE("pgoutput: the relation id is remembered across transactions (Relation is sent once per session)") {
    po::decoder d("outbox", {"events"});
    (void)d.feed(xlog(begin()));
    (void)d.feed(xlog(relation(16400, "outbox", "events")));
    (void)d.feed(xlog(insert(16400)));
    CHECK(d.feed(xlog(commit(0x100))).wake);
    (void)d.feed(xlog(begin()));
    (void)d.feed(xlog(insert(16400)));
    CHECK(d.feed(xlog(commit(0x200))).wake);
}

TEST_CASE("pgoutput: no wake for other tables, other schemas, updates or empty transactions") {
    po::decoder d("outbox", {"events"});
    (void)d.feed(xlog(begin()));
    (void)d.feed(xlog(relation(1, "outbox", "dead_letters")));
    (void)d.feed(xlog(relation(2, "other", "events")));
    (void)d.feed(xlog(relation(3, "outbox", "events")));
    (void)d.feed(xlog(insert(1)));
    (void)d.feed(xlog(insert(2)));
    (void)d.feed(xlog(update(3)));
    CHECK_FALSE(d.feed(xlog(commit(0x100))).wake);
    (void)d.feed(xlog(begin()));
    CHECK_FALSE(d.feed(xlog(commit(0x200))).wake);
    CHECK(d.processed() == 0x200);
}

TEST_CASE("pgoutput: a relation id reused for another table stops counting") {
    po::decoder d("outbox", {"events"});
    (void)d.feed(xlog(begin()));
    (void)d.feed(xlog(relation(9, "outbox", "events")));
    (void)d.feed(xlog(relation(9, "outbox", "something_else")));
    (void)d.feed(xlog(insert(9)));
    CHECK_FALSE(d.feed(xlog(commit(0x100))).wake);
}

TEST_CASE("pgoutput: schema names are matched exactly, case and quotes included") {
    po::decoder d("Mixed \"Case\"", {"events"});
    (void)d.feed(xlog(begin()));
    (void)d.feed(xlog(relation(5, "mixed \"case\"", "events")));
    (void)d.feed(xlog(relation(6, "Mixed \"Case\"", "events")));
    (void)d.feed(xlog(insert(5)));
    CHECK_FALSE(d.feed(xlog(commit(0x100))).wake);
    (void)d.feed(xlog(begin()));
    (void)d.feed(xlog(insert(6)));
    CHECK(d.feed(xlog(commit(0x200))).wake);
}

TEST_CASE("pgoutput: keepalives ask for replies and advance the processed position only between transactions") {
    po::decoder d("outbox", {"events"});
    auto r = d.feed(keepalive(0x4000, true));
    CHECK(r.reply_now);
    CHECK(d.processed() == 0x4000);
    r = d.feed(keepalive(0x4100, false));
    CHECK_FALSE(r.reply_now);
    CHECK(d.processed() == 0x4100);
    (void)d.feed(xlog(begin()));
    (void)d.feed(keepalive(0x9000, true));
    CHECK(d.processed() == 0x4100);  // mid-transaction: its commit has not been read yet
    (void)d.feed(xlog(commit(0x8000)));
    CHECK(d.processed() == 0x8000);
    (void)d.feed(keepalive(0x7000, false));
    CHECK(d.processed() == 0x8000);  // never backwards
}

TEST_CASE("pgoutput: truncated or unknown messages are reported, never read past their end") {
    po::decoder d("outbox", {"events"});
    CHECK(d.feed("").malformed);
    CHECK(d.feed("k\x01\x02").malformed);
    CHECK(d.feed("w\x00\x00").malformed);
    CHECK(d.feed("x").malformed);
    CHECK(d.feed(xlog("B\x00\x01")).malformed);
    CHECK(d.feed(xlog("C")).malformed);
    CHECK(d.feed(xlog(std::string("R\x00\x00\x00\x01outbox", 11))).malformed);  // no terminator
    CHECK(d.feed(xlog("I\x00")).malformed);
    // Messages the wake-up does not need pass.
    CHECK_FALSE(d.feed(xlog("O\x00\x00\x00\x00\x00\x00\x00\x00origin")).malformed);
}

TEST_CASE("pgoutput: the standby status update is 34 bytes: 'r', three LSNs, the clock, the reply flag") {
    const auto u = po::status_update(0x0000001600B374D8ull, 0x0102030405060708ll, true);
    REQUIRE(u.size() == 34);
    const std::string lsn("\x00\x00\x00\x16\x00\xB3\x74\xD8", 8);
    CHECK(u == std::string("r") + lsn + lsn + lsn + std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8) + "\x01");
    CHECK(po::status_update(0, 0).back() == '\0');
}

TEST_CASE("pgoutput: clocks and LSNs as PostgreSQL writes them") {
    CHECK(po::pg_time_from_unix_us(946'684'800'000'000LL) == 0);
    CHECK(po::pg_time_from_unix_us(946'684'801'000'000LL) == 1'000'000);
    CHECK(po::format_lsn(0x16B374D848ull) == "16/B374D848");
    CHECK(po::format_lsn(0) == "0/0");
}

TEST_CASE("pgoutput: publication names fit 63 bytes, stay distinct and are quoted for START_REPLICATION") {
    CHECK(po::publication_name("outbox") == "outboxd_outbox");
    const std::string long_a(70, 'a');
    const std::string long_b = std::string(69, 'a') + "b";
    CHECK(po::publication_name(long_a).size() == 63);
    CHECK(po::publication_name(long_a) != po::publication_name(long_b));
    CHECK(po::publication_name(long_a).starts_with("outboxd_aaaa"));
    // Multi-byte characters are not cut in two.
    std::string accents;
    for (int i = 0; i < 40; ++i) accents += "\xC3\xA9";  // é
    const auto name = po::publication_name(accents);
    CHECK(name.size() <= 63);
    const auto body = name.substr(8, name.size() - 8 - 9);
    CHECK(body.size() % 2 == 0);
    CHECK(po::publication_names_option("outboxd_x") == "'\"outboxd_x\"'");
    CHECK(po::publication_names_option("outboxd_a'b\"c") == "'\"outboxd_a''b\"\"c\"'");
}
