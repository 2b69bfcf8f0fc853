#include "app/cli.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "app/exit_codes.hpp"

namespace outboxd::app {
namespace {

struct option_spec {
    std::string_view name;
    std::string_view command;  // "" = global
    bool repeatable = false;
};

// Every option takes a value except --help and --version.
constexpr std::array<option_spec, 19> known_options{{
    {"database-url", ""},
    {"schema", ""},
    {"log-level", ""},
    {"topic", "enqueue"},
    {"payload", "enqueue"},
    {"key", "enqueue"},
    {"idempotency-key", "enqueue"},
    {"header", "enqueue", true},
    {"delay", "enqueue"},
    {"url", "run"},
    {"concurrency", "run"},
    {"lease", "run"},
    {"sweep-interval", "run"},
    {"request-timeout", "run"},
    {"connect-timeout", "run"},
    {"retry-base", "run"},
    {"retry-cap", "run"},
    {"max-attempts", "run"},
    {"shutdown-timeout", "run"},
}};

constexpr std::array<std::string_view, 4> commands{"migrate", "sql", "enqueue", "run"};

[[noreturn]] void usage_error(const std::string& message) {
    throw fatal_error(exit_usage, fmt::format("{} (see `outboxd --help`)", message));
}

}  // namespace

std::optional<std::string> parsed_args::get(std::string_view name) const {
    const auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return std::nullopt;
    return it->second.back();
}

std::vector<std::string> parsed_args::all(std::string_view name) const {
    const auto it = values.find(name);
    return it == values.end() ? std::vector<std::string>{} : it->second;
}

parsed_args parse_args(int argc, const char* const* argv) {
    parsed_args out;
    std::vector<std::pair<std::string, std::string>> given;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            out.help = true;
        } else if (arg == "--version") {
            out.version = true;
        } else if (arg.starts_with("--")) {
            auto name = std::string(arg.substr(2));
            std::string value;
            if (const auto eq = name.find('='); eq != std::string::npos) {
                value = name.substr(eq + 1);
                name.resize(eq);
            } else {
                if (i + 1 >= argc) usage_error(fmt::format("option --{} needs a value", name));
                value = argv[++i];
            }
            given.emplace_back(std::move(name), std::move(value));
        } else if (out.command.empty()) {
            if (std::find(commands.begin(), commands.end(), arg) == commands.end()) {
                usage_error(fmt::format("unknown command '{}'", arg));
            }
            out.command = arg;
        } else {
            usage_error(fmt::format("unexpected argument '{}'", arg));
        }
    }
    for (auto& [name, value] : given) {
        const auto spec = std::find_if(known_options.begin(), known_options.end(),
                                       [&](const option_spec& s) { return s.name == name; });
        if (spec == known_options.end()) usage_error(fmt::format("unknown option --{}", name));
        if (!spec->command.empty() && spec->command != out.command) {
            usage_error(fmt::format("option --{} belongs to `outboxd {}`", name, spec->command));
        }
        auto& slot = out.values[name];
        if (!slot.empty() && !spec->repeatable) usage_error(fmt::format("option --{} given twice", name));
        slot.push_back(std::move(value));
    }
    return out;
}

std::string usage_text() {
    return R"(outboxd — transactional-outbox relay for PostgreSQL

Usage: outboxd [global options] COMMAND [options]

Commands:
  migrate     install or upgrade the outbox in --schema (safe to run concurrently)
  sql         print the migrations for --schema as plain SQL (for your own migration tool)
  enqueue     add one event: --topic T [--payload JSON] [--key K] [--idempotency-key I]
              [--header NAME=VALUE]... [--delay DURATION]; prints the event id.
              Without --payload the payload is read from standard input.
  run         deliver events to a webhook until SIGINT/SIGTERM

Global options (also as environment variables):
  --database-url URL   DATABASE_URL       libpq URI or key=value string
  --schema NAME        OUTBOXD_SCHEMA     default: outbox
  --log-level LEVEL    OUTBOXD_LOG_LEVEL  debug|info|warn|error, default: info
  --help, --version

`outboxd run` options (DURATION is a whole number with ms, s, m or h):
  --url URL                 OUTBOXD_WEBHOOK_URL; http:// (https:// comes with issue #4)
  --concurrency N           deliveries in flight at most, default 32 (1..1024)
  --lease DURATION          how long a claimed event is ours, default 30s; must exceed
                            connect-timeout + request-timeout
  --sweep-interval DURATION periodic re-check for missed wake-ups, default 30s
  --connect-timeout DURATION  default 5s
  --request-timeout DURATION  default 10s
  --retry-base DURATION     first retry delay, doubling per attempt, default 5s
  --retry-cap DURATION      longest retry delay, default 6h
  --max-attempts N          attempts before dead letters, default 20
  --shutdown-timeout DURATION  wait for in-flight deliveries on SIGTERM, default 10s

Exit codes:
  0 ok (also after a graceful shutdown)   1 internal error
  2 usage or configuration error          3 database unavailable
  4 outbox not installed or older than this binary (run `outboxd migrate`)
  5 outbox schema newer than this binary  6 invalid input data
  130 a second SIGINT/SIGTERM cut the graceful shutdown short
)";
}

}  // namespace outboxd::app
