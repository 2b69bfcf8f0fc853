#include "nats/publisher.hpp"

#include <charconv>
#include <fstream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <nats/nats.h>

#include "core/log.hpp"
#include "nats/subject.hpp"

namespace outboxd::nats {

namespace net = boost::asio;
using clock = std::chrono::steady_clock;

// The io_context side: the publishes waiting for their acknowledgement.
struct publisher::core : std::enable_shared_from_this<publisher::core> {
    struct waiting {
        std::string subject;
        clock::time_point started;
        clock::time_point deadline;
        std::function<void(publish_result, std::chrono::microseconds)> done;
    };

    explicit core(net::io_context& ioc) : ioc(ioc), timer(ioc) {}

    void add(std::uint64_t id, waiting w) {
        const bool earliest = deadlines.empty() || w.deadline < deadlines.begin()->first;
        deadlines.emplace(w.deadline, id);
        waits.emplace(id, std::move(w));
        if (earliest) arm();
    }

    // The acknowledgement (or no-responders answer) to publish `id` arrived.
    void answered(std::uint64_t id, const std::string& reply, bool no_responders) {
        const auto it = waits.find(id);
        if (it == waits.end()) return;  // given up already: its retry is de-duplicated by Nats-Msg-Id
        auto result = judge_publish_ack(reply, no_responders, it->second.subject);
        finish(it, std::move(result));
    }

    void finish(std::unordered_map<std::uint64_t, waiting>::iterator it, publish_result r) {
        const auto id = it->first;
        auto w = std::move(it->second);
        waits.erase(it);
        deadlines.erase({w.deadline, id});
        const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - w.started);
        w.done(std::move(r), elapsed);
    }

    void arm() {
        if (deadlines.empty()) {
            timer.cancel();
            return;
        }
        timer.expires_at(deadlines.begin()->first);
        timer.async_wait([self = weak_from_this()](const boost::system::error_code& ec) {
            if (auto s = self.lock(); s && !ec) s->expire();
        });
    }

    void expire() {
        const auto now = clock::now();
        while (!deadlines.empty() && deadlines.begin()->first <= now) {
            const auto id = deadlines.begin()->second;
            const auto it = waits.find(id);
            const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.started);
            publish_result r;
            r.transport_error = true;
            r.error = fmt::format("no JetStream acknowledgement within {}ms (timed out)", waited.count());
            finish(it, std::move(r));
        }
        arm();
    }

    // Each `done` runs later, on the io_context, not inside the caller.
    void fail_all(const std::string& why) {
        for (auto& [id, w] : waits) {
            publish_result r;
            r.transport_error = true;
            r.error = why;
            const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - w.started);
            net::post(ioc, [done = std::move(w.done), r = std::move(r), elapsed]() mutable { done(std::move(r), elapsed); });
        }
        waits.clear();
        deadlines.clear();
        timer.cancel();
    }

    net::io_context& ioc;
    net::steady_timer timer;
    std::unordered_map<std::uint64_t, waiting> waits;
    std::set<std::pair<clock::time_point, std::uint64_t>> deadlines;
    std::uint64_t next_id = 1;
    bool closed = false;
};

// The C client's side. Its callbacks may run on its threads until the
// library is done with the connection, even after close() returned, so the
// link is never freed (one per destination, for the process's life); once
// `open` is false under the mutex, it posts nothing more to the io_context.
struct publisher::link {
    struct answer {
        std::uint64_t id;
        std::string reply;
        bool no_responders;
    };
    std::mutex mutex;
    bool open = true;
    // Answers not yet taken by the io_context: one post carries all that
    // arrive meanwhile, so a busy relay wakes once per batch, not per ack.
    std::vector<answer> answers;
    bool drain_posted = false;
    net::io_context* ioc = nullptr;
    std::weak_ptr<publisher::core> core;
    std::string destination;
    // Two connections to the same servers. `prompt` writes each message at
    // once (a lone event's ack is not delayed); `bulk` leaves writing to the
    // client's flusher, which gathers what is published within a
    // millisecond into one write, so a draining backlog costs the server,
    // the client and the relay a few wake-ups per batch instead of per
    // event. Order is unaffected: the relay publishes an event of a key only
    // after the previous one was acknowledged.
    struct lane {
        std::string inbox;  // replies arrive on <inbox>.<publish id>
        natsConnection* connection = nullptr;
        natsSubscription* replies = nullptr;
    };
    lane prompt;
    lane bulk;
};

namespace {

std::string status_text(natsStatus s) { return natsStatus_GetText(s); }

void check(natsStatus s, std::string_view what) {
    if (s != NATS_OK) throw std::invalid_argument(fmt::format("{}: {}", what, status_text(s)));
}

void on_reply(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    auto* l = static_cast<publisher::link*>(closure);
    const std::string_view subject = natsMsg_GetSubject(msg);
    std::uint64_t id = 0;
    const auto token = subject.substr(subject.rfind('.') + 1);
    const auto parsed = std::from_chars(token.data(), token.data() + token.size(), id);
    const bool no_responders = natsMsg_IsNoResponders(msg);
    std::string reply(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
    natsMsg_Destroy(msg);
    if (parsed.ec != std::errc{}) return;
    const std::lock_guard lock(l->mutex);
    if (!l->open) return;
    l->answers.push_back({id, std::move(reply), no_responders});
    if (l->drain_posted) return;
    l->drain_posted = true;
    net::post(*l->ioc, [l, core = l->core] {
        std::vector<publisher::link::answer> batch;
        {
            const std::lock_guard lock(l->mutex);
            batch.swap(l->answers);
            l->drain_posted = false;
        }
        if (auto c = core.lock()) {
            for (const auto& a : batch) c->answered(a.id, a.reply, a.no_responders);
        }
    });
}

std::string connected_url(natsConnection* nc) {
    char url[512] = {};
    if (natsConnection_GetConnectedUrl(nc, url, sizeof url) != NATS_OK) return "?";
    return loggable_servers(url);
}

void on_disconnected(natsConnection*, void* closure) {
    auto* l = static_cast<publisher::link*>(closure);
    {
        const std::lock_guard lock(l->mutex);
        if (!l->open) return;  // our own close()
    }
    log::warn("NATS connection lost; reconnecting (publishes fail until it is back)", {{"destination", l->destination}});
}

void on_reconnected(natsConnection* nc, void* closure) {
    const auto* l = static_cast<publisher::link*>(closure);
    log::info("NATS connected", {{"destination", l->destination}, {"server", connected_url(nc)}});
}

void on_async_error(natsConnection*, natsSubscription*, natsStatus err, void* closure) {
    const auto* l = static_cast<publisher::link*>(closure);
    log::warn("NATS client error", {{"destination", l->destination}, {"error", status_text(err)}});
}

struct options_guard {
    natsOptions* o = nullptr;
    ~options_guard() { natsOptions_Destroy(o); }
};

}  // namespace

publisher::publisher(net::io_context& ioc, publisher_options options) : core_(std::make_shared<core>(ioc)) {
    // The client's locks spin by default before they sleep: on a machine
    // whose cores are shared with the database that only burns CPU.
    static const natsStatus opened = nats_Open(0);
    (void)opened;
    auto* l = new link;  // never freed: see link
    l->ioc = &ioc;
    l->core = core_;
    l->destination = options.destination;

    options_guard opts;
    check(natsOptions_Create(&opts.o), "NATS options");
    const auto servers = parse_servers(options.servers);
    std::vector<const char*> urls;
    bool tls = false;
    for (const auto& s : servers) {
        urls.push_back(s.c_str());
        tls = tls || s.starts_with("tls://");
    }
    check(natsOptions_SetServers(opts.o, urls.data(), static_cast<int>(urls.size())), "NATS servers");
    check(natsOptions_SetName(opts.o, options.name.c_str()), "NATS connection name");
    check(natsOptions_SetTimeout(opts.o, options.connect_timeout.count()), "NATS connect timeout");
    // A server that goes away is retried for ever: the outbox keeps the
    // events meanwhile, and the circuit breaker paces the attempts.
    check(natsOptions_SetMaxReconnect(opts.o, -1), "NATS reconnects");
    check(natsOptions_SetReconnectWait(opts.o, 250), "NATS reconnect wait");
    check(natsOptions_SetDisconnectedCB(opts.o, on_disconnected, l), "NATS callbacks");
    check(natsOptions_SetReconnectedCB(opts.o, on_reconnected, l), "NATS callbacks");
    check(natsOptions_SetErrorHandler(opts.o, on_async_error, l), "NATS callbacks");
    if (options.creds_file) {
        // The client reads it only when it connects: a wrong path would
        // otherwise show up as a server that refuses us, later.
        if (!std::ifstream(*options.creds_file)) {
            throw std::invalid_argument(fmt::format("NATS credentials file {}: cannot be read", *options.creds_file));
        }
        check(natsOptions_SetUserCredentialsFromFiles(opts.o, options.creds_file->c_str(), nullptr),
              fmt::format("NATS credentials file {}", *options.creds_file));
    }
    if (tls || options.tls.ca_file) {
        check(natsOptions_SetSecure(opts.o, true), "NATS TLS");
        if (options.tls.ca_file) {
            check(natsOptions_LoadCATrustedCertificates(opts.o, options.tls.ca_file->c_str()),
                  fmt::format("NATS CA file {}", *options.tls.ca_file));
        }
        if (!options.tls.verify) check(natsOptions_SkipServerVerification(opts.o, true), "NATS TLS");
    }

    // One attempt now, so the first claims find the connection up; if no
    // server answers, the client keeps trying in the background (publishes
    // fail fast meanwhile) and the relay starts anyway, as it does when a
    // webhook endpoint is down.
    bool retrying = false;
    for (auto* lane : {&l->prompt, &l->bulk}) {
        natsInbox* inbox = nullptr;
        check(natsInbox_Create(&inbox), "NATS inbox");
        lane->inbox = reinterpret_cast<const char*>(inbox);
        natsInbox_Destroy(inbox);
        check(natsOptions_SetSendAsap(opts.o, lane == &l->prompt), "NATS send mode");
        auto s = natsConnection_Connect(&lane->connection, opts.o);
        if (!retrying && (s == NATS_NO_SERVER || s == NATS_TIMEOUT)) {
            log::warn("no NATS server reachable yet; connecting in the background",
                      {{"destination", l->destination}, {"servers", loggable_servers(options.servers)}});
            check(natsOptions_SetRetryOnFailedConnect(opts.o, true, on_reconnected, l), "NATS connect retry");
            retrying = true;
            s = natsConnection_Connect(&lane->connection, opts.o);
        }
        if (s != NATS_OK && s != NATS_NOT_YET_CONNECTED) check(s, "NATS connect");
        check(natsConnection_Subscribe(&lane->replies, lane->connection, (lane->inbox + ".*").c_str(), on_reply, l),
              "NATS reply subscription");
        // The relay bounds what is in flight (max_concurrency); the client
        // must never drop an acknowledgement as a slow consumer before that.
        (void)natsSubscription_SetPendingLimits(lane->replies, -1, -1);
    }
    link_ = l;
}

publisher::~publisher() { close(); }

void publisher::publish(const std::string& subject, const header_list& headers, const std::string& payload,
                        clock::time_point deadline,
                        std::function<void(publish_result, std::chrono::microseconds)> done) {
    const auto started = clock::now();
    const auto fail_soon = [&](publish_result r) {
        net::post(core_->ioc, [done = std::move(done), r = std::move(r), started]() mutable {
            done(std::move(r), std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - started));
        });
    };
    const auto transport_failure = [](std::string why) {
        publish_result r;
        r.transport_error = true;
        r.error = std::move(why);
        return r;
    };
    if (core_->closed) return fail_soon(transport_failure("NATS publisher closed"));
    // A few acknowledgements outstanding: a lone event, sent at once. More:
    // a burst, gathered by the client into few writes.
    constexpr std::size_t prompt_limit = 4;
    const auto connected = [](const link::lane& lane) {
        return natsConnection_Status(lane.connection) == NATS_CONN_STATUS_CONNECTED;
    };
    const auto* lane = core_->waits.size() < prompt_limit ? &link_->prompt : &link_->bulk;
    if (!connected(*lane)) lane = lane == &link_->prompt ? &link_->bulk : &link_->prompt;
    if (!connected(*lane)) return fail_soon(transport_failure("not connected to NATS"));
    const auto id = core_->next_id++;
    const auto reply = fmt::format("{}.{}", lane->inbox, id);
    natsMsg* msg = nullptr;
    auto s = natsMsg_Create(&msg, subject.c_str(), reply.c_str(), payload.data(), static_cast<int>(payload.size()));
    for (const auto& [name, value] : headers) {
        if (s != NATS_OK) break;
        s = natsMsgHeader_Set(msg, name.c_str(), value.c_str());
    }
    // Registered before the message leaves: its answer may come back on
    // another thread before PublishMsg returns (it is posted, so runs later).
    if (s == NATS_OK) core_->add(id, {subject, started, deadline, std::move(done)});
    if (s == NATS_OK) s = natsConnection_PublishMsg(lane->connection, msg);
    natsMsg_Destroy(msg);
    if (s == NATS_OK) return;
    const auto it = core_->waits.find(id);
    if (it != core_->waits.end()) {
        done = std::move(it->second.done);
        core_->deadlines.erase({it->second.deadline, id});
        core_->waits.erase(it);
    }
    if (s == NATS_MAX_PAYLOAD) {
        publish_result r;
        r.status = 413;
        r.error = fmt::format("the event ({} bytes) is larger than the NATS server's max_payload", payload.size());
        return fail_soon(std::move(r));
    }
    fail_soon(transport_failure(fmt::format("NATS publish failed: {}", status_text(s))));
}

void publisher::close() {
    if (core_->closed) return;
    core_->closed = true;
    {
        const std::lock_guard lock(link_->mutex);
        link_->open = false;
    }
    // Their leases are released: they are claimed again, and JetStream drops
    // any that did get stored (same Nats-Msg-Id).
    core_->fail_all("NATS publisher closed before the acknowledgement");
    for (auto* lane : {&link_->prompt, &link_->bulk}) {
        natsSubscription_Unsubscribe(lane->replies);
        natsConnection_Close(lane->connection);
        natsSubscription_Destroy(lane->replies);
        natsConnection_Destroy(lane->connection);
    }
}

}  // namespace outboxd::nats
