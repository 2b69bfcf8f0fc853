#include "http/request_head.hpp"

#include <array>

#include <fmt/format.h>

#include "core/webhook_request.hpp"

namespace outboxd::http {
namespace {

using outboxd::same_header_name;

// Fields that define the message's framing or the connection: the client's
// own, whoever calls it (core's is_reserved_header is the relay's wider rule
// for event and configured headers).
bool reserved(std::string_view name) noexcept {
    static constexpr std::array<std::string_view, 9> ours{
        "host", "content-length", "transfer-encoding", "connection", "keep-alive",
        "proxy-connection", "te", "trailer", "upgrade"};
    for (const auto r : ours) {
        if (same_header_name(name, r)) return true;
    }
    return false;
}

void field(std::string& out, std::string_view name, std::string_view value) {
    out.append(name).append(": ").append(value).append("\r\n");
}

}  // namespace

std::string request_head(const request_target& to, const header_list& headers, std::size_t body_size) {
    std::string_view user_agent = to.user_agent;
    std::string_view content_type = "application/json";
    std::size_t extra = 0;
    for (const auto& [name, value] : headers) {
        if (same_header_name(name, "user-agent")) user_agent = value;
        if (same_header_name(name, "content-type")) content_type = value;
        extra += name.size() + value.size() + 4;
    }
    std::string out;
    out.reserve(128 + to.target.size() + to.host_header.size() + user_agent.size() + extra);
    out.append("POST ").append(to.target).append(" HTTP/1.1\r\n");
    field(out, "Host", to.host_header);
    field(out, "User-Agent", user_agent);
    field(out, "Content-Type", content_type);
    field(out, "Connection", "keep-alive");
    for (const auto& [name, value] : headers) {
        if (reserved(name) || same_header_name(name, "user-agent") || same_header_name(name, "content-type")) continue;
        field(out, name, value);
    }
    fmt::format_to(std::back_inserter(out), "Content-Length: {}\r\n\r\n", body_size);
    return out;
}

}  // namespace outboxd::http
