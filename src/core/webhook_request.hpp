#pragma once
// The HTTP headers of one webhook request, built from a claimed event.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/event.hpp"

namespace outboxd {

// Headers outboxd always sends (webhook-id first; signing relies on it):
//   webhook-id          the event id (stable across retries: consumers de-duplicate on it)
//   webhook-timestamp   unix seconds when this attempt was sent
//   outbox-topic, outbox-attempt, outbox-ordering-key (when the event has one)
// then the event's own headers. Event headers may not override these, nor
// the framing headers (Host, Content-Length, ...). Returns the reason when the
// event's headers cannot be sent (bad name, CR/LF in a value): such an event
// can never succeed and is dead-lettered.
struct request_headers_result {
    header_list headers;
    std::optional<std::string> error;
};

// id_prefix: what the outbox's message ids start with ("msg_<16 hex>_",
// sql/0005): webhook-id is the prefix and the event id, unique across
// outboxes. Empty: the bare event id.
[[nodiscard]] request_headers_result build_request_headers(const event& e, std::int64_t unix_seconds,
                                                           std::string_view id_prefix = {});

// Adds a destination's static headers (operator configuration, e.g. an
// Authorization token) to headers built above: they replace event headers of
// the same name (case-insensitively); protocol and framing headers are never
// replaced (configuration refuses them; skipped here too).
void add_destination_headers(header_list& headers, const header_list& destination_headers);

// The rules above, shared with the static headers of the configuration
// (header names: core/http_token.hpp).
// No CR, LF, NUL or other control character except HTAB.
[[nodiscard]] bool is_header_value(std::string_view value) noexcept;
// ASCII case-insensitive equality: how header names compare.
[[nodiscard]] bool same_header_name(std::string_view a, std::string_view b) noexcept;
// Case-insensitive: the framing and hop-by-hop headers (Host,
// Content-Length, Connection, ...) and every webhook-* and outbox-* name.
[[nodiscard]] bool is_reserved_header(std::string_view name) noexcept;

}  // namespace outboxd
