#pragma once
// The default resolver_function of the webhook client: getaddrinfo, as
// Asio's resolver calls it. It blocks; the pool runs it on a thread of its
// own (see http/pool.hpp).

#include <string>

#include "http/webhook_client.hpp"

namespace outboxd::http {

[[nodiscard]] resolution system_lookup(const std::string& host, const std::string& port);

}  // namespace outboxd::http
