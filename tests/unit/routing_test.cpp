#include "core/routing.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

using namespace outboxd;

namespace {

config with_destinations(std::initializer_list<std::string_view> names) {
    config c;
    for (const auto name : names) {
        destination_config d;
        d.name = std::string(name);
        c.destinations.push_back(std::move(d));
    }
    return c;
}

using indices = std::vector<std::size_t>;

}  // namespace

TEST_CASE("routing: table of topic -> destinations, each once, in config order") {
    // destinations: 0 orders, 1 billing, 2 audit, 3 eu
    auto c = with_destinations({"orders", "billing", "audit", "eu"});
    c.routes = {
        {{"orders.*"}, {"orders"}},
        {{"billing.>", "invoices.*"}, {"billing"}},
        {{"*.eu.>"}, {"eu", "orders"}},           // names out of config order
        {{">"}, {"audit"}},
        {{"orders.created"}, {"orders", "orders"}},  // duplicate within a route
    };
    const route_table routes(c);
    const std::pair<std::string_view, indices> cases[] = {
        {"orders.created", {0, 2}},            // orders.* + > + literal (orders once)
        {"orders.updated", {0, 2}},
        {"orders.eu.created", {0, 2, 3}},      // *.eu.> names eu before orders: config order wins
        {"billing.paid", {1, 2}},
        {"billing.eu.paid", {0, 1, 2, 3}},  // billing.>, *.eu.> (eu and orders), >
        {"invoices.sent", {1, 2}},
        {"invoices.sent.late", {2}},           // invoices.* is one token only
        {"misc", {2}},
        {"a..b", {}},                          // empty token: no wildcard matches, not even >
        {"", {}},
    };
    for (const auto& [topic, expected] : cases) {
        CAPTURE(topic);
        CHECK(routes.match(topic) == expected);
    }
}

TEST_CASE("routing: no route matches -> empty") {
    auto c = with_destinations({"orders"});
    c.routes = {{{"orders.*"}, {"orders"}}};
    const route_table routes(c);
    CHECK(routes.match("billing.paid").empty());
    CHECK(routes.match("orders").empty());
    CHECK(routes.match("orders.paid") == indices{0});
}

TEST_CASE("routing: a destination named by no matching route is not returned, whatever its position") {
    auto c = with_destinations({"a", "b", "c"});
    c.routes = {{{"x.>"}, {"c"}}, {{"y.>"}, {"a"}}};
    const route_table routes(c);
    CHECK(routes.match("x.1") == indices{2});
    CHECK(routes.match("y.1") == indices{0});
}

TEST_CASE("routing: the --url shortcut's single route sends every topic to the only destination") {
    auto c = with_destinations({"default"});
    c.routes = {{{">"}, {"default"}}};
    const route_table routes(c);
    CHECK(routes.match("t") == indices{0});
    CHECK(routes.match("orders.eu.created") == indices{0});
}

TEST_CASE("routing: invalid patterns and unknown destinations are refused naming the route") {
    auto c = with_destinations({"orders"});
    c.routes = {{{"orders.*"}, {"orders"}}, {{"ord*"}, {"orders"}}};
    CHECK_THROWS_WITH_AS(route_table{c}, doctest::Contains("routes[1]: invalid topic pattern \"ord*\""),
                         config_error);
    c.routes = {{{"orders.*"}, {"ordres"}}};
    CHECK_THROWS_WITH_AS(route_table{c}, "routes[0]: no destination named \"ordres\"", config_error);
}

TEST_CASE("routing: more than 64 destinations (the wide path) keeps config order and de-duplicates") {
    config c;
    for (int i = 0; i < 70; ++i) {
        destination_config d;
        d.name = "d" + std::to_string(i);
        c.destinations.push_back(std::move(d));
    }
    c.routes = {{{"a.*"}, {"d69", "d0", "d64"}}, {{">"}, {"d64", "d1"}}, {{"b"}, {"d2"}}};
    const route_table routes(c);
    CHECK(routes.match("a.x") == indices{0, 1, 64, 69});
    CHECK(routes.match("b") == indices{1, 2, 64});
    CHECK(routes.match("a..x").empty());
}
