#include "core/db_backoff.hpp"

#include <doctest/doctest.h>

#include <chrono>

TEST_CASE("db_backoff: 100 ms doubling to 5 s; a reconnect waits between half its delay and all of it") {
    outboxd::db_backoff b;
    CHECK(b.next() == std::chrono::milliseconds(100));
    CHECK(b.next() == std::chrono::milliseconds(200));
    for (int i = 0; i < 10; ++i) (void)b.next();
    CHECK(b.next() == std::chrono::milliseconds(5'000));
    b.reset();
    CHECK(b.next() == std::chrono::milliseconds(100));
    using outboxd::jittered;
    CHECK(jittered(std::chrono::milliseconds(1'000), 0) == std::chrono::milliseconds(500));
    CHECK(jittered(std::chrono::milliseconds(1'000), 500) == std::chrono::milliseconds(1'000));
    CHECK(jittered(std::chrono::milliseconds(1'000), 501) == std::chrono::milliseconds(500));
    CHECK(jittered(std::chrono::milliseconds(1'000), 0xffffffffu) <= std::chrono::milliseconds(1'000));
}
