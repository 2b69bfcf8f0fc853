#pragma once
// Command-line parsing: `outboxd [global options] COMMAND [options]`.
// Global options may also follow the command. Both `--name value` and
// `--name=value` work. Errors throw fatal_error(exit_usage, ...).

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outboxd::app {

struct parsed_args {
    std::string command;  // empty when only --help/--version was given
    std::string subcommand;  // `dead list|replay|purge`
    std::map<std::string, std::vector<std::string>, std::less<>> values;
    bool help = false;
    bool version = false;

    [[nodiscard]] std::optional<std::string> get(std::string_view name) const;
    [[nodiscard]] std::vector<std::string> all(std::string_view name) const;
    [[nodiscard]] bool flag(std::string_view name) const { return values.contains(name); }
};

[[nodiscard]] parsed_args parse_args(int argc, const char* const* argv);

[[nodiscard]] std::string usage_text();

}  // namespace outboxd::app
