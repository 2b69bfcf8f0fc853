// core/window_safety: when a commit-ordered window may be read.
#include <doctest/doctest.h>

#include <stdexcept>

#include "core/window_safety.hpp"

using namespace outboxd;

TEST_CASE("window safety: the verdict for each combination") {
    constexpr std::int64_t here = 7301234567890123456;
    constexpr std::int64_t elsewhere = 7309999999999999999;
    struct row {
        const char* what;
        cursor_origin cursor;
        server_position server;
        window_verdict verdict;
    };
    const row rows[] = {
        {"server ahead", {1000, here}, {false, 1500, here}, window_verdict::fine},
        {"nothing started since the cursor", {1000, here}, {false, 1000, here}, window_verdict::fine},
        {"a fresh cursor at xmax 3", {3, here}, {false, 3, here}, window_verdict::fine},
        {"server one behind", {1000, here}, {false, 999, here}, window_verdict::xid_regression},
        {"server far behind (a restore)", {5000000000ULL, here}, {false, 740, here}, window_verdict::xid_regression},
        {"another cluster, ahead", {1000, here}, {false, 1500, elsewhere}, window_verdict::other_cluster},
        {"another cluster and behind", {1000, here}, {false, 10, elsewhere}, window_verdict::other_cluster},
        {"standby", {1000, here}, {true, 1500, here}, window_verdict::standby},
        {"standby of another cluster, behind", {1000, here}, {true, 10, elsewhere}, window_verdict::standby},
    };
    for (const auto& r : rows) {
        CAPTURE(r.what);
        CHECK(check_window(r.cursor, r.server) == r.verdict);
    }
}

TEST_CASE("window safety: the message names both values, and says nothing when fine") {
    const cursor_origin cursor{1000, 42};
    CHECK(describe(window_verdict::fine, cursor, {false, 1500, 42}).empty());
    const auto regression = describe(window_verdict::xid_regression, cursor, {false, 999, 42});
    CHECK(regression.find("999") != std::string::npos);
    CHECK(regression.find("1000") != std::string::npos);
    const auto other = describe(window_verdict::other_cluster, cursor, {false, 1500, 43});
    CHECK(other.find("42") != std::string::npos);
    CHECK(other.find("43") != std::string::npos);
    CHECK(describe(window_verdict::standby, cursor, {true, 1500, 42}).find("standby") != std::string::npos);
}

TEST_CASE("window safety: xmax of a snapshot's text") {
    CHECK(snapshot_xmax("740:745:740,742") == 745);
    CHECK(snapshot_xmax("740:740:") == 740);
    CHECK(snapshot_xmax("4294967296:8589934592:") == 8589934592ULL);
    for (const char* bad : {"", "740", "740:", "740::", "740:x:", "740:12a:", ":-1:"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS((void)snapshot_xmax(bad), std::invalid_argument);
    }
}

TEST_CASE("window safety: a cursor's origin is the higher xmax of A and B; require_window_safe throws the line") {
    CHECK(origin_of("740:745:740", std::nullopt, 42).xmax == 745);
    CHECK(origin_of("740:745:740", std::string("750:760:"), 42).xmax == 760);
    CHECK(origin_of("740:745:", std::nullopt, 42).system_identifier == 42);
    CHECK_NOTHROW(require_window_safe({760, 42}, {false, 760, 42}));
    try {
        require_window_safe({760, 42}, {false, 700, 42});
        FAIL("no window_unsafe thrown");
    } catch (const window_unsafe& e) {
        CHECK(e.verdict == window_verdict::xid_regression);
        CHECK(std::string(e.what()) == describe(window_verdict::xid_regression, {760, 42}, {false, 700, 42}));
    }
    CHECK_THROWS_AS(require_window_safe({760, 42}, {true, 800, 42}), window_unsafe);
    CHECK_THROWS_AS(require_window_safe({760, 42}, {false, 800, 43}), window_unsafe);
}

TEST_CASE("window safety: snapshot bounds, and text that is not a snapshot") {
    const auto b = bounds_of("748:755:748,751");
    CHECK(b.xmin == 748);
    CHECK(b.xmax == 755);
    CHECK_THROWS_AS((void)bounds_of("748"), std::invalid_argument);
    CHECK_THROWS_AS((void)bounds_of("x:1:"), std::invalid_argument);
    CHECK_THROWS_AS((void)bounds_of(":1:"), std::invalid_argument);
}
