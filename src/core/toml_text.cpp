#include "core/toml_text.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/text.hpp"

namespace outboxd {

std::string toml_quoted(std::string_view raw) {
    const std::string s = is_valid_utf8(raw) ? std::string(raw) : sanitize_text(raw, raw.size() * 3);
    std::string out;
    out.reserve(s.size() + 2);
    out.push_back('"');
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        switch (ch) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\t': out += "\\t"; break;
            case '\n': out += "\\n"; break;
            case '\f': out += "\\f"; break;
            case '\r': out += "\\r"; break;
            default:
                if (c < 0x20 || c == 0x7F) {
                    out += fmt::format("\\u{:04X}", c);
                } else {
                    out.push_back(ch);
                }
        }
    }
    out.push_back('"');
    return out;
}

bool is_bare_key(std::string_view k) noexcept {
    return !k.empty() && std::all_of(k.begin(), k.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
}

std::string toml_key(std::string_view k) { return is_bare_key(k) ? std::string(k) : toml_quoted(k); }

}  // namespace outboxd
