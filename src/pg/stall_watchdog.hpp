#pragma once
// Deadlines for blocking libpq calls. libpq waits for a reply in poll()
// without a timeout, so when the database (or the network path to it) goes
// silent without closing the connection, a call would wait until TCP gives
// up: about 15 minutes with unacknowledged data, never on an idle socket, and
// never at all when something on the path still acknowledges (a proxy or
// load balancer). Server settings (statement_timeout) cannot help: the server
// never sees the query. Only a clock on our side can.
//
// The watchdog is that clock: a call registers its connection's socket and a
// deadline; if the call is still running at the deadline, a thread of the
// watchdog shuts the socket down. libpq then sees the connection end, the
// call fails with pqxx::broken_connection, and its owner reconnects.
//
// The socket is watched through a duplicate of its descriptor, closed when
// the call ends: shutdown() on the duplicate ends the connection's socket,
// and the duplicate can never name an unrelated socket, even if libpq closed
// its own descriptor meanwhile and the number was reused.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <pqxx/connection>
#include <pqxx/except>

namespace outboxd::pg {

class stall_watchdog {
public:
    // One watched call; the watch ends when this is destroyed or finish()ed.
    class watch {
    public:
        watch() = default;
        watch(watch&& other) noexcept;
        watch& operator=(watch&& other) noexcept;
        watch(const watch&) = delete;
        watch& operator=(const watch&) = delete;
        ~watch() { (void)finish(); }

        // Ends the watch; true if the deadline passed and the socket was cut.
        bool finish() noexcept;

    private:
        friend class stall_watchdog;
        watch(stall_watchdog* owner, std::uint64_t id) : owner_(owner), id_(id) {}
        stall_watchdog* owner_ = nullptr;
        std::uint64_t id_ = 0;
    };

    stall_watchdog();
    ~stall_watchdog();
    stall_watchdog(const stall_watchdog&) = delete;
    stall_watchdog& operator=(const stall_watchdog&) = delete;

    // The process's watchdog, started on first use.
    static stall_watchdog& shared();

    // Watches socket `fd` for `limit` from now. A limit of 0 or a negative fd
    // watches nothing.
    [[nodiscard]] watch start(int fd, std::chrono::milliseconds limit);

private:
    struct entry {
        int fd = -1;  // our duplicate
        std::chrono::steady_clock::time_point deadline;
        bool fired = false;
    };
    bool end(std::uint64_t id) noexcept;
    void run();

    std::mutex mutex_;
    std::condition_variable wake_;
    std::map<std::uint64_t, entry> entries_;
    std::uint64_t next_id_ = 1;
    // What the thread sleeps until: a new watch only wakes it when earlier.
    std::chrono::steady_clock::time_point sleeping_until_ = std::chrono::steady_clock::time_point::max();
    bool stopping_ = false;
    std::thread thread_;
};

// Runs f(c) with the process's watchdog watching c for `limit` (0: not at
// all). A call it cut fails with a broken_connection that says why, instead of
// libpq's "server closed the connection unexpectedly".
template <typename F>
auto with_deadline(pqxx::connection& c, std::chrono::milliseconds limit, F&& f) {
    auto watch = stall_watchdog::shared().start(c.sock(), limit);
    try {
        return f(c);
    } catch (const pqxx::broken_connection&) {
        if (watch.finish()) {
            throw pqxx::broken_connection(fmt::format(
                "no answer from the database within {} ms; connection dropped (network partition, failover or a "
                "stalled server)",
                limit.count()));
        }
        throw;
    }
}

}  // namespace outboxd::pg
