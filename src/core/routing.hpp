#pragma once
// Which destinations an event goes to: the configuration's [[routes]],
// compiled once at startup and matched once per claimed event.
//
// Every route whose topic patterns (topic_pattern.hpp) match the event's
// topic contributes its destinations. A destination named by several
// matching routes receives the event once. The result is in the order of
// config::destinations, whatever the order of the routes, so deliveries of
// one event are always attempted in the same order.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "core/topic_pattern.hpp"

namespace outboxd {

class route_table {
public:
    // Throws config_error for a pattern that does not parse or a route that
    // names a destination `c` does not have (resolve_config has already
    // refused both; this guards configurations built by hand).
    explicit route_table(const config& c);

    // Indices into c.destinations of every destination whose routes match
    // `topic`, each once, in config order; empty if no route matches.
    [[nodiscard]] std::vector<std::size_t> match(std::string_view topic) const;

private:
    struct compiled_route {
        std::vector<topic_pattern> patterns;
        std::vector<std::size_t> destinations;
    };
    std::vector<compiled_route> routes_;
    std::size_t destination_count_ = 0;
};

// Why an event that names its destinations (events.destinations, written by
// replays, but by any writer) can never be delivered: the first name no
// destination can have; nullopt when every name could be one.
[[nodiscard]] std::optional<std::string> impossible_destination(const std::vector<std::string>& names);

// Why an event is routed nowhere (the start of its error or dead letter).
[[nodiscard]] std::string no_route_error(std::string_view topic);

}  // namespace outboxd
