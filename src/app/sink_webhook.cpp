#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/sink.hpp"
#include "core/redact.hpp"

namespace outboxd::app {
namespace {

class webhook_sink final : public sink {
public:
    webhook_sink(boost::asio::io_context& ioc, const destination_config& d, bool block_private_addresses)
        : client_(ioc, d.url,
                  http::client_options{.max_connections = d.max_concurrency,
                                       .connect_timeout = d.connect_timeout,
                                       .request_timeout = d.request_timeout,
                                       .max_body_excerpt = 1024,
                                       .user_agent = fmt::format("outboxd/{}", OUTBOXD_VERSION),
                                       .tls = d.tls,
                                       .block_private_addresses = block_private_addresses}),
          secrets_(std::make_shared<const std::vector<std::string>>(quotable_secrets(d))) {}

    void send(const event& e, header_list headers, std::chrono::steady_clock::time_point deadline,
              std::function<void(http::response_summary)> done) override {
        if (secrets_->empty()) {
            client_.post(http::outgoing_request{e.payload, std::move(headers), deadline}, std::move(done));
            return;
        }
        // The answer becomes last_error, a dead letter's excerpt and a log
        // line: what the receiver quotes of our credentials is cut out first.
        // (The callback may outlive this sink: it holds the list itself.)
        client_.post(http::outgoing_request{e.payload, std::move(headers), deadline},
                     [secrets = secrets_, done = std::move(done)](http::response_summary r) {
                         r.body_excerpt = redact(r.body_excerpt, *secrets);
                         r.error = redact(r.error, *secrets);
                         done(std::move(r));
                     });
    }

    void close() override { client_.close(); }

private:
    http::webhook_client client_;
    std::shared_ptr<const std::vector<std::string>> secrets_;
};

}  // namespace

std::unique_ptr<sink> make_webhook_sink(boost::asio::io_context& ioc, const destination_config& d,
                                        bool block_private_addresses) {
    return std::make_unique<webhook_sink>(ioc, d, block_private_addresses);
}

}  // namespace outboxd::app
