#include "core/routing.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

namespace outboxd {

route_table::route_table(const config& c) : destination_count_(c.destinations.size()) {
    routes_.reserve(c.routes.size());
    for (std::size_t r = 0; r < c.routes.size(); ++r) {
        const auto& route = c.routes[r];
        compiled_route compiled;
        for (const auto& text : route.topics) {
            try {
                compiled.patterns.push_back(topic_pattern::parse(text));
            } catch (const std::invalid_argument& e) {
                throw config_error(fmt::format("routes[{}]: {}", r, e.what()));
            }
        }
        for (const auto& name : route.destinations) {
            const auto it = std::find_if(c.destinations.begin(), c.destinations.end(),
                                         [&](const destination_config& d) { return d.name == name; });
            if (it == c.destinations.end()) {
                throw config_error(fmt::format("routes[{}]: no destination named \"{}\"", r, name));
            }
            compiled.destinations.push_back(static_cast<std::size_t>(it - c.destinations.begin()));
        }
        routes_.push_back(std::move(compiled));
    }
}

std::vector<std::size_t> route_table::match(std::string_view topic) const {
    // One bit per destination: de-duplicates, and reading the bits in index
    // order gives config order. Up to 64 destinations (the usual case) the
    // bits live in a register and matching allocates only the result.
    std::vector<bool> many;
    std::uint64_t few = 0;
    const bool small = destination_count_ <= 64;
    if (!small) many.assign(destination_count_, false);
    bool any_hit = false;
    for (const auto& route : routes_) {
        const bool matched = std::any_of(route.patterns.begin(), route.patterns.end(),
                                         [&](const topic_pattern& p) { return p.matches(topic); });
        if (!matched) continue;
        any_hit = true;
        for (const auto d : route.destinations) {
            if (small) {
                few |= std::uint64_t{1} << d;
            } else {
                many[d] = true;
            }
        }
    }
    std::vector<std::size_t> out;
    if (!any_hit) return out;
    for (std::size_t d = 0; d < destination_count_; ++d) {
        if (small ? ((few >> d) & 1U) != 0 : static_cast<bool>(many[d])) out.push_back(d);
    }
    return out;
}

std::optional<std::string> impossible_destination(const std::vector<std::string>& names) {
    const auto bad = std::find_if_not(names.begin(), names.end(), valid_destination_name);
    if (bad == names.end()) return std::nullopt;
    return fmt::format("the event names a destination that cannot exist: '{}'", *bad);
}

std::string no_route_error(std::string_view topic) { return fmt::format("no route matches topic '{}'", topic); }

}  // namespace outboxd
