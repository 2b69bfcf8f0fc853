#include "app/store_worker.hpp"

#include <boost/asio/post.hpp>

#include "core/log.hpp"

namespace outboxd::app {

namespace net = boost::asio;

store_worker::store_worker(pg::store& store)
    : store_(store), guard_(net::make_work_guard(ioc_)), thread_([this] {
          for (;;) {
              try {
                  ioc_.run();
                  return;
              } catch (const std::exception& e) {
                  // Jobs catch their own errors; this is a bug, but the queue must go on.
                  log::error("unhandled error in database worker", {{"error", e.what()}});
              }
          }
      }) {}

store_worker::~store_worker() { stop(); }

void store_worker::submit(std::function<void(pg::store&)> job) {
    net::post(ioc_, [this, job = std::move(job)] { job(store_); });
}

void store_worker::stop() {
    guard_.reset();
    if (thread_.joinable()) thread_.join();
}

}  // namespace outboxd::app
