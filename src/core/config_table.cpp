// The settings table. One row per setting; the columns are described in
// config_table.hpp. The member's initializer is the default.

#include "core/config_table.hpp"

#include <array>

#include <fmt/format.h>

#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/toml_text.hpp"

namespace outboxd::settings {
namespace {

using namespace std::chrono_literals;
constexpr auto every = commands::every;
constexpr auto run = commands::run;

constexpr std::int64_t max_concurrency = 1024;
// libpq takes both in whole seconds; it treats a connect_timeout under 2 s as 2 s.
constexpr milliseconds min_db_connect_timeout = 2s;
constexpr milliseconds min_db_keepalive_timeout = 1s;

constexpr std::array<std::string_view, 4> log_levels{"debug", "info", "warn", "error"};  // log::parse_level
constexpr std::array<std::string_view, 2> log_formats{"logfmt", "json"};
constexpr std::array<std::string_view, 4> wake_modes{"auto", "notify", "poll", "wal"};
constexpr std::array<std::string_view, 3> consume_modes{"auto", "claims", "windows"};

using c = config;
using d = destination_config;

constexpr row<config> relay_table[] = {
    // file key, environment, flag, value, member[, flag for, by_env_key, default in words]
    {"database.url", "DATABASE_URL", "database-url", database_url(), member<&c::database_url>, every, {}, "(required)"},
    {"database.schema", "OUTBOXD_SCHEMA", "schema", schema_name(), member<&c::schema>, every},
    {"database.connect_timeout", "OUTBOXD_DATABASE_CONNECT_TIMEOUT", "database-connect-timeout",
     duration(min_db_connect_timeout), member<&c::db_connect_timeout>, every},
    {"database.keepalive_timeout", "OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT", "database-keepalive-timeout",
     duration(min_db_keepalive_timeout), member<&c::db_keepalive_timeout>, every},
    {"database.statement_timeout", "OUTBOXD_DATABASE_STATEMENT_TIMEOUT", "database-statement-timeout", duration(0ms),
     member<&c::db_statement_timeout>},
    {"database.transaction_pooling", "OUTBOXD_DATABASE_TRANSACTION_POOLING", "database-transaction-pooling",
     boolean(), member<&c::db_transaction_pooling>},
    {"relay.concurrency", "OUTBOXD_CONCURRENCY", "concurrency", integer(1, max_concurrency), member<&c::concurrency>},
    {"relay.lease", "OUTBOXD_LEASE", "lease", duration(1ms), member<&c::lease>},
    {"relay.sweep_interval", "OUTBOXD_SWEEP_INTERVAL", "sweep-interval", duration(100ms), member<&c::sweep_interval>},
    {"relay.wake", "OUTBOXD_WAKE", "wake", one_of(wake_modes), member<&c::wake>},
    {"relay.consume", "OUTBOXD_CONSUME", "consume", one_of(consume_modes), member<&c::consume>},
    {"relay.poll_interval", "OUTBOXD_POLL_INTERVAL", "poll-interval", duration(10ms), member<&c::poll_interval>},
    {"relay.busy_gap", "OUTBOXD_BUSY_GAP", "busy-gap", duration(1ms, 1s), member<&c::busy_gap>},
    {"relay.shutdown_timeout", "OUTBOXD_SHUTDOWN_TIMEOUT", "shutdown-timeout", duration(0ms),
     member<&c::shutdown_timeout>},
    {"relay.log_level", "OUTBOXD_LOG_LEVEL", "log-level", one_of(log_levels), member<&c::log_level>, every},
    {"relay.log_format", "OUTBOXD_LOG_FORMAT", "log-format", one_of(log_formats), member<&c::log_format>, every},
    {"relay.idempotency_retention", "OUTBOXD_IDEMPOTENCY_RETENTION", "idempotency-retention", duration(0ms),
     member<&c::idempotency_retention>},
    {"relay.dead_letter_retention", "OUTBOXD_DEAD_LETTER_RETENTION", "dead-letter-retention", duration(0ms),
     member<&c::dead_letter_retention>},
    {"relay.live_leases", "OUTBOXD_LIVE_LEASES", "", boolean(), member<&c::live_leases>},
    {"relay.summary_interval", "OUTBOXD_SUMMARY_INTERVAL", "summary-interval", duration(0ms),
     member<&c::summary_interval>},
    {"admin.listen", "OUTBOXD_ADMIN_LISTEN", "admin-listen", address(), member<&c::admin_listen>, run, {}, "(off)"},
    {"egress.block_private_addresses", "OUTBOXD_BLOCK_PRIVATE_ADDRESSES", "block-private-addresses", boolean(),
     member<&c::block_private_addresses>},
};

// In this order in a rendered destination; retry.*, circuit.* and tls.* are sub-tables.
constexpr row<destination_config> destination_table[] = {
    // file key, environment, flag, value, member[, flag for, by_env_key, default in words]
    {"connect_timeout", "OUTBOXD_CONNECT_TIMEOUT", "connect-timeout", duration(1ms), member<&d::connect_timeout>},
    {"request_timeout", "OUTBOXD_REQUEST_TIMEOUT", "request-timeout", duration(1ms), member<&d::request_timeout>},
    {"max_concurrency", "", "", integer(1, max_concurrency), member<&d::max_concurrency>, run, {},
     "`relay.concurrency`"},
    {"signing_secrets", "OUTBOXD_SIGNING_SECRETS", "signing-secret", secrets(), member<&d::signing_secrets>, run,
     "signing_secrets_env"},
    {"headers", "", "", headers(), member<&d::headers>},
    {"retry.base", "OUTBOXD_RETRY_BASE", "retry-base", duration(0ms), member<&d::retry, &retry_policy::base>},
    {"retry.cap", "OUTBOXD_RETRY_CAP", "retry-cap", duration(0ms), member<&d::retry, &retry_policy::cap>},
    {"retry.max_attempts", "OUTBOXD_MAX_ATTEMPTS", "max-attempts", integer(1, 1000),
     member<&d::retry, &retry_policy::max_attempts>},
    {"retry.permanent_statuses", "OUTBOXD_PERMANENT_STATUSES", "permanent-statuses", statuses(),
     member<&d::retry, &retry_policy::permanent_statuses>},
    {"retry.throttle_statuses", "OUTBOXD_THROTTLE_STATUSES", "throttle-statuses", statuses(),
     member<&d::retry, &retry_policy::throttle_statuses>},
    {"circuit.failures", "OUTBOXD_CIRCUIT_FAILURES", "circuit-failures", integer(0, 1000),
     member<&d::circuit, &circuit_settings::failures_to_open>},
    {"circuit.longest_probe", "OUTBOXD_CIRCUIT_LONGEST_PROBE", "circuit-longest-probe", duration(100ms),
     member<&d::circuit, &circuit_settings::longest_probe>},
    {"tls.verify", "OUTBOXD_INSECURE_SKIP_TLS_VERIFY", "insecure-skip-tls-verify", boolean_negated_outside_file(),
     member<&d::tls, &tls_settings::verify>},
    {"tls.ca_file", "OUTBOXD_CA_FILE", "ca-file", file_name(), member<&d::tls, &tls_settings::ca_file>, run, {},
     "the system's CA certificates"},
    {"nats.subject", "OUTBOXD_NATS_SUBJECT", "", subject(), member<&d::nats, &nats_settings::subject>},
    {"nats.creds_file", "", "", file_name(), member<&d::nats, &nats_settings::creds_file>, run, {},
     "none (no credentials, or those in `url`)"},
};

constexpr std::string_view redacted = "<redacted>";

template <typename Range, typename F>
std::string array_text(const Range& items, F&& item) {
    std::string out = "[";
    for (const auto& i : items) {
        if (out.size() > 1) out += ", ";
        out += item(i);
    }
    return out + "]";
}

// The default-constructed settings, out of line: inlined into its caller,
// GCC 12 at -O3 warns (falsely) that the object's strings may be used
// uninitialized (-Wmaybe-uninitialized, release builds only).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <typename Owner>
[[gnu::noinline]] const Owner& defaults_of() {
    static const Owner defaults{};
    return defaults;
}
#pragma GCC diagnostic pop

template <typename Owner>
std::string default_text(const row<Owner>& r) {
    if (!r.default_words.empty()) return std::string(r.default_words);
    return fmt::format("`{}`", toml_value(r.value.k, r.at.get(defaults_of<Owner>())));
}

}  // namespace

std::span<const row<config>> relay_rows() noexcept { return relay_table; }
std::span<const row<destination_config>> destination_rows() noexcept { return destination_table; }

bool applies_to_stdout(std::string_view destination_key) noexcept {
    return destination_key == "retry" || destination_key.starts_with("retry.");
}

bool applies_to_nats(std::string_view destination_key) noexcept {
    return !destination_key.starts_with("signing_secrets");
}

bool applies_to_webhook(std::string_view destination_key) noexcept {
    return destination_key != "nats" && !destination_key.starts_with("nats.");
}

bool applies_to(transport t, std::string_view destination_key) noexcept {
    switch (t) {
        case transport::webhook: return applies_to_webhook(destination_key);
        case transport::stdout_lines: return applies_to_stdout(destination_key);
        case transport::nats: return applies_to_nats(destination_key);
    }
    return false;
}

std::string toml_value(kind k, const value& v) {
    switch (k) {
        case kind::duration: return toml_quoted(format_duration(std::get<milliseconds>(v)));
        case kind::integer: return fmt::format("{}", std::get<std::int64_t>(v));
        case kind::boolean: return std::get<bool>(v) ? "true" : "false";
        case kind::one_of:
        case kind::schema:
        case kind::listen_address: return toml_quoted(std::get<std::string>(v));
        case kind::subject: return toml_quoted(std::get<std::string>(v));
        case kind::dsn: return toml_quoted(redact_dsn(std::get<std::string>(v)));
        case kind::file_name: return toml_quoted(std::get<std::optional<std::string>>(v).value_or(""));
        case kind::statuses:
            return array_text(std::get<std::vector<unsigned>>(v), [](unsigned s) { return fmt::format("{}", s); });
        case kind::secrets:
            return array_text(std::get<std::vector<signing_secret>>(v), [](const auto&) { return toml_quoted(redacted); });
        case kind::headers: {
            const auto& headers = std::get<header_list>(v);
            if (headers.empty()) return "{}";
            std::string out = "{";
            for (std::size_t i = 0; i < headers.size(); ++i) {
                out += fmt::format("{} {} = {}", i == 0 ? "" : ",", toml_key(headers[i].first), toml_quoted(redacted));
            }
            return out + " }";
        }
    }
    return {};
}

std::string expected_one_of(std::span<const std::string_view> choices) {
    std::string out = "expected ";
    for (std::size_t i = 0; i < choices.size(); ++i) {
        if (i > 0) out += i + 1 == choices.size() ? " or " : ", ";
        out += choices[i];
    }
    return out;
}

}  // namespace outboxd::settings

namespace outboxd {

std::vector<setting_spelling> setting_spellings() {
    std::vector<setting_spelling> out;
    for (const auto& r : settings::relay_rows()) out.push_back({r.key, false, r.env, r.flag, settings::default_text(r)});
    for (const auto& r : settings::destination_rows()) {
        out.push_back({r.key, true, r.env, r.flag, settings::default_text(r)});
        if (!r.by_env_key.empty()) out.push_back({r.by_env_key, true, {}, {}, {}});
    }
    return out;
}

std::vector<config_flag> config_flags() {
    std::vector<config_flag> out;
    const auto add = [&](const auto& r) {
        if (r.flag.empty()) return;
        out.push_back({r.flag, r.flag_for == settings::commands::every, r.value.k != settings::kind::boolean,
                       r.value.k == settings::kind::secrets});
    };
    for (const auto& r : settings::relay_rows()) add(r);
    for (const auto& r : settings::destination_rows()) add(r);
    // The single-destination shortcut (config.cpp): a destination, not a setting.
    out.push_back({settings::shortcut_flag, false, true, false});
    return out;
}

}  // namespace outboxd
