#include "core/text.hpp"

namespace outboxd {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
std::size_t sequence_length(std::string_view s, std::size_t i) noexcept {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    else return 0;
    if (i + len > s.size()) return 0;
    for (std::size_t k = 1; k < len; ++k) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
    }
    const auto c1 = static_cast<unsigned char>(s[i + 1]);
    if (c == 0xE0 && c1 < 0xA0) return 0;  // overlong
    if (c == 0xED && c1 > 0x9F) return 0;  // surrogates
    if (c == 0xF0 && c1 < 0x90) return 0;  // overlong
    if (c == 0xF4 && c1 > 0x8F) return 0;  // above U+10FFFF
    return len;
}

}  // namespace

bool is_valid_utf8(std::string_view s) noexcept {
    for (std::size_t i = 0; i < s.size();) {
        const auto len = sequence_length(s, i);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

std::string sanitize_text(std::string_view s, std::size_t max_bytes) {
    static constexpr std::string_view replacement = "\xEF\xBF\xBD";
    std::string out;
    out.reserve(std::min(s.size(), max_bytes));
    for (std::size_t i = 0; i < s.size();) {
        auto len = sequence_length(s, i);
        const bool bad = len == 0 || s[i] == '\0';
        const std::string_view piece = bad ? replacement : s.substr(i, len);
        if (out.size() + piece.size() > max_bytes) break;
        out.append(piece);
        i += bad ? 1 : len;
    }
    return out;
}

std::string one_line(std::string_view s) {
    constexpr std::string_view blank = " \t\r\n";
    const auto first = s.find_first_not_of(blank);
    if (first == std::string_view::npos) return {};
    s = s.substr(first, s.find_last_not_of(blank) - first + 1);
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        if (blank.find(s[i]) == std::string_view::npos) {
            out.push_back(s[i++]);
            continue;
        }
        const auto run = s.substr(i, s.find_first_not_of(blank, i) - i);  // never reaches the end (trimmed)
        if (run.find_first_of("\r\n") == std::string_view::npos) {
            out += run;
        } else {
            out.push_back(' ');
        }
        i += run.size();
    }
    return out;
}

std::string primary_message(std::string_view server_error) {
    auto line = server_error.substr(0, server_error.find('\n'));
    for (const std::string_view severity : {"ERROR:  ", "FATAL:  "}) {
        if (line.starts_with(severity)) line.remove_prefix(severity.size());
    }
    return one_line(line);
}

}  // namespace outboxd
