#include "pg/stall_watchdog.hpp"

#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

using outboxd::pg::stall_watchdog;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// Two connected sockets; the peer (second) stays silent unless told.
struct socket_pair {
    int fds[2] = {-1, -1};
    socket_pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
    ~socket_pair() {
        for (const int fd : fds) {
            if (fd >= 0) ::close(fd);
        }
    }
    [[nodiscard]] int ours() const { return fds[0]; }
    [[nodiscard]] int peer() const { return fds[1]; }
};

// True when `fd` still carries a byte both ways to `peer`.
bool still_works(int fd, int peer) {
    char c = 'x';
    if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) return false;
    if (::recv(peer, &c, 1, 0) != 1) return false;
    if (::send(peer, &c, 1, MSG_NOSIGNAL) != 1) return false;
    return ::recv(fd, &c, 1, 0) == 1;
}

}  // namespace

TEST_CASE("stall_watchdog: a call waiting on a silent peer is woken at its deadline") {
    stall_watchdog dog;
    socket_pair p;
    const auto started = clock_type::now();
    auto watch = dog.start(p.ours(), 200ms);
    // What libpq does while it waits for a reply: a blocking read.
    auto reader = std::async(std::launch::async, [fd = p.ours()] {
        char buf[16];
        return ::recv(fd, buf, sizeof buf, 0);
    });
    REQUIRE(reader.wait_for(10s) == std::future_status::ready);
    const auto waited = clock_type::now() - started;
    CHECK(reader.get() == 0);  // the connection ended, as if the peer had closed it
    CHECK(watch.finish());
    CHECK(waited >= 200ms);
    CHECK(waited < 5s);
}

TEST_CASE("stall_watchdog: a call answered in time leaves its connection alone") {
    stall_watchdog dog;
    socket_pair p;
    {
        auto watch = dog.start(p.ours(), 100ms);
        CHECK(still_works(p.ours(), p.peer()));
        CHECK_FALSE(watch.finish());
    }
    // Later watches keep the thread busy past the first deadline.
    auto later = dog.start(p.peer(), 400ms);
    std::this_thread::sleep_for(250ms);  // makes the first deadline pass (not a synchronisation)
    CHECK(still_works(p.ours(), p.peer()));
    CHECK_FALSE(later.finish());
}

TEST_CASE("stall_watchdog: no limit or no socket watches nothing") {
    stall_watchdog dog;
    socket_pair p;
    auto none = dog.start(p.ours(), 0ms);
    auto closed = dog.start(-1, 1ms);
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(none.finish());
    CHECK_FALSE(closed.finish());
    CHECK(still_works(p.ours(), p.peer()));
}

TEST_CASE("stall_watchdog: cutting a socket whose descriptor was closed and reused spares the new socket") {
    stall_watchdog dog;
    socket_pair old_pair;
    auto watch = dog.start(old_pair.ours(), 100ms);
    // libpq drops its descriptor on an error, and the number goes to the next socket made.
    ::close(old_pair.fds[0]);
    const int reused = old_pair.fds[0];
    old_pair.fds[0] = -1;
    socket_pair next;
    CHECK(next.ours() == reused);
    // The deadline passes: the watchdog cut the old socket (its peer sees it end) ...
    char c = 0;
    CHECK(::recv(old_pair.peer(), &c, 1, 0) == 0);
    CHECK(watch.finish());
    // ... and the socket that now has the old number is untouched.
    CHECK(still_works(next.ours(), next.peer()));
}
