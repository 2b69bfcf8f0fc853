#pragma once
// The state of the events table each relay.consume mode needs (README
// "Consumption modes"). `outboxd consume-setup windows|claims` runs these
// statements, and prints them for an operator's own migration tool.

#include <string>
#include <string_view>
#include <vector>

namespace outboxd::pg {

// windows: the txid default every new event records, and the two indexes
// the window read uses; claims: none of them, so that producers pay nothing
// for windows. Idempotent; transactional (all or none when run in one
// transaction). Any other mode throws std::invalid_argument.
[[nodiscard]] std::vector<std::string> consume_setup_statements(std::string_view schema, std::string_view mode);

}  // namespace outboxd::pg
