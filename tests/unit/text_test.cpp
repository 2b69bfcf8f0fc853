#include "core/text.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

using outboxd::is_valid_utf8;
using outboxd::sanitize_text;

namespace {

constexpr std::string_view fffd = "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER

std::string_view bytes(const char* s, std::size_t n) { return {s, n}; }

}  // namespace

// ---- is_valid_utf8 ----------------------------------------------------------

TEST_CASE("text: ASCII is valid UTF-8") {
    CHECK(is_valid_utf8(""));
    CHECK(is_valid_utf8("hello, world"));
    CHECK(is_valid_utf8("\t\r\n\x01\x7f"));
    CHECK(is_valid_utf8(bytes("a\0b", 3)));  // NUL is valid UTF-8 (PostgreSQL's problem, not UTF-8's)
}

TEST_CASE("text: well-formed multibyte sequences are valid") {
    CHECK(is_valid_utf8("\xC2\x80"));                  // U+0080, smallest 2-byte
    CHECK(is_valid_utf8("\xC3\xA9t\xC3\xA9"));         // "été"
    CHECK(is_valid_utf8("\xDF\xBF"));                  // U+07FF
    CHECK(is_valid_utf8("\xE0\xA0\x80"));              // U+0800, smallest 3-byte
    CHECK(is_valid_utf8("\xE2\x82\xAC"));              // U+20AC "€"
    CHECK(is_valid_utf8("\xED\x9F\xBF"));              // U+D7FF, just below the surrogates
    CHECK(is_valid_utf8("\xEE\x80\x80"));              // U+E000, just above them
    CHECK(is_valid_utf8("\xEF\xBF\xBD"));              // U+FFFD
    CHECK(is_valid_utf8("\xEF\xBF\xBF"));              // U+FFFF
    CHECK(is_valid_utf8("\xF0\x90\x80\x80"));          // U+10000, smallest 4-byte
    CHECK(is_valid_utf8("\xF0\x9F\x98\x80"));          // U+1F600
    CHECK(is_valid_utf8("\xF4\x8F\xBF\xBF"));          // U+10FFFF, the largest
    CHECK(is_valid_utf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z"));
}

TEST_CASE("text: overlong forms are invalid") {
    CHECK_FALSE(is_valid_utf8("\xC0\x80"));              // NUL in 2 bytes
    CHECK_FALSE(is_valid_utf8("\xC0\xAF"));              // '/' in 2 bytes
    CHECK_FALSE(is_valid_utf8("\xC1\xBF"));
    CHECK_FALSE(is_valid_utf8("\xE0\x80\xAF"));          // '/' in 3 bytes
    CHECK_FALSE(is_valid_utf8("\xE0\x9F\xBF"));          // U+07FF in 3 bytes
    CHECK_FALSE(is_valid_utf8("\xF0\x80\x80\xAF"));      // '/' in 4 bytes
    CHECK_FALSE(is_valid_utf8("\xF0\x8F\xBF\xBF"));      // U+FFFF in 4 bytes
}

TEST_CASE("text: surrogates are invalid") {
    CHECK_FALSE(is_valid_utf8("\xED\xA0\x80"));                  // U+D800
    CHECK_FALSE(is_valid_utf8("\xED\xAF\xBF"));                  // U+DBFF
    CHECK_FALSE(is_valid_utf8("\xED\xB0\x80"));                  // U+DC00
    CHECK_FALSE(is_valid_utf8("\xED\xBF\xBF"));                  // U+DFFF
    CHECK_FALSE(is_valid_utf8("\xED\xA0\xBD\xED\xB8\x80"));      // CESU-8 pair for U+1F600
}

TEST_CASE("text: above U+10FFFF and impossible bytes are invalid") {
    CHECK_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // U+110000
    CHECK_FALSE(is_valid_utf8("\xF5\x80\x80\x80"));
    CHECK_FALSE(is_valid_utf8("\xF8\x88\x80\x80\x80"));
    CHECK_FALSE(is_valid_utf8("\xFE"));
    CHECK_FALSE(is_valid_utf8("\xFF"));
    CHECK_FALSE(is_valid_utf8("abc\xFF" "def"));
}

TEST_CASE("text: truncated and broken sequences are invalid") {
    CHECK_FALSE(is_valid_utf8("\xC3"));               // 2-byte lead at the end
    CHECK_FALSE(is_valid_utf8("\xE2\x82"));           // 3-byte, one missing
    CHECK_FALSE(is_valid_utf8("\xF0\x9F\x98"));       // 4-byte, one missing
    CHECK_FALSE(is_valid_utf8("\xF0\x9F"));
    CHECK_FALSE(is_valid_utf8("abc\xE2\x82"));
    CHECK_FALSE(is_valid_utf8("\x80"));               // lone continuation
    CHECK_FALSE(is_valid_utf8("a\xBF" "b"));
    CHECK_FALSE(is_valid_utf8("\xC3" "A"));           // continuation missing, ASCII follows
    CHECK_FALSE(is_valid_utf8("\xE2\x82" "A"));
    CHECK_FALSE(is_valid_utf8("\xC3\xA9\xA9"));       // one continuation too many
}

// ---- sanitize_text ----------------------------------------------------------

TEST_CASE("text: valid text within the limit is unchanged") {
    CHECK(sanitize_text("", 10).empty());
    CHECK(sanitize_text("hello", 10) == "hello");
    CHECK(sanitize_text("hello", 5) == "hello");
    CHECK(sanitize_text("caf\xC3\xA9 \xF0\x9F\x98\x80", 100) == "caf\xC3\xA9 \xF0\x9F\x98\x80");
    CHECK(sanitize_text("line\r\n\ttab", 100) == "line\r\n\ttab");
}

TEST_CASE("text: invalid bytes become U+FFFD") {
    CHECK(sanitize_text("a\xFF" "b", 100) == "a\xEF\xBF\xBD" "b");
    CHECK(sanitize_text("\x80", 100) == fffd);
    const std::string overlong = sanitize_text("<\xC0\xAF>", 100);  // an overlong '/'
    CHECK(overlong.starts_with(std::string("<") + std::string(fffd)));
    CHECK(overlong.ends_with(std::string(fffd) + ">"));
    CHECK(overlong.find('/') == std::string::npos);
    CHECK(is_valid_utf8(overlong));
    CHECK(sanitize_text("\xED\xA0\x80", 100).find("\xED") == std::string::npos);      // surrogate gone
    CHECK(sanitize_text("x\xED\xA0\x80y", 100).starts_with("x\xEF\xBF\xBD"));
    CHECK(sanitize_text("x\xED\xA0\x80y", 100).ends_with("\xEF\xBF\xBD" "y"));
    // a broken sequence does not swallow the ASCII after it
    CHECK(sanitize_text("\xC3" "A", 100) == "\xEF\xBF\xBD" "A");
    // the valid parts around invalid bytes are kept
    CHECK(sanitize_text("\xC3\xA9\xFF\xC3\xA9", 100) == "\xC3\xA9\xEF\xBF\xBD\xC3\xA9");
}

TEST_CASE("text: a truncated sequence at the end becomes U+FFFD") {
    const std::string out = sanitize_text("abc\xE2\x82", 100);
    CHECK(out.starts_with("abc\xEF\xBF\xBD"));
    CHECK(is_valid_utf8(out));
    CHECK(out.find("\xE2\x82") == std::string::npos);
}

TEST_CASE("text: NUL becomes U+FFFD") {
    CHECK(sanitize_text(bytes("a\0b", 3), 100) == "a\xEF\xBF\xBD" "b");
    CHECK(sanitize_text(bytes("\0\0", 2), 100) == "\xEF\xBF\xBD\xEF\xBF\xBD");
    CHECK(sanitize_text(bytes("\0", 1), 100).find('\0') == std::string::npos);
}

TEST_CASE("text: max_bytes is respected") {
    CHECK(sanitize_text("hello, world", 5) == "hello");
    CHECK(sanitize_text("hello", 0).empty());
    CHECK(sanitize_text(std::string(10'000, 'x'), 1'024).size() == 1'024);
}

TEST_CASE("text: a cut never splits a multibyte character") {
    const std::string_view euros = "\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC";  // 3 x 3 bytes
    CHECK(sanitize_text(euros, 9) == euros);
    CHECK(sanitize_text(euros, 8) == "\xE2\x82\xAC\xE2\x82\xAC");
    CHECK(sanitize_text(euros, 7) == "\xE2\x82\xAC\xE2\x82\xAC");
    CHECK(sanitize_text(euros, 6) == "\xE2\x82\xAC\xE2\x82\xAC");
    CHECK(sanitize_text(euros, 5) == "\xE2\x82\xAC");
    CHECK(sanitize_text(euros, 2).empty());

    CHECK(sanitize_text("ab\xF0\x9F\x98\x80", 5) == "ab");
    CHECK(sanitize_text("ab\xF0\x9F\x98\x80", 6) == "ab\xF0\x9F\x98\x80");
    CHECK(sanitize_text("a\xC3\xA9", 2) == "a");

    // nor a replacement character
    CHECK(sanitize_text("ab\xFF", 4) == "ab");
    CHECK(sanitize_text("ab\xFF", 5) == "ab\xEF\xBF\xBD");
    CHECK(sanitize_text(bytes("ab\0", 3), 3) == "ab");
}

TEST_CASE("text: the output is always valid UTF-8 without NUL, within the limit") {
    // Deterministic pseudo-random byte soup, biased towards UTF-8 lead and
    // continuation bytes so that near-valid sequences are common.
    std::mt19937 rng(7);
    constexpr unsigned char interesting[] = {0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xED,
                                             0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0xA0, 0x9F, 0x8F, 0x90};
    for (int run = 0; run < 2'000; ++run) {
        std::string s(rng() % 40, '\0');
        for (auto& c : s) {
            const auto r = rng();
            c = static_cast<char>((r & 1) ? interesting[(r >> 1) % sizeof interesting] : (r >> 8) & 0xFF);
        }
        const std::size_t max_bytes = rng() % 50;
        CAPTURE(run);
        const std::string out = sanitize_text(s, max_bytes);
        CHECK(out.size() <= max_bytes);
        CHECK(is_valid_utf8(out));
        CHECK(out.find('\0') == std::string::npos);
        // valid input without NUL that fits is returned as is
        if (is_valid_utf8(s) && s.find('\0') == std::string::npos && s.size() <= max_bytes) CHECK(out == s);
    }
}

TEST_CASE("one_line: libpq's multi-line messages on one line") {
    CHECK(outboxd::one_line("connection to server at \"h\" failed: Connection refused\n\tIs the server running?\n") ==
          "connection to server at \"h\" failed: Connection refused Is the server running?");
    CHECK(outboxd::one_line("a  \n\n  b") == "a b");
    CHECK(outboxd::one_line("a\r\nb") == "a b");
    CHECK(outboxd::one_line("  tabs\tand  spaces stay  ") == "tabs\tand  spaces stay");
    CHECK(outboxd::one_line("\n") == "");
    CHECK(outboxd::one_line("") == "");
}

TEST_CASE("primary_message: the server's first line, without severity or context") {
    CHECK(outboxd::primary_message("ERROR:  permission denied for schema x\nLINE 18: FROM \"x\".events e\n   ^\n") ==
          "permission denied for schema x");
    CHECK(outboxd::primary_message("FATAL:  role \"r\" does not exist\n") == "role \"r\" does not exist");
    CHECK(outboxd::primary_message("no severity") == "no severity");
}
