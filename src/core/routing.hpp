#pragma once
// TEMPORARY stand-in until the routing module lands: exact topics and ">".
#include <string_view>
#include <vector>
#include "core/config.hpp"
namespace outboxd {
class route_table {
public:
    explicit route_table(const config& c) : c_(c) {}
    [[nodiscard]] std::vector<std::size_t> match(std::string_view topic) const {
        std::vector<std::size_t> out;
        for (const auto& r : c_.routes) {
            for (const auto& p : r.topics) {
                if (p != ">" && p != topic) continue;
                for (const auto& name : r.destinations) {
                    for (std::size_t i = 0; i < c_.destinations.size(); ++i) {
                        if (c_.destinations[i].name == name && std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
                    }
                }
            }
        }
        return out;
    }
private:
    config c_;
};
}  // namespace outboxd
