#pragma once
// A thread of its own for blocking database work (libpqxx calls block), so
// the event loop never waits on PostgreSQL. Jobs run one at a time, in the
// order submitted, on the one store connection; results go back to the event
// loop by whatever the job posts there.

#include <utility>  // before Asio

#include <functional>
#include <optional>
#include <thread>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "pg/store.hpp"

namespace outboxd::app {

class store_worker {
public:
    explicit store_worker(pg::store& store);
    ~store_worker();
    store_worker(const store_worker&) = delete;
    store_worker& operator=(const store_worker&) = delete;

    void submit(std::function<void(pg::store&)> job);
    // Also runs other blocking work (the listener's reconnects).
    [[nodiscard]] boost::asio::any_io_executor executor() { return ioc_.get_executor(); }
    // Runs what is queued, then joins the thread.
    void stop();

private:
    pg::store& store_;
    boost::asio::io_context ioc_;
    std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_;
    std::thread thread_;
};

}  // namespace outboxd::app
