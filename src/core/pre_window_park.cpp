#include "core/pre_window_park.hpp"

#include <chrono>

#include <fmt/format.h>

namespace outboxd {

window_park park_pre_window(const pre_window_event& e, const route_table& routes,
                            const std::vector<destination_config>& destinations) {
    window_park park{e.id, 0, {}, {}};
    const auto dead = [&](std::string why) { park.dead.push_back({"", e.attempts, std::move(why), std::nullopt, {}}); };
    const auto owe = [&](const std::string& name) {
        park.owed.push_back({name, std::chrono::milliseconds(0), e.attempts, e.last_error});
    };
    if (!e.only_to.empty()) {
        if (auto why = impossible_destination(e.only_to)) {
            dead(std::move(*why));
            return park;
        }
        // Known to this relay or not: a relay that knows it delivers it.
        for (const auto& name : e.only_to) owe(name);
        return park;
    }
    const auto targets = routes.match(e.topic);
    if (targets.empty()) {
        dead(fmt::format("{}; dead-lettered when windows took over the events written before them (replay it "
                         "once a route matches)",
                         no_route_error(e.topic)));
        return park;
    }
    for (const auto i : targets) owe(destinations[i].name);
    return park;
}

}  // namespace outboxd
