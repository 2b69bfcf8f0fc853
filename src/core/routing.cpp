#include "core/routing.hpp"

#include <algorithm>
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
    // One flag per destination: de-duplicates, and reading the flags in
    // index order gives config order.
    std::vector<bool> hit(destination_count_, false);
    std::size_t hits = 0;
    for (const auto& route : routes_) {
        const bool any = std::any_of(route.patterns.begin(), route.patterns.end(),
                                     [&](const topic_pattern& p) { return p.matches(topic); });
        if (!any) continue;
        for (const auto d : route.destinations) {
            if (!hit[d]) {
                hit[d] = true;
                ++hits;
            }
        }
        if (hits == destination_count_) break;  // nothing left to add
    }
    std::vector<std::size_t> out;
    out.reserve(hits);
    for (std::size_t d = 0; d < destination_count_ && out.size() < hits; ++d) {
        if (hit[d]) out.push_back(d);
    }
    return out;
}

}  // namespace outboxd
