#pragma once
// The head of a webhook POST (request line and header fields), built in one
// pass as one string and written together with the body in one gathered
// write: Beast's serializer walks a chain of small buffers per field, on
// every request (bench/NOTES.md, "HTTP client"). Pure: no I/O.

#include <string>
#include <string_view>

#include "core/event.hpp"

namespace outboxd::http {

struct request_target {
    std::string_view target;       // origin-form: /path?query
    std::string_view host_header;  // host, or host:port when not the default
    std::string_view user_agent;   // our default; a caller's User-Agent replaces it
};

// Header names and values must already be valid (HTTP tokens; values without
// CR, LF or NUL): the relay checks event headers and the configuration
// checks destination headers. Fields that frame the message or manage the
// connection (Host, Content-Length, Transfer-Encoding, Connection, ...) are
// ours alone: a caller's are dropped. A caller's Content-Type and User-Agent
// replace our defaults (the last one given wins); other fields are sent in
// the order given.
[[nodiscard]] std::string request_head(const request_target& to, const header_list& headers,
                                       std::size_t body_size);

}  // namespace outboxd::http
