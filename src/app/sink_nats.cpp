// The NATS JetStream transport: each event is published on the subject its
// topic gives (nats.subject) with the relay's headers as NATS headers and
// Nats-Msg-Id = its webhook-id, and counts as delivered only once JetStream
// acknowledged storing it. The id is stable across attempts and relays, so
// a re-delivery inside the stream's duplicate window is dropped by JetStream
// (effectively once in the stream). Failures report like a webhook's
// (nats/publish_ack.hpp), so retries, circuit and dead letters are the same.

#include <algorithm>
#include <memory>
#include <string>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "app/sink.hpp"
#include "core/webhook_request.hpp"
#include "nats/publisher.hpp"
#include "nats/subject.hpp"

namespace outboxd::app {
namespace {

namespace net = boost::asio;

class nats_sink final : public sink {
public:
    nats_sink(net::io_context& ioc, const destination_config& d)
        : ioc_(ioc),
          subject_template_(d.nats.subject),
          ack_timeout_(d.request_timeout),
          publisher_(ioc, nats::publisher_options{.servers = d.nats.servers,
                                                  .creds_file = d.nats.creds_file,
                                                  .tls = d.tls,
                                                  .connect_timeout = d.connect_timeout,
                                                  .name = fmt::format("outboxd {}", d.name),
                                                  .destination = d.name}) {}

    void send(const event& e, header_list headers, std::chrono::steady_clock::time_point deadline,
              std::function<void(http::response_summary)> done) override {
        auto subject = nats::subject_for(subject_template_, e.topic);
        if (!subject) {
            http::response_summary r;
            r.transport_error = true;
            r.error = fmt::format("topic \"{}\" does not make a valid NATS subject with \"{}\"", e.topic,
                                  subject_template_);
            net::post(ioc_, [done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
            return;
        }
        const auto id = std::find_if(headers.begin(), headers.end(),
                                     [](const auto& h) { return same_header_name(h.first, "webhook-id"); });
        if (id != headers.end()) headers.emplace_back("Nats-Msg-Id", id->second);
        deadline = std::min(deadline, std::chrono::steady_clock::now() + ack_timeout_);
        publisher_.publish(*subject, headers, e.payload, deadline,
                           [done = std::move(done)](nats::publish_result p, std::chrono::microseconds elapsed) {
                               http::response_summary r;
                               r.transport_error = p.transport_error;
                               r.timed_out = p.transport_error && p.error.ends_with("(timed out)");
                               r.status = p.status;
                               r.error = std::move(p.error);
                               r.elapsed = elapsed;
                               done(std::move(r));
                           });
    }

    void close() override { publisher_.close(); }

private:
    net::io_context& ioc_;
    std::string subject_template_;
    std::chrono::milliseconds ack_timeout_;
    nats::publisher publisher_;
};

}  // namespace

std::unique_ptr<sink> make_nats_sink(net::io_context& ioc, const destination_config& d) {
    return std::make_unique<nats_sink>(ioc, d);
}

}  // namespace outboxd::app
