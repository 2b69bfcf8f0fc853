// HTTP/1.1 webhook client: a bounded pool of keep-alive connections to one
// endpoint, plain or TLS, on Boost.Beast, single-threaded on the caller's
// io_context.
//
// Shape, one file per part:
//   webhook_client ── impl (= pool, pool.hpp) ── FIFO queue of pending requests
//                                             ├─ idle connections (owned by the pool)
//                                             └─ busy connections (connection.hpp,
//                                                owned by their own pending handlers)
//   client_config.hpp        the endpoint, checked and computed once
//   tls_context.hpp          the trust store, session setup, OpenSSL's error wording
//   egress_guard.hpp         block_private_addresses
//   name_lookup.hpp          getaddrinfo, run by the pool on a thread of its own
//   response_limits.hpp,
//   excerpt_body.hpp         how much of a response is read and kept
//   failure_description.hpp  the one-line error of a failed attempt (pure)
//
// A request's life: post() → queue → dispatch() hands it to an idle
// connection (most recently used first; a cheap non-blocking peek drops ones
// the server has closed) or opens a new one while fewer than max_connections
// exist → [resolve → egress check → connect → TLS handshake] → write → read
// → finished(): the connection goes back to idle (or is closed), the next
// queued request is started, then `done` runs.

#include "http/webhook_client.hpp"

#include "http/pool.hpp"

namespace outboxd::http {

struct webhook_client::impl final : pool {
    using pool::pool;
};

webhook_client::webhook_client(boost::asio::io_context& ioc, endpoint_url endpoint, client_options options)
    : impl_(std::make_shared<impl>(ioc, std::move(endpoint), std::move(options))) {}

webhook_client::~webhook_client() {
    if (impl_) impl_->abort();
}

void webhook_client::post(outgoing_request request, std::function<void(response_summary)> done) {
    impl_->post(std::move(request), std::move(done));
}

std::size_t webhook_client::in_flight() const noexcept { return impl_->in_flight(); }

void webhook_client::close() { impl_->close(); }

}  // namespace outboxd::http
