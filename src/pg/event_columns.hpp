#pragma once
// Decoding the columns an event is read with (claims and window reads alike).
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/event.hpp"

namespace outboxd::pg {

// The headers column's text: an object of strings (the column's CHECK).
// Throws on text that is not (bytes that are not UTF-8, say).
inline header_list parse_headers(const char* json_text) {
    header_list out;
    const auto object = nlohmann::json::parse(json_text);
    out.reserve(object.size());
    for (const auto& [name, value] : object.items()) out.emplace_back(name, value.get<std::string>());
    return out;
}

// Names joined by ',' (array_to_string in the statements): destination names
// never hold one, and unlike an array's text form nothing is quoted (an
// element "null" would be).
inline std::vector<std::string> destination_names(std::string_view array) {
    std::vector<std::string> out;
    while (!array.empty()) {
        const auto comma = array.find(',');
        out.emplace_back(array.substr(0, comma));
        if (comma == std::string_view::npos) break;
        array.remove_prefix(comma + 1);
    }
    return out;
}

// Why an event whose headers cannot be decoded is never sent.
inline constexpr const char* undecodable_headers =
    "the event's headers cannot be decoded as UTF-8 JSON (the database's encoding is not UTF-8?); it cannot be sent";

}  // namespace outboxd::pg
