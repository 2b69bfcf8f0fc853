#include "app/cli.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

#include "app/exit_codes.hpp"
#include "core/config.hpp"

namespace outboxd::app {
namespace {

struct option_spec {
    std::string_view name;
    std::string_view commands;  // space-separated commands it belongs to; "" = global
    bool repeatable = false;
    bool takes_value = true;
};

// The commands' own options; the configuration's come from its settings table.
constexpr std::array<option_spec, 17> command_options{{
    {"config", ""},
    {"topic", "enqueue dead"},
    {"payload", "enqueue"},
    {"key", "enqueue"},
    {"idempotency-key", "enqueue"},
    {"header", "enqueue", true},
    {"delay", "enqueue"},
    {"older-than", "dead"},
    {"limit", "dead"},
    {"id", "dead"},
    {"json", "dead status", false, false},
    {"all", "dead", false, false},
    {"dry-run", "dead", false, false},
    {"once", "run", false, false},
    {"watch", "status", false, false},
    {"interval", "status"},
    {"print", "wake-setup consume-setup", false, false},
}};

const std::vector<option_spec>& known_options() {
    static const std::vector<option_spec> all = [] {
        std::vector<option_spec> out(command_options.begin(), command_options.end());
        for (const auto& f : config_flags()) {
            out.push_back({f.name, f.every_command ? "" : "run check-config", f.repeatable, f.takes_value});
        }
        return out;
    }();
    return all;
}

constexpr std::array<std::string_view, 11> commands{"migrate", "sql",          "enqueue",    "run",
                                                    "check-config", "dead", "status", "wake-trigger",
                                                    "wake-setup", "consume-setup", "cursor"};
constexpr std::array<std::string_view, 4> wake_setup_modes{"auto", "notify", "poll", "wal"};
constexpr std::array<std::string_view, 2> consume_setup_modes{"claims", "windows"};
constexpr std::array<std::string_view, 3> dead_subcommands{"list", "replay", "purge"};

bool belongs_to(const option_spec& spec, std::string_view command) {
    if (spec.commands.empty()) return true;
    std::string_view rest = spec.commands;
    while (!rest.empty()) {
        const auto space = rest.find(' ');
        if (rest.substr(0, space) == command) return true;
        if (space == std::string_view::npos) break;
        rest.remove_prefix(space + 1);
    }
    return false;
}

const option_spec* find_option(std::string_view name) {
    const auto& options = known_options();
    const auto it = std::find_if(options.begin(), options.end(), [&](const option_spec& s) { return s.name == name; });
    return it == options.end() ? nullptr : &*it;
}

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
            const auto eq = name.find('=');
            if (eq != std::string::npos) {
                value = name.substr(eq + 1);
                name.resize(eq);
            }
            const auto* spec = find_option(name);
            if (spec == nullptr) usage_error(fmt::format("unknown option --{}", name));
            if (spec->takes_value && eq == std::string::npos) {
                if (i + 1 >= argc) usage_error(fmt::format("option --{} needs a value", name));
                value = argv[++i];
            } else if (!spec->takes_value && eq != std::string::npos) {
                usage_error(fmt::format("option --{} takes no value", name));
            }
            given.emplace_back(std::move(name), std::move(value));
        } else if (out.command.empty()) {
            if (std::find(commands.begin(), commands.end(), arg) == commands.end()) {
                usage_error(fmt::format("unknown command '{}'", arg));
            }
            out.command = arg;
        } else if (out.command == "dead" && out.subcommand.empty()) {
            if (std::find(dead_subcommands.begin(), dead_subcommands.end(), arg) == dead_subcommands.end()) {
                usage_error(fmt::format("unknown `outboxd dead` command '{}': expected list, replay or purge", arg));
            }
            out.subcommand = arg;
        } else if (out.command == "wake-trigger" && out.subcommand.empty()) {
            if (arg != "install" && arg != "remove") {
                usage_error(fmt::format("unknown `outboxd wake-trigger` command '{}': expected install or remove", arg));
            }
            out.subcommand = arg;
        } else if (out.command == "wake-setup" && out.subcommand.empty()) {
            if (std::find(wake_setup_modes.begin(), wake_setup_modes.end(), arg) == wake_setup_modes.end()) {
                usage_error(fmt::format("unknown `outboxd wake-setup` mode '{}': expected auto, notify, poll or wal", arg));
            }
            out.subcommand = arg;
        } else if (out.command == "cursor" && out.subcommand.empty()) {
            if (arg != "reset") usage_error(fmt::format("unknown `outboxd cursor` command '{}': expected reset", arg));
            out.subcommand = arg;
        } else if (out.command == "consume-setup" && out.subcommand.empty()) {
            if (std::find(consume_setup_modes.begin(), consume_setup_modes.end(), arg) == consume_setup_modes.end()) {
                usage_error(fmt::format("unknown `outboxd consume-setup` mode '{}': expected claims or windows", arg));
            }
            out.subcommand = arg;
        } else {
            usage_error(fmt::format("unexpected argument '{}'", arg));
        }
    }
    if (out.command == "wake-trigger" && out.subcommand.empty() && !out.help) {
        usage_error("`outboxd wake-trigger` needs a command: install or remove");
    }
    if (out.command == "wake-setup" && out.subcommand.empty() && !out.help) {
        usage_error("`outboxd wake-setup` needs a mode: auto, notify, poll or wal");
    }
    if (out.command == "consume-setup" && out.subcommand.empty() && !out.help) {
        usage_error("`outboxd consume-setup` needs a mode: claims or windows");
    }
    if (out.command == "cursor" && out.subcommand.empty() && !out.help) {
        usage_error("`outboxd cursor` needs a command: reset");
    }
    if (out.command == "dead" && out.subcommand.empty() && !out.help) {
        usage_error("`outboxd dead` needs a command: list, replay or purge");
    }
    for (auto& [name, value] : given) {
        const auto* spec = find_option(name);
        if (!belongs_to(*spec, out.command)) {
            usage_error(fmt::format("option --{} does not apply to `outboxd {}`", name, out.command));
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
  wake-trigger install|remove
              install the trigger that lets producers wake relays (relay.wake = auto or
              notify; migrate installs it), or remove it (relay.wake = poll: producers
              then pay nothing for wake-ups)
  wake-setup auto|notify|poll|wal [--print]
              put in the database what relay.wake = MODE needs and remove what the other
              modes need, in one transaction: the wake-up triggers (auto, notify), the
              publication the WAL wake-up streams (wal), neither (poll). --print: print
              the SQL instead (for your own migration tool)
  consume-setup claims|windows [--print]
              put in the database what relay.consume = MODE needs, in one transaction:
              windows: every new event records its transaction's id, and the index the
              window read uses (producers pay one more index entry per event; migrate
              sets this up); claims: removes both (refused while windows relays run), and
              relays with relay.consume = "auto" (the default) then claim. --print: print
              the SQL
  cursor reset
              forget where windows relays are (relay.consume = "windows"): every event
              still in the outbox is read, and sent, again. For a relay that refused to
              read (exit 9: the database was restored, or is another cluster). Refused
              while windows relays run
  run         deliver events to the configured destinations until SIGINT/SIGTERM;
              SIGHUP reloads the configuration file (destinations, routes, relay settings).
              --once: deliver what is due, then exit 0 (cron, batch jobs, tests)
  check-config  validate the configuration `run` would use and print it, secrets redacted
  status      per topic and per destination: pending, due, scheduled, in flight, retrying,
              dead letters, oldest age, circuit state [--json] [--watch [--interval D]]
  dead list   dead letters, oldest first [--topic T] [--older-than D] [--limit N] [--json]
  dead replay put dead letters back into the outbox under their original ids, due now:
              --id N, or --all, or a filter [--topic T] [--older-than D]
  dead purge  delete dead letters --older-than D [--topic T] [--dry-run]
              (--topic takes a route pattern: orders.* or orders.>)

Global options (also as environment variables):
  --config FILE        OUTBOXD_CONFIG     TOML configuration (see README "Configuration");
                                          environment variables and flags override it
  --database-url URL   DATABASE_URL       libpq URI or key=value string
  --database-connect-timeout DURATION     OUTBOXD_DATABASE_CONNECT_TIMEOUT, default 10s (>= 2s)
  --database-keepalive-timeout DURATION   OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT: a silent database
                                          is given up after this, default 10s (>= 1s)
  --schema NAME        OUTBOXD_SCHEMA     default: outbox
  --log-level LEVEL    OUTBOXD_LOG_LEVEL  debug|info|warn|error, default: info
  --log-format FORMAT  OUTBOXD_LOG_FORMAT logfmt|json, default: logfmt
  --help, --version

`outboxd run` and `check-config` options (DURATION is a whole number with ms, s, m or h;
each also as OUTBOXD_<NAME>, e.g. OUTBOXD_CONCURRENCY):
  --url URL                 OUTBOXD_WEBHOOK_URL; the single destination "default" for all topics:
                            http://, https:// or the word stdout (one JSON line per event)
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
  --database-statement-timeout DURATION  the relay's statements, default 5s (0s: none); one
                            not answered within this plus 2s is given up and reconnected
  --idempotency-retention DURATION  forget idempotency keys after this, default 168h (0s: never)
  --dead-letter-retention DURATION  delete dead letters this long after they died, default 720h (0s: never)
  --permanent-statuses LIST dead-letter at once on these, default 410
  --throttle-statuses LIST  honour Retry-After on these, default 429,502,503,504
  --signing-secret whsec_…  sign requests (Standard Webhooks v1); repeat to rotate keys.
                            Prefer OUTBOXD_SIGNING_SECRETS (space-separated): flags show in `ps`
  --ca-file PATH            PEM CA bundle for https:// destinations (default: the system CAs)
  --insecure-skip-tls-verify  do not verify certificates (logged loudly; never in production)
  --block-private-addresses refuse to connect to loopback, private and link-local addresses
                            (checked after DNS resolution: an SSRF guard)
Flags and variables override the [defaults] of the file; a destination's own
settings in the file win over them.

Exit codes:
  0 ok (also after a graceful shutdown)   1 internal error
  2 usage or configuration error          3 database unavailable
  4 outbox not installed or older than this binary (run `outboxd migrate`)
  5 outbox schema newer than this binary  6 invalid input data
  7 the database role lacks a privilege (see config/grants.sql)
  8 the server's settings do not allow the configured mode (relay.wake = "wal"), or relays of
    the other relay.consume mode run on the outbox (at startup, or found after a reconnect)
  9 relay.consume = "windows": a window cursor does not belong to this server (restore, PITR,
    another cluster, a standby)
  130 a second SIGINT/SIGTERM cut the graceful shutdown short
)";
}

}  // namespace outboxd::app
