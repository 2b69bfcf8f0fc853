// outboxd: see README.md. All the work happens in app/commands.cpp.
#include "app/commands.hpp"

int main(int argc, char** argv) { return outboxd::app::run_main(argc, argv); }
