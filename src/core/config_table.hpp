#pragma once
// The settings of the configuration, one row each: file key, environment
// variable, flag, how the value is read and bounded, and the member it
// fills. The member's initializer (config.hpp, retry_policy.hpp,
// tls_settings.hpp) is the default. Reading and precedence (config.cpp),
// rendering (config_render.cpp), the command line's options (app/cli.cpp)
// and README.md's reference (checked by config_test) all come from the rows
// in config_table.cpp; a new setting is one row there, one member, and one
// README row.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/config.hpp"
#include "core/event.hpp"
#include "core/signing.hpp"

namespace outboxd::settings {

using std::chrono::milliseconds;

// What a value is, and so how it is read from TOML and from text, and how
// it is written back.
enum class kind {
    duration,   // "30s" (file and text); at least rule::min
    integer,    // rule::lo to rule::hi
    boolean,    // true or false; a flag without a value means true
    one_of,     // a string among rule::choices
    schema,     // a schema name (core/sql_ident.hpp)
    dsn,        // the database URL; rendered with the password cut out
    file_name,  // a non-empty string, optional (unset: the row's default_words)
    statuses,   // HTTP statuses, not 2xx: [410, 422] in the file, "410,422" as text
    secrets,    // signing secrets; rendered as "<redacted>"; a repeated flag adds up
    headers,    // static headers, file only, merged per name; values rendered as "<redacted>"
    listen_address,  // "HOST:PORT" (core/listen_address.hpp), or "" for none
    subject,    // a NATS subject template ("events.{topic}", nats/subject.hpp)
};

struct rule {
    kind k;
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    milliseconds min{0};
    std::span<const std::string_view> choices{};
    // boolean: the environment variable and flag say the opposite of the
    // file key (tls.verify = false is --insecure-skip-tls-verify).
    bool negated_outside_file = false;
    milliseconds max = milliseconds::max();  // duration
};

constexpr rule duration(milliseconds min, milliseconds max = milliseconds::max()) {
    return {kind::duration, 0, 0, min, {}, false, max};
}
constexpr rule integer(std::int64_t lo, std::int64_t hi) { return {kind::integer, lo, hi}; }
constexpr rule boolean() { return {kind::boolean}; }
constexpr rule boolean_negated_outside_file() { return {kind::boolean, 0, 0, milliseconds(0), {}, true}; }
constexpr rule one_of(std::span<const std::string_view> choices) { return {kind::one_of, 0, 0, milliseconds(0), choices}; }
constexpr rule schema_name() { return {kind::schema}; }
constexpr rule database_url() { return {kind::dsn}; }
constexpr rule file_name() { return {kind::file_name}; }
constexpr rule statuses() { return {kind::statuses}; }
constexpr rule secrets() { return {kind::secrets}; }
constexpr rule headers() { return {kind::headers}; }
constexpr rule address() { return {kind::listen_address}; }
constexpr rule subject() { return {kind::subject}; }

// A value of any kind, on its way between text and a member.
using value = std::variant<milliseconds, std::int64_t, bool, std::string, std::optional<std::string>,
                           std::vector<unsigned>, std::vector<signing_secret>, header_list>;

// Reads and writes one member of Owner (or a member of a member: retry.base).
template <typename Owner>
struct field {
    value (*get)(const Owner&);
    void (*set)(Owner&, value);
};

template <typename>
struct member_traits;
template <typename C, typename M>
struct member_traits<M C::*> {
    using owner = C;
};

template <typename T>
value to_value(const T& v) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        return static_cast<std::int64_t>(v);
    } else {
        return v;
    }
}

template <typename T>
void from_value(T& target, value v) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        target = static_cast<T>(std::get<std::int64_t>(v));
    } else {
        target = std::get<T>(std::move(v));
    }
}

// member<&config::lease>, member<&destination_config::retry, &retry_policy::base>.
template <auto First, auto... Rest>
struct member_path {
    using owner = typename member_traits<decltype(First)>::owner;
    static value get(const owner& o) { return to_value(((o.*First) .* ... .* Rest)); }
    static void set(owner& o, value v) { from_value(((o.*First) .* ... .* Rest), std::move(v)); }
};
template <auto... Path>
inline constexpr field<typename member_path<Path...>::owner> member{&member_path<Path...>::get,
                                                                     &member_path<Path...>::set};

// Which commands take a setting's flag.
enum class commands {
    every,  // every command that reads the configuration (database and logging)
    run,    // `run` and `check-config`
};

template <typename Owner>
struct row {
    std::string_view key;   // the file key, dotted: "relay.lease"; in a destination: "retry.base"
    std::string_view env;   // "" when none
    std::string_view flag;  // without "--"; "" when none
    rule value;
    field<Owner> at;
    commands flag_for = commands::run;
    // A second file key, in the same table, naming an environment variable
    // that holds the value (keeps secrets out of the file); secrets only.
    std::string_view by_env_key = {};
    // The default in words where the member's initializer is not what
    // applies or says nothing (README.md's default column; an unset
    // file_name is rendered as a comment with it).
    std::string_view default_words = {};
};

// [database], [relay], [egress]: members of config.
[[nodiscard]] std::span<const row<config>> relay_rows() noexcept;
// [defaults], then each [destinations.NAME]: members of destination_config.
// (A destination's `type` and `url` are its own, not settings that inherit.)
[[nodiscard]] std::span<const row<destination_config>> destination_rows() noexcept;

// The single-destination shortcut: a destination named "default" that every
// topic is routed to, with the [defaults] settings.
inline constexpr std::string_view shortcut_flag = "url";
inline constexpr std::string_view shortcut_env = "OUTBOXD_WEBHOOK_URL";

// Only retry applies to a stdout destination: "retry", "retry.base", but
// not "url" or "tls.verify".
[[nodiscard]] bool applies_to_stdout(std::string_view destination_key) noexcept;
// nats.* applies to a NATS destination only; signing does not apply to one
// (JetStream's own authentication covers who published).
[[nodiscard]] bool applies_to_nats(std::string_view destination_key) noexcept;
[[nodiscard]] bool applies_to_webhook(std::string_view destination_key) noexcept;
[[nodiscard]] bool applies_to(transport t, std::string_view destination_key) noexcept;

// A value as TOML spells it, every secret as "<redacted>" (the password
// of a database URL cut out). Not for an unset file_name.
[[nodiscard]] std::string toml_value(kind k, const value& v);

// "expected debug, info, warn or error"
[[nodiscard]] std::string expected_one_of(std::span<const std::string_view> choices);

}  // namespace outboxd::settings
