#pragma once
// How much of a response the webhook client reads at most. A receiver is
// untrusted: every byte it can make us read or keep is bounded here.

#include <cstddef>
#include <cstdint>

namespace outboxd::http {

// Bytes read for one request's response at most, everything included
// (status lines and headers of interim and final responses, chunk-size
// lines and their extensions, trailers, body). Past it the attempt fails as
// a transport error ("response ... too large"). The body itself is read up
// to max_response_body (only max_body_excerpt of it kept), which reports
// the status.
inline constexpr std::size_t max_response_bytes = 4 * 1024 * 1024;

// A response body is read up to this many bytes, then reading stops: only
// the first max_body_excerpt bytes are kept anyway, and a webhook receiver
// has no business sending megabytes. The status line and the excerpt are
// known by then, so the status is still reported (not a transport error);
// the connection is closed because the rest of the body is unread.
inline constexpr std::uint64_t max_response_body = 1024 * 1024;

// Beast's default (8 KiB) rejects some real-world responses (long CSP or
// cookie headers); 64 KiB is still a small bound.
inline constexpr std::uint32_t max_response_header = 64 * 1024;

// Bytes read but not yet parsed at most. Beast 1.74 parses a chunk-size
// line (with its extensions) and the trailers only once they are whole, and
// limits neither: without a bound on the read buffer a receiver could grow
// it for ever. A head must fit, hence the header limit plus a read's slack.
inline constexpr std::size_t max_unparsed = max_response_header + 16 * 1024;

}  // namespace outboxd::http
