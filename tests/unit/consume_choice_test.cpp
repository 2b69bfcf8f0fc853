#include "core/consume_choice.hpp"

#include <doctest/doctest.h>

using namespace outboxd;
using because = consume_choice::because;

TEST_CASE("consume choice: an outbox set up for windows with no relay running reads windows") {
    const auto c = choose_consume_mode({.live_leases = true, .windows_set_up = true, .live_relay_modes = {}});
    CHECK(c.mode == "windows");
    CHECK(c.why == because::windows_default);
}

TEST_CASE("consume choice: without live leases a relay claims, whatever the outbox and the other relays") {
    for (const bool set_up : {true, false}) {
        const auto c =
            choose_consume_mode({.live_leases = false, .windows_set_up = set_up, .live_relay_modes = {"windows"}});
        CHECK(c.mode == "claims");
        CHECK(c.why == because::no_live_leases);
    }
}

TEST_CASE("consume choice: a relay joins the mode of the live relays, so a rolling restart never stops") {
    SUBCASE("claiming relays: claims, although the outbox is set up for windows") {
        const auto c = choose_consume_mode({.live_relay_modes = {"claims", "claims"}});
        CHECK(c.mode == "claims");
        CHECK(c.why == because::joins_live_relays);
    }
    SUBCASE("windows relays: windows") {
        const auto c = choose_consume_mode({.live_relay_modes = {"windows"}});
        CHECK(c.mode == "windows");
        CHECK(c.why == because::joins_live_relays);
    }
    SUBCASE("a relay older than 0015 says no mode: it claims") {
        CHECK(choose_consume_mode({.live_relay_modes = {""}}).mode == "claims");
        CHECK(choose_consume_mode({.live_relay_modes = {"windows", ""}}).mode == "claims");
    }
    SUBCASE("modes mixed: claims") {
        CHECK(choose_consume_mode({.live_relay_modes = {"windows", "claims"}}).mode == "claims");
    }
}

TEST_CASE("consume choice: an outbox set up for claims is claimed when no relay runs") {
    const auto c = choose_consume_mode({.live_leases = true, .windows_set_up = false, .live_relay_modes = {}});
    CHECK(c.mode == "claims");
    CHECK(c.why == because::set_up_for_claims);
}

TEST_CASE("consume choice: every reason is described") {
    for (const auto why : {because::windows_default, because::no_live_leases, because::joins_live_relays,
                           because::set_up_for_claims}) {
        CHECK_FALSE(describe(why).empty());
    }
}
