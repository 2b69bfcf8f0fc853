#include "core/pre_window_park.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace outboxd;

namespace {

// destinations: orders, audit; orders.* goes to both, audit.* to audit.
config two_destinations() {
    config c;
    for (const auto* name : {"orders", "audit"}) {
        destination_config d;
        d.name = name;
        c.destinations.push_back(std::move(d));
    }
    c.routes = {{{"orders.*"}, {"orders", "audit"}}, {{"audit.*"}, {"audit"}}};
    return c;
}

std::vector<std::string> owed_names(const window_park& p) {
    std::vector<std::string> out;
    for (const auto& o : p.owed) out.push_back(o.destination);
    return out;
}

}  // namespace

TEST_CASE("pre-window park: an event owes every destination its topic routes to, with its attempts and error") {
    const auto c = two_destinations();
    const route_table routes(c);
    const auto p = park_pre_window({41, "orders.created", {}, 3, "HTTP 503"}, routes, c.destinations);
    CHECK(p.id == 41);
    CHECK(p.dead.empty());
    CHECK(owed_names(p) == std::vector<std::string>{"orders", "audit"});
    for (const auto& o : p.owed) {
        CHECK(o.attempts == 3);  // the attempts made so far count at each destination
        CHECK(o.error == "HTTP 503");
        CHECK(o.due_in.count() == 0);  // the statement keeps its own schedule (available_at)
    }
}

TEST_CASE("pre-window park: a replayed event owes the destinations it names, known to this relay or not") {
    const auto c = two_destinations();
    const route_table routes(c);
    const auto p = park_pre_window({7, "orders.created", {"audit", "elsewhere"}, 1, std::nullopt}, routes,
                                   c.destinations);
    CHECK(p.dead.empty());
    CHECK(owed_names(p) == std::vector<std::string>{"audit", "elsewhere"});
    CHECK_FALSE(p.owed.front().error.has_value());
}

TEST_CASE("pre-window park: an event that can never be sent is one dead letter for the whole event") {
    const auto c = two_destinations();
    const route_table routes(c);
    SUBCASE("no route matches its topic") {
        const auto p = park_pre_window({9, "nobody.listens", {}, 2, std::nullopt}, routes, c.destinations);
        CHECK(p.owed.empty());
        REQUIRE(p.dead.size() == 1);
        CHECK(p.dead.front().destination.empty());  // the whole event
        CHECK(p.dead.front().attempts == 2);
        CHECK(p.dead.front().error.find("no route matches topic 'nobody.listens'") != std::string::npos);
    }
    SUBCASE("it names a destination no destination can be called") {
        const auto p = park_pre_window({9, "orders.created", {"audit", "bad name!"}, 0, std::nullopt}, routes,
                                       c.destinations);
        CHECK(p.owed.empty());
        REQUIRE(p.dead.size() == 1);
        CHECK(p.dead.front().error.find("'bad name!'") != std::string::npos);
    }
}
