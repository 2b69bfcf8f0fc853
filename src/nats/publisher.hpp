#pragma once
// Publishes to JetStream over one NATS connection (the C client, libnats)
// and reports each publish acknowledgement on the io_context.
//
// Why not js_PublishMsgAsync: every publish here gets its own reply subject
// (<inbox>.<n>), so an acknowledgement is matched to exactly the attempt that
// asked for it — a late ack for an attempt already given up can never be
// taken for a newer one — and the wait is bounded by the attempt's deadline
// on the io_context, whatever the client does with its connection
// meanwhile. The acknowledgement itself is JetStream's (publish_ack.hpp).
//
// Threads: the C client calls back on its own threads; those callbacks only
// copy what they need and post it to the io_context. Everything else, and
// every `done`, runs on the io_context.

#include <utility>  // before Asio

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "core/event.hpp"
#include "core/tls_settings.hpp"
#include "nats/publish_ack.hpp"

namespace outboxd::nats {

struct publisher_options {
    std::string servers;                     // comma-separated nats:// or tls:// URLs
    std::optional<std::string> creds_file;   // user JWT + NKey seed
    tls_settings tls;
    std::chrono::milliseconds connect_timeout{5'000};
    std::string name;                        // the connection's name, shown by the server
    std::string destination;                 // for log records
};

class publisher {
public:
    // Starts connecting (in the background: a server that is down now is
    // retried for ever, and publishes fail fast meanwhile). Throws
    // std::invalid_argument for options the client refuses (a creds or CA
    // file it cannot load), without any credential in the message.
    publisher(boost::asio::io_context& ioc, publisher_options options);
    ~publisher();
    publisher(const publisher&) = delete;
    publisher& operator=(const publisher&) = delete;

    // Publishes `payload` on `subject` with `headers` and waits for
    // JetStream's acknowledgement until `deadline`: `done` runs once, on the
    // io_context, never from inside publish(). Not connected, a refused
    // publish or no acknowledgement by the deadline: a transport error.
    void publish(const std::string& subject, const header_list& headers, const std::string& payload,
                 std::chrono::steady_clock::time_point deadline,
                 std::function<void(publish_result, std::chrono::microseconds elapsed)> done);

    // Fails what waits for an acknowledgement and closes the connection;
    // later publishes fail at once.
    void close();

    struct core;
    struct link;

private:
    std::shared_ptr<core> core_;
    link* link_ = nullptr;
};

}  // namespace outboxd::nats
