// outboxd: see README.md. All the work happens in app/commands.cpp.
#include <csignal>

#include "app/commands.hpp"

int main(int argc, char** argv) {
    // A closed pipe is an error to report (the stdout transport retries),
    // not a reason to die.
    std::signal(SIGPIPE, SIG_IGN);
    return outboxd::app::run_main(argc, argv);
}
