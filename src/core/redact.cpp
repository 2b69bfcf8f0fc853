#include "core/redact.hpp"

#include <algorithm>

namespace outboxd {
namespace {

constexpr std::size_t min_secret = 4;
constexpr std::size_t min_word = 8;
constexpr std::string_view replacement = "<redacted>";

void split_into(std::vector<std::string>& out, std::string_view text, char separator, std::size_t min_size) {
    while (!text.empty()) {
        const auto end = text.find(separator);
        const auto part = text.substr(0, end);
        if (part.size() >= min_size) out.emplace_back(part);
        if (end == std::string_view::npos) break;
        text.remove_prefix(end + 1);
    }
}

}  // namespace

std::vector<std::string> quotable_secrets(const destination_config& d) {
    std::vector<std::string> out;
    for (const auto& [name, value] : d.headers) {
        out.push_back(value);
        split_into(out, value, ' ', min_word);
    }
    if (const auto q = d.url.target.find('?'); q != std::string::npos) {
        const std::string_view query = std::string_view(d.url.target).substr(q + 1);
        out.emplace_back(query);
        std::vector<std::string> pairs;
        split_into(pairs, query, '&', 1);
        for (const auto& pair : pairs) {
            if (const auto eq = pair.find('='); eq != std::string::npos) out.push_back(pair.substr(eq + 1));
        }
    }
    std::erase_if(out, [](const std::string& s) { return s.size() < min_secret; });
    std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
        return a.size() != b.size() ? a.size() > b.size() : a < b;
    });
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

std::string redact(std::string_view text, const std::vector<std::string>& secrets) {
    std::string out(text);
    for (const auto& secret : secrets) {
        if (secret.size() < min_secret) continue;
        for (auto at = out.find(secret); at != std::string::npos; at = out.find(secret, at + replacement.size())) {
            out.replace(at, secret.size(), replacement);
        }
    }
    return out;
}

}  // namespace outboxd
