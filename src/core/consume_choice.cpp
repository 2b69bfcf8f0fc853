#include "core/consume_choice.hpp"

#include <algorithm>

namespace outboxd {

consume_choice choose_consume_mode(const consume_facts& facts) {
    using because = consume_choice::because;
    if (!facts.live_leases) return {"claims", because::no_live_leases};
    if (!facts.live_relay_modes.empty()) {
        // Relays of both modes at once cannot run (they refuse each other);
        // should the table say so anyway, claims: a relay older than 0015
        // ("") claims, and the mode check cannot see it.
        const bool all_windows = std::all_of(facts.live_relay_modes.begin(), facts.live_relay_modes.end(),
                                             [](const std::string& m) { return m == "windows"; });
        return {all_windows ? "windows" : "claims", because::joins_live_relays};
    }
    if (!facts.windows_set_up) return {"claims", because::set_up_for_claims};
    return {"windows", because::windows_default};
}

std::string_view describe(consume_choice::because why) noexcept {
    switch (why) {
        case consume_choice::because::windows_default: return "the default";
        case consume_choice::because::no_live_leases: return "relay.live_leases = false";
        case consume_choice::because::joins_live_relays: return "the mode of the relays already running";
        case consume_choice::because::set_up_for_claims: return "the outbox is set up for claims";
    }
    return "";
}

}  // namespace outboxd
