#include "core/webhook_request.hpp"

#include <algorithm>
#include <array>
#include <string_view>

#include <fmt/format.h>

#include "core/http_token.hpp"

namespace outboxd {
namespace {

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// ASCII case-insensitive; `lower_prefix` is in lower case.
bool starts_with_ci(std::string_view s, std::string_view lower_prefix) noexcept {
    return s.size() >= lower_prefix.size() &&
           std::equal(lower_prefix.begin(), lower_prefix.end(), s.begin(), [](char p, char c) { return p == lower(c); });
}

}  // namespace

bool same_header_name(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

bool is_header_value(std::string_view s) noexcept {
    return std::none_of(s.begin(), s.end(), [](char ch) {
        const auto c = static_cast<unsigned char>(ch);
        return c == '\r' || c == '\n' || c == '\0' || (c < 0x20 && c != '\t') || c == 0x7F;
    });
}

bool is_reserved_header(std::string_view name) noexcept {
    static constexpr std::array<std::string_view, 9> framing{
        "host", "content-length", "content-type", "transfer-encoding", "connection",
        "keep-alive", "upgrade", "te", "trailer"};
    const bool is_framing = std::any_of(framing.begin(), framing.end(),
                                        [&](std::string_view f) { return same_header_name(name, f); });
    return is_framing || starts_with_ci(name, "webhook-") || starts_with_ci(name, "outbox-");
}

request_headers_result build_request_headers(const event& e, std::int64_t unix_seconds, std::string_view id_prefix) {
    request_headers_result out;
    out.headers.reserve(5 + e.headers.size());
    out.headers.emplace_back("webhook-id", fmt::format("{}{}", id_prefix, e.id));
    out.headers.emplace_back("webhook-timestamp", fmt::format("{}", unix_seconds));
    out.headers.emplace_back("outbox-topic", e.topic);
    out.headers.emplace_back("outbox-attempt", fmt::format("{}", e.attempt));
    if (e.ordering_key) out.headers.emplace_back("outbox-ordering-key", *e.ordering_key);
    if (!is_header_value(e.topic) || (e.ordering_key && !is_header_value(*e.ordering_key))) {
        out.error = "topic or ordering key contains characters not allowed in an HTTP header";
        return out;
    }
    for (const auto& [name, value] : e.headers) {
        if (!is_http_token(name)) {
            out.error = fmt::format("event header name is not a valid HTTP token: '{}'", name);
            return out;
        }
        if (!is_header_value(value)) {
            out.error = fmt::format("event header '{}' has a value with control characters", name);
            return out;
        }
        if (is_reserved_header(name)) continue;  // ours win; documented
        out.headers.emplace_back(name, value);
    }
    return out;
}

void add_destination_headers(header_list& headers, const header_list& destination_headers) {
    for (const auto& [name, value] : destination_headers) {
        if (is_reserved_header(name)) continue;
        std::erase_if(headers, [&](const auto& h) { return same_header_name(h.first, name); });
        headers.emplace_back(name, value);
    }
}

}  // namespace outboxd
