#include "nats/subject.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace outboxd::nats {
namespace {

bool bad_subject_char(char c) noexcept {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7f || c == '*' || c == '>';
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
}

std::vector<std::string_view> split_commas(std::string_view url) {
    std::vector<std::string_view> out;
    for (std::size_t start = 0;;) {
        const auto comma = url.find(',', start);
        out.push_back(trim(url.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
        if (comma == std::string_view::npos) return out;
        start = comma + 1;
    }
}

}  // namespace

bool valid_publish_subject(std::string_view subject) noexcept {
    if (subject.empty() || subject.front() == '.' || subject.back() == '.') return false;
    char previous = 0;
    for (const char c : subject) {
        if (bad_subject_char(c)) return false;
        if (c == '.' && previous == '.') return false;
        previous = c;
    }
    return true;
}

std::optional<std::string> subject_for(std::string_view tmpl, std::string_view topic) {
    std::string out;
    for (std::size_t at = 0;;) {
        const auto p = tmpl.find(topic_placeholder, at);
        out += tmpl.substr(at, p == std::string_view::npos ? std::string_view::npos : p - at);
        if (p == std::string_view::npos) break;
        out += topic;
        at = p + topic_placeholder.size();
    }
    if (!valid_publish_subject(out)) return std::nullopt;
    return out;
}

std::optional<std::string> subject_template_error(std::string_view tmpl) {
    std::string probe;
    for (std::size_t at = 0;;) {
        const auto p = tmpl.find(topic_placeholder, at);
        probe += tmpl.substr(at, p == std::string_view::npos ? std::string_view::npos : p - at);
        if (p == std::string_view::npos) break;
        probe += "topic";
        at = p + topic_placeholder.size();
    }
    if (probe.find_first_of("{}") != std::string::npos) {
        return "expected a NATS subject where {topic} is the only placeholder, like \"events.{topic}\"";
    }
    if (!valid_publish_subject(probe)) {
        return "expected a NATS subject: '.'-separated non-empty tokens without spaces or wildcards (* >), like "
               "\"events.{topic}\"";
    }
    return std::nullopt;
}

std::vector<std::string> parse_servers(std::string_view url) {
    std::vector<std::string> out;
    for (const auto server : split_commas(url)) {
        const auto scheme_end = server.find("://");
        const auto scheme = scheme_end == std::string_view::npos ? std::string_view{} : server.substr(0, scheme_end);
        if (scheme != "nats" && scheme != "tls") {
            throw std::invalid_argument(
                "expected nats://host:port or tls://host:port, comma-separated for several servers");
        }
        auto rest = server.substr(scheme_end + 3);
        if (const auto at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
        if (rest.empty() || rest.front() == ':' || rest.find_first_of("/?# ") != std::string_view::npos) {
            throw std::invalid_argument(fmt::format(
                "expected {}://host:port (no path), comma-separated for several servers", scheme));
        }
        out.emplace_back(server);
    }
    return out;
}

std::string loggable_servers(std::string_view url) {
    std::string out;
    for (const auto server : split_commas(url)) {
        if (!out.empty()) out += ',';
        const auto scheme_end = server.find("://");
        const auto at = server.rfind('@');
        if (scheme_end != std::string_view::npos && at != std::string_view::npos && at > scheme_end) {
            out += fmt::format("{}://<redacted>@{}", server.substr(0, scheme_end), server.substr(at + 1));
        } else {
            out += server;
        }
    }
    return out;
}

}  // namespace outboxd::nats
