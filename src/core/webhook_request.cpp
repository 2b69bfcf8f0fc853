#include "core/webhook_request.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

#include <fmt/format.h>

namespace outboxd {
namespace {

// RFC 9110 token characters.
bool is_token(std::string_view s) {
    if (s.empty()) return false;
    return std::all_of(s.begin(), s.end(), [](char ch) {
        const auto c = static_cast<unsigned char>(ch);
        return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
    });
}

bool is_field_value(std::string_view s) {
    return std::none_of(s.begin(), s.end(), [](char ch) {
        const auto c = static_cast<unsigned char>(ch);
        return c == '\r' || c == '\n' || c == '\0' || (c < 0x20 && c != '\t') || c == 0x7F;
    });
}

std::string lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
    return out;
}

bool reserved(std::string_view lower_name) {
    static constexpr std::array<std::string_view, 9> framing{
        "host", "content-length", "content-type", "transfer-encoding", "connection",
        "keep-alive", "upgrade", "te", "trailer"};
    if (std::find(framing.begin(), framing.end(), lower_name) != framing.end()) return true;
    return lower_name.starts_with("webhook-") || lower_name.starts_with("outbox-");
}

}  // namespace

request_headers_result build_request_headers(const event& e, std::int64_t unix_seconds) {
    request_headers_result out;
    out.headers.reserve(5 + e.headers.size());
    out.headers.emplace_back("webhook-id", fmt::format("{}", e.id));
    out.headers.emplace_back("webhook-timestamp", fmt::format("{}", unix_seconds));
    out.headers.emplace_back("outbox-topic", e.topic);
    out.headers.emplace_back("outbox-attempt", fmt::format("{}", e.attempt));
    if (e.ordering_key) out.headers.emplace_back("outbox-ordering-key", *e.ordering_key);
    if (!is_field_value(e.topic) || (e.ordering_key && !is_field_value(*e.ordering_key))) {
        out.error = "topic or ordering key contains characters not allowed in an HTTP header";
        return out;
    }
    for (const auto& [name, value] : e.headers) {
        if (!is_token(name)) {
            out.error = fmt::format("event header name is not a valid HTTP token: '{}'", name);
            return out;
        }
        if (!is_field_value(value)) {
            out.error = fmt::format("event header '{}' has a value with control characters", name);
            return out;
        }
        if (reserved(lower(name))) continue;  // ours win; documented
        out.headers.emplace_back(name, value);
    }
    return out;
}

void add_destination_headers(header_list& headers, const header_list& destination_headers) {
    for (const auto& [name, value] : destination_headers) {
        const auto key = lower(name);
        if (reserved(key)) continue;
        std::erase_if(headers, [&](const auto& h) { return lower(h.first) == key; });
        headers.emplace_back(name, value);
    }
}

}  // namespace outboxd
