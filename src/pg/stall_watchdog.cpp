#include "pg/stall_watchdog.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace outboxd::pg {

using clock = std::chrono::steady_clock;

stall_watchdog::watch::watch(watch&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}

stall_watchdog::watch& stall_watchdog::watch::operator=(watch&& other) noexcept {
    if (this != &other) {
        (void)finish();
        owner_ = std::exchange(other.owner_, nullptr);
        id_ = other.id_;
    }
    return *this;
}

bool stall_watchdog::watch::finish() noexcept {
    auto* owner = std::exchange(owner_, nullptr);
    return owner != nullptr && owner->end(id_);
}

stall_watchdog::stall_watchdog() : thread_([this] { run(); }) {}

stall_watchdog::~stall_watchdog() {
    {
        const std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
    for (const auto& [id, e] : entries_) ::close(e.fd);
}

stall_watchdog& stall_watchdog::shared() {
    static stall_watchdog instance;
    return instance;
}

stall_watchdog::watch stall_watchdog::start(int fd, std::chrono::milliseconds limit) {
    if (fd < 0 || limit.count() <= 0) return {};
    const int copy = ::dup(fd);
    if (copy < 0) return {};  // out of descriptors: the call runs unwatched
    const auto deadline = clock::now() + limit;
    bool earliest = false;
    std::uint64_t id = 0;
    {
        const std::lock_guard lock(mutex_);
        id = next_id_++;
        entries_.emplace(id, entry{copy, deadline, false});
        earliest = deadline < sleeping_until_;
    }
    if (earliest) wake_.notify_one();
    return watch(this, id);
}

bool stall_watchdog::end(std::uint64_t id) noexcept {
    entry e;
    {
        const std::lock_guard lock(mutex_);
        const auto it = entries_.find(id);
        if (it == entries_.end()) return false;
        e = it->second;
        entries_.erase(it);
    }
    ::close(e.fd);
    return e.fired;
}

void stall_watchdog::run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
        const auto now = clock::now();
        auto next = clock::time_point::max();
        for (auto& [id, e] : entries_) {
            if (e.fired) continue;
            if (e.deadline <= now) {
                // The call blocked in libpq wakes up to a closed connection.
                ::shutdown(e.fd, SHUT_RDWR);
                e.fired = true;
            } else if (e.deadline < next) {
                next = e.deadline;
            }
        }
        sleeping_until_ = next;
        if (next == clock::time_point::max()) {
            wake_.wait(lock);
        } else {
            wake_.wait_until(lock, next);
        }
    }
}

}  // namespace outboxd::pg
