#include "core/outcome_batch.hpp"

#include <doctest/doctest.h>

using namespace outboxd;

TEST_CASE("outcome batch: take_front moves a bounded part, in order, and leaves the rest") {
    outcome_batch b;
    for (std::int64_t i = 1; i <= 5; ++i) b.delivered.push_back({i, 1});
    b.retries.push_back({{6, 1}, std::chrono::milliseconds(100), "HTTP 500"});
    b.deliveries.delivered.push_back({7, "a", 1});
    b.handed_back.push_back({{8, 1}, std::chrono::milliseconds(0), {}});
    b.unblocks_key = true;
    REQUIRE(b.size() == 8);

    auto front = b.take_front(6);
    CHECK(front.size() == 6);
    CHECK(front.delivered.size() == 5);
    REQUIRE(front.retries.size() == 1);
    CHECK(front.retries[0].ref.id == 6);
    CHECK(front.unblocks_key);
    CHECK(b.size() == 2);
    CHECK(b.deliveries.delivered.size() == 1);
    CHECK(b.handed_back.size() == 1);

    auto rest = b.take_front(100);
    CHECK(rest.size() == 2);
    CHECK(b.empty());
}
