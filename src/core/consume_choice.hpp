#pragma once
// Which consume mode a relay with relay.consume = "auto" (the default) runs
// in, from what it finds in the database at startup. Pure.
//
// Commit-ordered windows are the default (sql/0016 sets every outbox up for
// them): no write per delivered event, keyed streams at the unkeyed rate,
// per-key commit order (README "Consumption modes"). A relay claims instead
// when windows cannot work for it, or when switching now would break the
// rule that every relay of an outbox uses one mode:
//
//   1. relay.live_leases = false (e.g. behind a transaction pooler): a
//      window cursor belongs to a relay's session (sql/0006);
//   2. live relays run already: it joins their mode, so that a rolling
//      restart or upgrade never stops on the mode check (sql/0015). A relay
//      of 0006 to 0014 says no mode; it claims (older ones, and relays
//      without live leases, register nowhere: not seen, README
//      "Upgrading"). An outbox whose relays all claim switches to windows
//      at its next full stop;
//   3. the outbox is set up for claims (`outboxd consume-setup claims`: new
//      events record no transaction id): an operator's choice.

#include <string>
#include <string_view>
#include <vector>

namespace outboxd {

struct consume_facts {
    bool live_leases = true;
    bool windows_set_up = true;  // the txid default and its index (windows_set_up in queries.sql)
    // The other live relays' modes: "claims", "windows", or "" for a relay
    // older than sql/0015.
    std::vector<std::string> live_relay_modes;
};

struct consume_choice {
    enum class because { windows_default, no_live_leases, joins_live_relays, set_up_for_claims };
    std::string mode;  // "claims" or "windows"
    because why = because::windows_default;
};

[[nodiscard]] consume_choice choose_consume_mode(const consume_facts& facts);

// For the "relay started" log line: why this mode, in a few words.
[[nodiscard]] std::string_view describe(consume_choice::because why) noexcept;

}  // namespace outboxd
