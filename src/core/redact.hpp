#pragma once
// Secrets a webhook receiver may quote back. A receiver that refuses a
// request often says why with what it was sent ("invalid token Bearer
// abc..."); its answer becomes last_error, a dead letter's excerpt and a log
// line, so the destination's own secrets are cut out of it first.

#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"

namespace outboxd {

// What of `d` travels in its requests and is secret: each configured header
// value, whole and each space-separated word of it of 8 bytes or more (the
// token of "Bearer <token>"), and the URL's query string, whole and each
// parameter value. Longest first. Signing secrets are never sent, only
// signatures made with them.
[[nodiscard]] std::vector<std::string> quotable_secrets(const destination_config& d);

// `text` with every occurrence of each secret replaced by "<redacted>",
// secrets taken in the order given (longest first, so a whole value goes
// before its parts). Secrets shorter than 4 bytes are left alone: replacing
// them would garble every message and they guard nothing.
[[nodiscard]] std::string redact(std::string_view text, const std::vector<std::string>& secrets);

}  // namespace outboxd
