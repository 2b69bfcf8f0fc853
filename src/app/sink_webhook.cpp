#include <fmt/format.h>

#include "app/sink.hpp"

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
                                       .block_private_addresses = block_private_addresses}) {}

    void send(const event& e, header_list headers, std::chrono::steady_clock::time_point deadline,
              std::function<void(http::response_summary)> done) override {
        client_.post(http::outgoing_request{e.payload, std::move(headers), deadline}, std::move(done));
    }

    void close() override { client_.close(); }

private:
    http::webhook_client client_;
};

}  // namespace

std::unique_ptr<sink> make_webhook_sink(boost::asio::io_context& ioc, const destination_config& d,
                                        bool block_private_addresses) {
    return std::make_unique<webhook_sink>(ioc, d, block_private_addresses);
}

}  // namespace outboxd::app
