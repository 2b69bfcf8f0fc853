#pragma once
// The outboxd commands; main() only calls run_main().

namespace outboxd::app {

// Parses the command line, runs the command, and returns the exit code
// (exit_codes.hpp). Never throws.
[[nodiscard]] int run_main(int argc, const char* const* argv) noexcept;

}  // namespace outboxd::app
