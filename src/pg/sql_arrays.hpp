#pragma once
// PostgreSQL array literals for statement parameters (libpqxx 6.4 sends
// parameters as text and has no array support of its own).

#include <optional>
#include <string>

#include <fmt/format.h>

namespace outboxd::pg {

// {1,2,3} of what `field` gives for each item.
template <typename Items, typename Field>
std::string number_array(const Items& items, Field field) {
    std::string out = "{";
    for (const auto& item : items) {
        if (out.size() > 1) out.push_back(',');
        out += fmt::format("{}", field(item));
    }
    out.push_back('}');
    return out;
}

// A text[] literal: every element double-quoted with " and \ escaped;
// nullopt becomes NULL.
template <typename Items, typename Field>
std::string text_array(const Items& items, Field field) {
    std::string out = "{";
    bool first = true;
    for (const auto& item : items) {
        if (!first) out.push_back(',');
        first = false;
        const std::optional<std::string> value = field(item);
        if (!value) {
            out += "NULL";
            continue;
        }
        out.push_back('"');
        for (const char ch : *value) {
            if (ch == '"' || ch == '\\') out.push_back('\\');
            out.push_back(ch);
        }
        out.push_back('"');
    }
    out.push_back('}');
    return out;
}

// A text[] literal of strings.
template <typename Strings>
std::string text_array(const Strings& items) {
    return text_array(items, [](const std::string& s) { return std::optional<std::string>(s); });
}

}  // namespace outboxd::pg
