#pragma once
// The webhook client's pool of keep-alive connections to one endpoint: a
// FIFO queue of requests, idle connections (owned by the pool) and busy ones
// (owned by their own pending handlers; the pool keeps a raw pointer only to
// abort them), and the endpoint's name lookup. Single-threaded on the
// client's io_context.
//
// Each connection holds a shared_ptr to the pool, so destroying the client
// while requests are on the wire is safe: the pool lives until the last
// handler has run. Idle connections form a cycle with the pool, broken by
// close() (the client's destructor calls it through abort()).

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>

#include "http/client_config.hpp"
#include "http/connection.hpp"

namespace outboxd::http {

// How a lookup thread hands its answer to the loop (see pool::lookup).
struct lookup_channel {
    std::mutex mutex;
    bool open = true;  // false once the client is gone: the answer is dropped
};

class pool : public std::enable_shared_from_this<pool> {
public:
    // Throws as webhook_client's constructor says.
    pool(boost::asio::io_context& ioc, endpoint_url endpoint, client_options options);
    pool(const pool&) = delete;
    pool& operator=(const pool&) = delete;
    ~pool();

    void post(outgoing_request&& request, std::function<void(response_summary)>&& done);
    [[nodiscard]] std::size_t in_flight() const noexcept { return queue_.size() + busy_.size(); }
    void close();
    // close(), then cancel requests on the wire (they fail with "client closed").
    void abort();

    // For connections.
    [[nodiscard]] boost::asio::io_context& ioc() const noexcept { return ioc_; }
    [[nodiscard]] const client_config& config() const noexcept { return config_; }
    [[nodiscard]] boost::asio::ssl::context& tls_context() noexcept { return *tls_context_; }  // https only
    [[nodiscard]] bool aborted() const noexcept { return aborted_; }
    // c's request is over: c goes back to idle if reusable, the next queued
    // request starts, then `done` runs.
    void finished(connection_base& c, bool reusable, std::function<void(response_summary)>&& done,
                  response_summary&& summary);
    void forget(const connection_base* c) noexcept;
    // Looks the endpoint's host up (or joins the lookup in progress); c's
    // on_lookup runs with the answer unless drop_lookup(c) came first.
    void lookup(std::shared_ptr<connection_base> c, std::uint64_t generation);
    void drop_lookup(const connection_base* c) noexcept;

private:
    void on_lookup(resolution&& r);
    void dispatch();
    void fail_later(std::function<void(response_summary)>&& done, clock_type::time_point posted, std::string error);

    boost::asio::io_context& ioc_;
    const client_config config_;
    std::optional<boost::asio::ssl::context> tls_context_;  // set for https endpoints
    std::deque<pending> queue_;
    std::vector<std::shared_ptr<connection_base>> idle_;  // most recently used last
    std::vector<connection_base*> busy_;                  // each owned by its pending handlers
    bool closed_ = false;
    bool aborted_ = false;
    std::shared_ptr<lookup_channel> channel_ = std::make_shared<lookup_channel>();
    bool lookup_running_ = false;
    std::vector<std::pair<std::shared_ptr<connection_base>, std::uint64_t>> lookup_waiters_;
};

}  // namespace outboxd::http
