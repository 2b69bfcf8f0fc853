#pragma once
// The relay's effective configuration: a TOML file, overridden by OUTBOXD_*
// environment variables, overridden by command-line flags. Pure: the file's
// text, the environment and the flags reach it through the inputs below, so
// every rule is unit-tested without touching the process.
//
// Every error is a config_error whose message names where the bad value came
// from (file:line:column and key, environment variable or flag) and what was
// expected. No message ever repeats a secret (signing secrets, header values
// of destinations, the database password).

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/event.hpp"
#include "core/circuit_breaker.hpp"
#include "core/retry_policy.hpp"
#include "core/signing.hpp"
#include "core/tls_settings.hpp"
#include "core/url.hpp"

namespace outboxd {

class config_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class transport { webhook, stdout_lines, nats };

// A NATS JetStream destination's own settings (src/nats/, README "NATS
// JetStream").
struct nats_settings {
    std::string servers;                     // the destination's url: nats://h:4222,nats://h2:4222 (may hold credentials)
    std::string subject = "events.{topic}";  // {topic}: the event's topic
    std::optional<std::string> creds_file;   // a .creds file (user JWT and NKey seed)
};

struct destination_config {
    std::string name;
    transport kind = transport::webhook;
    // webhook only:
    endpoint_url url;
    // nats only:
    nats_settings nats;
    // webhook and nats (nats: connect_timeout, request_timeout = the wait
    // for the publish acknowledgement, max_concurrency = acknowledgements
    // outstanding, headers, tls; not signing):
    header_list headers;                  // static extra headers (values may be secret)
    std::chrono::milliseconds connect_timeout{5'000};
    std::chrono::milliseconds request_timeout{10'000};
    std::size_t max_concurrency = 32;     // requests in flight to this destination at most
    tls_settings tls;
    std::vector<signing_secret> signing_secrets;  // empty: not signed
    // Where the file spells the signing secrets out ("outboxd.toml:12:1:
    // destinations.x.signing_secrets"), for a warning; empty when they come
    // from the environment (or there are none).
    std::string signing_secrets_in_file;
    // all transports:
    retry_policy retry;
    circuit_settings circuit;
};

// 1 to 64 of A-Z a-z 0-9 _ - (what deliveries.destination accepts too).
[[nodiscard]] bool valid_destination_name(std::string_view name) noexcept;

struct route_config {
    std::vector<std::string> topics;        // patterns, see topic_pattern.hpp
    std::vector<std::string> destinations;  // names in config::destinations
};

struct config {
    std::string database_url;             // raw, may hold a password
    std::string schema = "outbox";
    // How long a database connection may take to open; every connection.
    std::chrono::milliseconds db_connect_timeout{10'000};
    // How long the database may stay silent on an idle connection before it
    // is given up (TCP keepalive and tcp_user_timeout, every connection; the
    // LISTEN connection's ping).
    std::chrono::milliseconds db_keepalive_timeout{10'000};
    // The relay's own statements: the server cancels one that runs longer,
    // and outboxd gives up on one not answered within this plus 2 s. 0: none.
    std::chrono::milliseconds db_statement_timeout{5'000};
    // The relay's connections go through a transaction pooler (PgBouncer
    // pool_mode = transaction): no prepared statements, no session settings.
    bool db_transaction_pooling = false;
    std::string log_level = "info";
    std::string log_format = "logfmt";   // or "json": how log records are written
    std::size_t concurrency = 32;         // deliveries in flight at most, all destinations
    std::chrono::milliseconds lease{30'000};
    std::chrono::milliseconds sweep_interval{30'000};
    // How the relay learns of new events (README "Wake-up modes"): "auto"
    // (notifications while it is idle, claims back to back while busy),
    // "notify" (a notification at every commit) or "poll" (no LISTEN, a
    // claim every poll_interval).
    std::string wake = "auto";
    // Where the relay takes events from: "claims" (lease each event, delete
    // it when delivered), "windows" (read commit-ordered windows, no write
    // per event: docs/windows-in-the-relay.md; the outbox set up for it, as
    // sql/0016 leaves it), or "auto": windows unless the relay cannot read
    // them or must join relays that claim (core/consume_choice.hpp). A
    // running relay's configuration holds the mode it chose, never "auto".
    std::string consume = "auto";
    // poll mode's claim interval; also how often a relay whose notifications
    // do not arrive (the self-test failed) claims instead.
    std::chrono::milliseconds poll_interval{500};
    // A busy relay (auto: producers not notifying; wal: its stream paused)
    // claims this long after a claim that found events: what an event may
    // wait under load, traded against the reads the relay costs the
    // database (README "Under heavy writes on a small database").
    std::chrono::milliseconds busy_gap{5};
    // Leases bound to the relay's database session (sql/0006): a dead
    // relay's leases are taken over within a second. Off behind a
    // transaction pooler, where a session is not the relay's own: leases
    // then expire as before.
    bool live_leases = true;
    std::chrono::milliseconds shutdown_timeout{10'000};
    // Idempotency keys older than this are forgotten (the relay purges them
    // at every sweep): a producer retrying with the same key later makes a
    // new event. 0 keeps them forever.
    std::chrono::milliseconds idempotency_retention{7 * 24 * 3'600'000};
    // Dead letters that died longer ago than this are deleted (the relay
    // purges them at every sweep, in small batches). 0 keeps them forever.
    std::chrono::milliseconds dead_letter_retention{30 * 24 * 3'600'000LL};
    // The info line with the relay's figures (delivered/s, failures,
    // backlog, ...) comes this often; 0: never.
    std::chrono::milliseconds summary_interval{60'000};
    // The admin HTTP listener (/metrics, /healthz, /readyz), "HOST:PORT";
    // empty: none.
    std::string admin_listen;
    bool block_private_addresses = false; // egress (SSRF) guard
    std::vector<destination_config> destinations;
    std::vector<route_config> routes;
    // [defaults.retry] after environment and flags: the schedule of what no
    // destination's own covers (events no route matches).
    retry_policy default_retry;
};

// Where settings come from. Each lookup returns nullopt when absent; an
// empty environment variable counts as absent (as it always has). A null
// function is a source with nothing in it.
struct config_sources {
    std::optional<std::string> file_text;  // the TOML file's contents, if a file was given
    std::string file_name;                 // for messages
    // OUTBOXD_*, DATABASE_URL, and the variables a file names in
    // signing_secrets_env (any name): pass a getenv wrapper.
    std::function<std::optional<std::string>(std::string_view name)> env;
    // e.g. "concurrency" -> the values given, in order. A flag without a
    // value (--block-private-addresses) is given as one empty string.
    std::function<std::vector<std::string>(std::string_view flag)> flags;
    // Optional check of the database URL the way libpq will read it
    // (pg::conninfo_error): nullopt when fine, else the complaint, free of
    // the password. Keeps this file free of libpq.
    std::function<std::optional<std::string>(const std::string& database_url)> database_url_error;
    // false for commands that only talk to the database (migrate, status,
    // dead, enqueue): destinations and routes are then optional, but still
    // validated when given.
    bool destinations_required = true;
    // false for `outboxd sql`, which prints SQL and never connects.
    bool database_required = true;
};

// Builds and validates the effective configuration. Throws config_error.
[[nodiscard]] config resolve_config(const config_sources& sources);

// The effective configuration as TOML, every secret replaced by "<redacted>".
[[nodiscard]] std::string render_config(const config& c);

// Every setting as a user spells it, from the settings table
// (config_table.cpp): what README.md's configuration reference must say.
struct setting_spelling {
    std::string_view key;      // file key; a destination's is relative: "retry.base"
    bool per_destination;      // in [defaults] and [destinations.NAME]
    std::string_view env;      // "" when none
    std::string_view flag;     // without "--"; "" when none
    std::string default_text;  // how the README's default cell starts: `"30s"`, (required)
};
[[nodiscard]] std::vector<setting_spelling> setting_spellings();

// The flags the configuration reads, for the command line's option list.
struct config_flag {
    std::string_view name;  // without "--"
    bool every_command;     // else only `run` and `check-config` take it
    bool takes_value;       // false: a switch (--block-private-addresses)
    bool repeatable;        // --signing-secret
};
[[nodiscard]] std::vector<config_flag> config_flags();

}  // namespace outboxd
