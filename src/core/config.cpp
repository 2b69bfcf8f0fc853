// The effective configuration: built-in defaults < TOML file < environment <
// flags, validated key by key where each value is read, so every message
// names the value's own source. README.md ("Configuration") documents every
// key; this file and that section change together.
//
// Layering of destination settings: [defaults] in the file, then the
// environment, then flags, make one "defaults" layer; a destination's own
// keys in the file override that layer (headers per name, retry and tls per
// key). So a flag changes every destination that does not set the key itself.

#include "core/config.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/http_token.hpp"
#include "core/integer.hpp"
#include "core/log.hpp"
#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "core/toml_text.hpp"
#include "core/topic_pattern.hpp"
#include "core/webhook_request.hpp"

namespace outboxd {
namespace {

using std::chrono::milliseconds;

constexpr std::int64_t max_concurrency_limit = 1024;
constexpr std::int64_t max_attempts_limit = 1000;
constexpr std::string_view redacted = "<redacted>";
constexpr std::string_view default_destination = "default";

// ---- text helpers -----------------------------------------------------------

// How messages quote a value (and how TOML spells a string).
std::string quoted(std::string_view raw) { return toml_quoted(raw); }

std::string key_text(std::string_view k) { return toml_key(k); }

std::string child(std::string_view path, std::string_view key) {
    return path.empty() ? key_text(key) : fmt::format("{}.{}", path, key_text(key));
}

std::string element(std::string_view path, std::size_t i) { return fmt::format("{}[{}]", path, i); }

bool is_destination_name(std::string_view name) {
    return name.size() <= 64 && is_bare_key(name);  // bare keys are exactly [A-Za-z0-9_-]+
}

bool is_env_name(std::string_view name) {
    if (name.empty() || (name.front() >= '0' && name.front() <= '9')) return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    });
}

// ---- where a value came from --------------------------------------------------

struct origin {
    enum class kind { builtin, file, env, flag };
    kind k = kind::builtin;
    std::string key;       // dotted key, environment variable, or "--flag"
    std::string location;  // "outboxd.toml:12:11", for file values

    // What a message about this value starts with.
    [[nodiscard]] std::string prefix() const { return k == kind::file ? fmt::format("{}: {}", location, key) : key; }
    // For a message about another value: "from --lease", "the default".
    [[nodiscard]] std::string source() const {
        switch (k) {
            case kind::builtin: return "the default";
            case kind::file: return fmt::format("from {} at {}", key, location);
            default: return fmt::format("from {}", key);
        }
    }
};

origin builtin(std::string key) { return {origin::kind::builtin, std::move(key), {}}; }
origin from_env(std::string_view name) { return {origin::kind::env, std::string(name), {}}; }
origin from_flag(std::string_view name) { return {origin::kind::flag, fmt::format("--{}", name), {}}; }

[[noreturn]] void fail(const origin& o, std::string_view what) {
    throw config_error(fmt::format("{}: {}", o.prefix(), what));
}

template <typename T>
struct setting {
    T value{};
    origin from;
};

// ---- the sources --------------------------------------------------------------

class inputs {
public:
    explicit inputs(const config_sources& s) : s_(s) {}

    [[nodiscard]] std::optional<std::string> env(std::string_view name) const {
        if (!s_.env) return std::nullopt;
        auto v = s_.env(name);
        if (v && v->empty()) return std::nullopt;
        return v;
    }
    [[nodiscard]] std::vector<std::string> flag_values(std::string_view name) const {
        return s_.flags ? s_.flags(name) : std::vector<std::string>{};
    }
    // The last value of a flag (the command line refuses repeats of single ones).
    [[nodiscard]] std::optional<std::string> flag(std::string_view name) const {
        auto all = flag_values(name);
        if (all.empty()) return std::nullopt;
        return std::move(all.back());
    }
    [[nodiscard]] const config_sources& sources() const { return s_; }

private:
    const config_sources& s_;
};

// ---- values from text (environment variables and flags) ------------------------

std::int64_t int_from_text(std::string_view text, const origin& o, std::int64_t lo, std::int64_t hi) {
    try {
        return parse_integer(text, lo, hi);
    } catch (const std::invalid_argument& e) {
        fail(o, e.what());
    }
}

milliseconds duration_checked(std::string_view text, const origin& o, milliseconds min, std::string_view got) {
    milliseconds d{};
    try {
        d = parse_duration(text);
    } catch (const std::invalid_argument&) {
        fail(o, fmt::format("expected a duration like \"5s\" or \"250ms\", got {}", got));
    }
    if (d < min) fail(o, fmt::format("expected a duration of at least {}, got {}", format_duration(min), got));
    return d;
}

milliseconds duration_from_text(std::string_view text, const origin& o, milliseconds min) {
    return duration_checked(text, o, min, quoted(text));
}

bool bool_from_text(std::string_view text, const origin& o) {
    if (text == "true") return true;
    if (text == "false") return false;
    fail(o, fmt::format("expected true or false, got {}", quoted(text)));
}

// A flag without a value means true: --block-private-addresses.
bool switch_from_text(std::string_view text, const origin& o) { return text.empty() || bool_from_text(text, o); }

std::vector<unsigned> statuses_from_text(std::string_view text, const origin& o) {
    try {
        return parse_status_list(text);
    } catch (const std::invalid_argument& e) {
        fail(o, e.what());
    }
}

std::string log_level_checked(std::string_view text, const origin& o, std::string_view got) {
    try {
        (void)log::parse_level(text);
    } catch (const std::invalid_argument&) {
        fail(o, fmt::format("expected debug, info, warn or error, got {}", got));
    }
    return std::string(text);
}

std::string schema_checked(std::string_view text, const origin& o) {
    try {
        validate_schema_name(text);
    } catch (const std::invalid_argument& e) {
        fail(o, e.what());
    }
    return std::string(text);
}

endpoint_url url_checked(std::string_view text, const origin& o) {
    try {
        return parse_endpoint_url(text);
    } catch (const std::invalid_argument& e) {
        fail(o, e.what());  // never repeats userinfo (url.hpp)
    }
}

// Never echoes a secret: parse_signing_secrets does not.
std::vector<signing_secret> secrets_from_text(std::string_view text, const origin& o) {
    try {
        return parse_signing_secrets(text);
    } catch (const std::invalid_argument& e) {
        fail(o, e.what());
    }
}

// ---- values from the TOML file ----------------------------------------------------

std::string type_name(const toml::node& n) {
    switch (n.type()) {
        case toml::node_type::string: return "a string";
        case toml::node_type::integer: return "an integer";
        case toml::node_type::floating_point: return "a float";
        case toml::node_type::boolean: return "a boolean";
        case toml::node_type::array: return "an array";
        case toml::node_type::table: return "a table";
        case toml::node_type::date: return "a date";
        case toml::node_type::time: return "a time";
        case toml::node_type::date_time: return "a date-time";
        default: return "nothing";
    }
}

// The value itself for scalars, its kind otherwise. Not for secrets.
std::string got(const toml::node& n) {
    if (const auto* s = n.as_string()) return quoted(s->get());
    if (const auto* i = n.as_integer()) return fmt::format("{}", i->get());
    if (const auto* f = n.as_floating_point()) return fmt::format("{}", f->get());
    if (const auto* b = n.as_boolean()) return b->get() ? "true" : "false";
    return type_name(n);
}

class file_reader {
public:
    explicit file_reader(std::string name) : name_(std::move(name)) {}

    [[nodiscard]] const std::string& name() const { return name_; }

    [[nodiscard]] origin at(const toml::source_region& where, std::string key) const {
        const auto& p = where.begin;
        std::string location = p.line == 0 ? name_ : fmt::format("{}:{}:{}", name_, p.line, p.column);
        return {origin::kind::file, std::move(key), std::move(location)};
    }

private:
    std::string name_;
};

// One key = value of a table: the node, and the origin naming it (at the key).
struct entry {
    std::string_view key;
    const toml::node* node;
    origin from;
};

bool before(const toml::source_position& a, const toml::source_position& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
}

// Edit distance (insertions, deletions, substitutions), for suggestions.
std::size_t distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const auto above = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

// Where keys live that people put in the wrong table.
constexpr std::array<std::pair<std::string_view, std::string_view>, 17> homes{{
    {"concurrency", "relay.concurrency"},
    {"lease", "relay.lease"},
    {"sweep_interval", "relay.sweep_interval"},
    {"shutdown_timeout", "relay.shutdown_timeout"},
    {"log_level", "relay.log_level"},
    {"idempotency_retention", "relay.idempotency_retention"},
    {"schema", "database.schema"},
    {"block_private_addresses", "egress.block_private_addresses"},
    {"connect_timeout", "defaults.connect_timeout (or destinations.NAME.connect_timeout)"},
    {"request_timeout", "defaults.request_timeout (or destinations.NAME.request_timeout)"},
    {"max_concurrency", "defaults.max_concurrency (or destinations.NAME.max_concurrency)"},
    {"base", "defaults.retry.base (or destinations.NAME.retry.base)"},
    {"cap", "defaults.retry.cap (or destinations.NAME.retry.cap)"},
    {"max_attempts", "defaults.retry.max_attempts (or destinations.NAME.retry.max_attempts)"},
    {"permanent_statuses", "defaults.retry.permanent_statuses (or destinations.NAME.retry.permanent_statuses)"},
    {"throttle_statuses", "defaults.retry.throttle_statuses (or destinations.NAME.retry.throttle_statuses)"},
    {"ca_file", "defaults.tls.ca_file (or destinations.NAME.tls.ca_file)"},
}};

// "; did you mean relay.concurrency?" for an unknown key: a close spelling
// of a key of the same table, or the table where that key lives.
std::string suggestion(std::string_view path, std::string_view key, std::initializer_list<std::string_view> allowed) {
    std::string_view best;
    std::size_t best_distance = std::max<std::size_t>(1, key.size() / 4) + 1;
    for (const auto candidate : allowed) {
        if (const auto d = distance(key, candidate); d < best_distance) {
            best = candidate;
            best_distance = d;
        }
    }
    if (!best.empty()) return fmt::format("; did you mean {}?", child(path, best));
    for (const auto& [name, home] : homes) {
        if (name == key) return fmt::format("; did you mean {}?", home);
    }
    return {};
}

// The table's entries in file order (toml++ keeps them sorted by key), after
// refusing any key not in `allowed` (the typo guard). An empty `allowed`
// accepts every key (header names, destination names).
std::vector<entry> entries(const file_reader& f, const toml::table& t, std::string_view path,
                           std::initializer_list<std::string_view> allowed) {
    std::vector<std::pair<const toml::key*, const toml::node*>> items;
    for (const auto& [k, v] : t) items.emplace_back(&k, &v);
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return before(a.first->source().begin, b.first->source().begin); });
    std::vector<entry> out;
    for (const auto& [k, v] : items) {
        const auto key = k->str();
        auto o = f.at(k->source(), child(path, key));
        if (allowed.size() != 0 && std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
            throw config_error(fmt::format("{}: unknown key {}{}", o.location, o.key, suggestion(path, key, allowed)));
        }
        out.push_back({key, v, std::move(o)});
    }
    return out;
}

const toml::table& table_of(const entry& e) {
    if (const auto* t = e.node->as_table()) return *t;
    fail(e.from, fmt::format("expected a table, got {}", got(*e.node)));
}

std::int64_t int_of(const entry& e, std::int64_t lo, std::int64_t hi) {
    if (const auto v = e.node->value_exact<std::int64_t>(); v && *v >= lo && *v <= hi) return *v;
    fail(e.from, fmt::format("expected an integer from {} to {}, got {}", lo, hi, got(*e.node)));
}

milliseconds duration_of(const entry& e, milliseconds min) {
    if (const auto* s = e.node->as_string()) return duration_checked(s->get(), e.from, min, quoted(s->get()));
    fail(e.from, fmt::format("expected a duration like \"5s\" or \"250ms\", got {}", got(*e.node)));
}

bool bool_of(const entry& e) {
    if (const auto* b = e.node->as_boolean()) return b->get();
    fail(e.from, fmt::format("expected true or false, got {}", got(*e.node)));
}

const std::string& string_of(const entry& e) {
    if (const auto* s = e.node->as_string(); s && !s->get().empty()) return s->get();
    fail(e.from, fmt::format("expected a non-empty string, got {}", got(*e.node)));
}

const toml::array& array_of(const entry& e, std::string_view what) {
    if (const auto* a = e.node->as_array()) return *a;
    fail(e.from, fmt::format("expected {}, got {}", what, got(*e.node)));
}

// The entries of an array, each located at itself: routes[0].topics[1].
std::vector<entry> elements(const file_reader& f, const toml::array& a, const origin& parent) {
    std::vector<entry> out;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const auto& n = a[i];
        auto o = f.at(n.source(), element(parent.key, i));
        if (o.location == f.name()) o.location = parent.location;
        out.push_back({{}, &n, std::move(o)});
    }
    return out;
}

std::vector<unsigned> statuses_of(const file_reader& f, const entry& e) {
    std::vector<unsigned> out;
    for (const auto& el : elements(f, array_of(e, "an array of HTTP statuses like [410, 422]"), e.from)) {
        const auto v = el.node->value_exact<std::int64_t>();
        if (!v || *v < 100 || *v > 599) {
            fail(el.from, fmt::format("expected an HTTP status from 100 to 599, got {}", got(*el.node)));
        }
        if (*v >= 200 && *v < 300) fail(el.from, fmt::format("2xx means delivered and cannot be listed, got {}", *v));
        out.push_back(static_cast<unsigned>(*v));
    }
    return out;
}

// ---- settings shared by [defaults] and every destination ------------------------

struct header_setting {
    std::string name;
    std::string value;
};

struct destination_settings {
    setting<milliseconds> connect_timeout{milliseconds(5'000), builtin("defaults.connect_timeout")};
    setting<milliseconds> request_timeout{milliseconds(10'000), builtin("defaults.request_timeout")};
    setting<std::size_t> max_concurrency{32, builtin("defaults.max_concurrency")};
    setting<std::vector<signing_secret>> signing_secrets{{}, builtin("defaults.signing_secrets")};
    std::vector<header_setting> headers;
    setting<milliseconds> retry_base{retry_policy{}.base, builtin("defaults.retry.base")};
    setting<milliseconds> retry_cap{retry_policy{}.cap, builtin("defaults.retry.cap")};
    setting<int> max_attempts{retry_policy{}.max_attempts, builtin("defaults.retry.max_attempts")};
    setting<std::vector<unsigned>> permanent_statuses{retry_policy{}.permanent_statuses,
                                                      builtin("defaults.retry.permanent_statuses")};
    setting<std::vector<unsigned>> throttle_statuses{retry_policy{}.throttle_statuses,
                                                     builtin("defaults.retry.throttle_statuses")};
    setting<bool> tls_verify{true, builtin("defaults.tls.verify")};
    setting<std::optional<std::string>> ca_file{std::nullopt, builtin("defaults.tls.ca_file")};
};

constexpr milliseconds min_timeout{1};

bool same_header(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; };
               return lower(x) == lower(y);
           });
}

// Header values may be secret (tokens): no message shows one.
std::vector<header_setting> headers_of(const file_reader& f, const entry& e) {
    std::vector<header_setting> out;
    for (const auto& h : entries(f, table_of(e), e.from.key, {})) {
        const std::string name(h.key);
        if (!is_http_token(name)) {
            // Not repeated: a malformed name is often a whole "Name: value" line.
            throw config_error(fmt::format("{}: {}: a header name is not a valid HTTP token", h.from.location, e.from.key));
        }
        if (is_reserved_header(name)) {
            fail(h.from, "outboxd sets this header itself (framing, hop-by-hop, webhook-* and outbox-* are reserved)");
        }
        const auto* value = h.node->as_string();
        if (value == nullptr) fail(h.from, fmt::format("expected a string, got {}", type_name(*h.node)));
        if (!is_header_value(value->get())) fail(h.from, "the value contains a control character");
        const auto dup = std::find_if(out.begin(), out.end(), [&](const auto& o) { return same_header(o.name, name); });
        if (dup != out.end()) fail(h.from, fmt::format("the same header as {} (names are case-insensitive)", dup->name));
        out.push_back({name, value->get()});
    }
    return out;
}

std::vector<signing_secret> secrets_of(const file_reader& f, const entry& e) {
    std::vector<signing_secret> out;
    // type_name, not got: the value may be a secret given the wrong shape.
    const auto* a = e.node->as_array();
    if (a == nullptr) {
        fail(e.from, fmt::format("expected an array of strings like [\"whsec_...\"], got {}", type_name(*e.node)));
    }
    for (const auto& el : elements(f, *a, e.from)) {
        const auto* s = el.node->as_string();
        if (s == nullptr) fail(el.from, fmt::format("expected a string, got {}", type_name(*el.node)));
        try {
            out.push_back(signing_secret::parse(s->get()));
        } catch (const std::invalid_argument& err) {
            fail(el.from, err.what());
        }
    }
    return out;
}

std::vector<signing_secret> secrets_from_env_var(const inputs& in, const entry& e) {
    const auto& name = string_of(e);
    if (!is_env_name(name) || name.starts_with("whsec_")) {
        // Not repeated: the likely mistake is the secret itself in place of the name.
        fail(e.from, "expected the name of an environment variable (letters, digits and '_'), not the secrets");
    }
    const auto text = in.env(name);
    // Commands that only talk to the database never sign anything: the
    // variable may well be unset where they run (a migration job, an
    // operator's shell).
    if (!text && !in.sources().destinations_required) return {};
    if (!text) fail(e.from, fmt::format("the environment variable {} is not set", name));
    auto secrets = secrets_from_text(*text, e.from);
    if (secrets.empty()) fail(e.from, fmt::format("the environment variable {} holds no secret", name));
    return secrets;
}

// Reads one of the keys that [defaults] and [destinations.NAME] share into
// `s`; false when `e` is not one of them.
bool read_shared(const file_reader& f, const inputs& in, const entry& e, destination_settings& s) {
    if (e.key == "connect_timeout") {
        s.connect_timeout = {duration_of(e, min_timeout), e.from};
    } else if (e.key == "request_timeout") {
        s.request_timeout = {duration_of(e, min_timeout), e.from};
    } else if (e.key == "max_concurrency") {
        s.max_concurrency = {static_cast<std::size_t>(int_of(e, 1, max_concurrency_limit)), e.from};
    } else if (e.key == "signing_secrets") {
        s.signing_secrets = {secrets_of(f, e), e.from};
    } else if (e.key == "signing_secrets_env") {
        s.signing_secrets = {secrets_from_env_var(in, e), e.from};
    } else if (e.key == "headers") {
        // Per name: a destination's header replaces an inherited one.
        for (auto& h : headers_of(f, e)) {
            std::erase_if(s.headers, [&](const header_setting& old) { return same_header(old.name, h.name); });
            s.headers.push_back(std::move(h));
        }
    } else if (e.key == "retry") {
        for (const auto& r : entries(f, table_of(e), e.from.key,
                                     {"base", "cap", "max_attempts", "permanent_statuses", "throttle_statuses"})) {
            if (r.key == "base") s.retry_base = {duration_of(r, milliseconds(0)), r.from};
            if (r.key == "cap") s.retry_cap = {duration_of(r, milliseconds(0)), r.from};
            if (r.key == "max_attempts") s.max_attempts = {static_cast<int>(int_of(r, 1, max_attempts_limit)), r.from};
            if (r.key == "permanent_statuses") s.permanent_statuses = {statuses_of(f, r), r.from};
            if (r.key == "throttle_statuses") s.throttle_statuses = {statuses_of(f, r), r.from};
        }
    } else if (e.key == "tls") {
        for (const auto& t : entries(f, table_of(e), e.from.key, {"ca_file", "verify"})) {
            if (t.key == "ca_file") s.ca_file = {string_of(t), t.from};
            if (t.key == "verify") s.tls_verify = {bool_of(t), t.from};
        }
    } else {
        return false;
    }
    return true;
}

void refuse_both_secret_keys(const std::vector<entry>& es) {
    const auto has = [&](std::string_view k) {
        return std::find_if(es.begin(), es.end(), [&](const entry& e) { return e.key == k; });
    };
    if (const auto a = has("signing_secrets"), b = has("signing_secrets_env"); a != es.end() && b != es.end()) {
        fail(b->from, "give signing_secrets or signing_secrets_env, not both");
    }
}

// Environment, then flags, over the file's [defaults].
void apply_env_and_flags(const inputs& in, destination_settings& s) {
    auto duration_setting = [&](setting<milliseconds>& target, std::string_view env, std::string_view flag,
                                milliseconds min) {
        if (auto v = in.env(env)) target = {duration_from_text(*v, from_env(env), min), from_env(env)};
        if (auto v = in.flag(flag)) target = {duration_from_text(*v, from_flag(flag), min), from_flag(flag)};
    };
    duration_setting(s.connect_timeout, "OUTBOXD_CONNECT_TIMEOUT", "connect-timeout", min_timeout);
    duration_setting(s.request_timeout, "OUTBOXD_REQUEST_TIMEOUT", "request-timeout", min_timeout);
    duration_setting(s.retry_base, "OUTBOXD_RETRY_BASE", "retry-base", milliseconds(0));
    duration_setting(s.retry_cap, "OUTBOXD_RETRY_CAP", "retry-cap", milliseconds(0));

    auto attempts = [&](std::string_view text, const origin& o) {
        s.max_attempts = {static_cast<int>(int_from_text(text, o, 1, max_attempts_limit)), o};
    };
    if (auto v = in.env("OUTBOXD_MAX_ATTEMPTS")) attempts(*v, from_env("OUTBOXD_MAX_ATTEMPTS"));
    if (auto v = in.flag("max-attempts")) attempts(*v, from_flag("max-attempts"));

    auto statuses = [&](setting<std::vector<unsigned>>& target, std::string_view env, std::string_view flag) {
        if (auto v = in.env(env)) target = {statuses_from_text(*v, from_env(env)), from_env(env)};
        if (auto v = in.flag(flag)) target = {statuses_from_text(*v, from_flag(flag)), from_flag(flag)};
    };
    statuses(s.permanent_statuses, "OUTBOXD_PERMANENT_STATUSES", "permanent-statuses");
    statuses(s.throttle_statuses, "OUTBOXD_THROTTLE_STATUSES", "throttle-statuses");

    // Secrets: the flag (repeatable, each value space-separated) replaces the variable.
    if (auto v = in.env("OUTBOXD_SIGNING_SECRETS")) {
        s.signing_secrets = {secrets_from_text(*v, from_env("OUTBOXD_SIGNING_SECRETS")),
                             from_env("OUTBOXD_SIGNING_SECRETS")};
    }
    if (const auto values = in.flag_values("signing-secret"); !values.empty()) {
        std::vector<signing_secret> all;
        for (const auto& text : values) {
            auto some = secrets_from_text(text, from_flag("signing-secret"));
            std::move(some.begin(), some.end(), std::back_inserter(all));
        }
        s.signing_secrets = {std::move(all), from_flag("signing-secret")};
    }

    if (auto v = in.env("OUTBOXD_CA_FILE")) s.ca_file = {*v, from_env("OUTBOXD_CA_FILE")};
    if (auto v = in.flag("ca-file")) {
        if (v->empty()) fail(from_flag("ca-file"), "expected a file name, got \"\"");
        s.ca_file = {*v, from_flag("ca-file")};
    }
    if (auto v = in.env("OUTBOXD_INSECURE_SKIP_TLS_VERIFY")) {
        const auto o = from_env("OUTBOXD_INSECURE_SKIP_TLS_VERIFY");
        s.tls_verify = {!bool_from_text(*v, o), o};
    }
    if (auto v = in.flag("insecure-skip-tls-verify")) {
        const auto o = from_flag("insecure-skip-tls-verify");
        s.tls_verify = {!switch_from_text(*v, o), o};
    }
}

// ---- the whole configuration ---------------------------------------------------------

struct top_settings {
    setting<std::string> database_url{{}, builtin("database.url")};
    setting<std::string> schema{"outbox", builtin("database.schema")};
    setting<milliseconds> db_connect_timeout{milliseconds(10'000), builtin("database.connect_timeout")};
    setting<milliseconds> db_keepalive_timeout{milliseconds(10'000), builtin("database.keepalive_timeout")};
    setting<milliseconds> db_statement_timeout{milliseconds(5'000), builtin("database.statement_timeout")};
    setting<std::size_t> concurrency{32, builtin("relay.concurrency")};
    setting<milliseconds> lease{milliseconds(30'000), builtin("relay.lease")};
    setting<milliseconds> sweep_interval{milliseconds(30'000), builtin("relay.sweep_interval")};
    setting<milliseconds> shutdown_timeout{milliseconds(10'000), builtin("relay.shutdown_timeout")};
    setting<std::string> log_level{"info", builtin("relay.log_level")};
    setting<milliseconds> idempotency_retention{milliseconds(7 * 24 * 3'600'000),
                                                builtin("relay.idempotency_retention")};
    setting<milliseconds> dead_letter_retention{milliseconds(30 * 24 * 3'600'000LL),
                                                builtin("relay.dead_letter_retention")};
    setting<bool> block_private_addresses{false, builtin("egress.block_private_addresses")};
};

constexpr milliseconds min_sweep_interval{100};
constexpr milliseconds min_lease{1};
// libpq takes both in whole seconds; it treats a connect_timeout under 2 s as 2 s.
constexpr milliseconds min_db_connect_timeout{2'000};
constexpr milliseconds min_db_keepalive_timeout{1'000};

void read_top_tables(const file_reader& f, const inputs& in, const std::vector<entry>& root, top_settings& top,
                     destination_settings& defaults) {
    for (const auto& section : root) {
        if (section.key == "database") {
            for (const auto& e : entries(f, table_of(section), "database",
                                         {"url", "schema", "connect_timeout", "keepalive_timeout",
                                          "statement_timeout"})) {
                if (e.key == "url") top.database_url = {string_of(e), e.from};
                if (e.key == "connect_timeout") {
                    top.db_connect_timeout = {duration_of(e, min_db_connect_timeout), e.from};
                }
                if (e.key == "keepalive_timeout") {
                    top.db_keepalive_timeout = {duration_of(e, min_db_keepalive_timeout), e.from};
                }
                if (e.key == "statement_timeout") top.db_statement_timeout = {duration_of(e, milliseconds(0)), e.from};
                if (e.key == "schema") {
                    const auto* s = e.node->as_string();
                    if (s == nullptr) fail(e.from, fmt::format("expected a string, got {}", got(*e.node)));
                    top.schema = {schema_checked(s->get(), e.from), e.from};
                }
            }
        } else if (section.key == "relay") {
            for (const auto& e : entries(f, table_of(section), "relay",
                                         {"concurrency", "lease", "sweep_interval", "shutdown_timeout", "log_level",
                                          "idempotency_retention", "dead_letter_retention"})) {
                if (e.key == "concurrency") {
                    top.concurrency = {static_cast<std::size_t>(int_of(e, 1, max_concurrency_limit)), e.from};
                }
                if (e.key == "lease") top.lease = {duration_of(e, min_lease), e.from};
                if (e.key == "sweep_interval") top.sweep_interval = {duration_of(e, min_sweep_interval), e.from};
                if (e.key == "shutdown_timeout") top.shutdown_timeout = {duration_of(e, milliseconds(0)), e.from};
                if (e.key == "idempotency_retention") {
                    top.idempotency_retention = {duration_of(e, milliseconds(0)), e.from};
                }
                if (e.key == "dead_letter_retention") {
                    top.dead_letter_retention = {duration_of(e, milliseconds(0)), e.from};
                }
                if (e.key == "log_level") {
                    const auto* s = e.node->as_string();
                    if (s == nullptr) {
                        fail(e.from, fmt::format("expected debug, info, warn or error, got {}", got(*e.node)));
                    }
                    top.log_level = {log_level_checked(s->get(), e.from, quoted(s->get())), e.from};
                }
            }
        } else if (section.key == "egress") {
            for (const auto& e : entries(f, table_of(section), "egress", {"block_private_addresses"})) {
                top.block_private_addresses = {bool_of(e), e.from};
            }
        } else if (section.key == "defaults") {
            const auto es = entries(f, table_of(section), "defaults",
                                    {"connect_timeout", "request_timeout", "max_concurrency", "signing_secrets",
                                     "signing_secrets_env", "headers", "retry", "tls"});
            refuse_both_secret_keys(es);
            for (const auto& e : es) (void)read_shared(f, in, e, defaults);
        }
    }
}

void apply_env_and_flags(const inputs& in, top_settings& top) {
    auto text_setting = [&](std::string_view env, std::string_view flag, auto&& apply) {
        if (!env.empty()) {
            if (auto v = in.env(env)) apply(*v, from_env(env));
        }
        if (auto v = in.flag(flag)) apply(*v, from_flag(flag));
    };
    text_setting("DATABASE_URL", "database-url", [&](const std::string& v, const origin& o) {
        if (v.empty()) fail(o, "expected a database URL, got \"\"");
        top.database_url = {v, o};
    });
    text_setting("OUTBOXD_SCHEMA", "schema", [&](const std::string& v, const origin& o) {
        top.schema = {schema_checked(v, o), o};
    });
    text_setting("OUTBOXD_DATABASE_CONNECT_TIMEOUT", "database-connect-timeout",
                 [&](const std::string& v, const origin& o) {
                     top.db_connect_timeout = {duration_from_text(v, o, min_db_connect_timeout), o};
                 });
    text_setting("OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT", "database-keepalive-timeout",
                 [&](const std::string& v, const origin& o) {
                     top.db_keepalive_timeout = {duration_from_text(v, o, min_db_keepalive_timeout), o};
                 });
    text_setting("OUTBOXD_DATABASE_STATEMENT_TIMEOUT", "database-statement-timeout",
                 [&](const std::string& v, const origin& o) {
                     top.db_statement_timeout = {duration_from_text(v, o, milliseconds(0)), o};
                 });
    text_setting("OUTBOXD_CONCURRENCY", "concurrency", [&](const std::string& v, const origin& o) {
        top.concurrency = {static_cast<std::size_t>(int_from_text(v, o, 1, max_concurrency_limit)), o};
    });
    text_setting("OUTBOXD_LEASE", "lease", [&](const std::string& v, const origin& o) {
        top.lease = {duration_from_text(v, o, min_lease), o};
    });
    text_setting("OUTBOXD_SWEEP_INTERVAL", "sweep-interval", [&](const std::string& v, const origin& o) {
        top.sweep_interval = {duration_from_text(v, o, min_sweep_interval), o};
    });
    text_setting("OUTBOXD_SHUTDOWN_TIMEOUT", "shutdown-timeout", [&](const std::string& v, const origin& o) {
        top.shutdown_timeout = {duration_from_text(v, o, milliseconds(0)), o};
    });
    text_setting("OUTBOXD_IDEMPOTENCY_RETENTION", "idempotency-retention", [&](const std::string& v, const origin& o) {
        top.idempotency_retention = {duration_from_text(v, o, milliseconds(0)), o};
    });
    text_setting("OUTBOXD_DEAD_LETTER_RETENTION", "dead-letter-retention", [&](const std::string& v, const origin& o) {
        top.dead_letter_retention = {duration_from_text(v, o, milliseconds(0)), o};
    });
    text_setting("OUTBOXD_LOG_LEVEL", "log-level", [&](const std::string& v, const origin& o) {
        top.log_level = {log_level_checked(v, o, quoted(v)), o};
    });
    if (auto v = in.env("OUTBOXD_BLOCK_PRIVATE_ADDRESSES")) {
        const auto o = from_env("OUTBOXD_BLOCK_PRIVATE_ADDRESSES");
        top.block_private_addresses = {bool_from_text(*v, o), o};
    }
    if (auto v = in.flag("block-private-addresses")) {
        const auto o = from_flag("block-private-addresses");
        top.block_private_addresses = {switch_from_text(*v, o), o};
    }
}

// A destination while it is being resolved: its settings, and where it was
// declared (for the messages of cross-checks).
struct pending_destination {
    std::string name;
    transport kind = transport::webhook;
    setting<endpoint_url> url;
    destination_settings settings;
    origin declared;
};

pending_destination read_destination(const file_reader& f, const inputs& in, const entry& d,
                                     const destination_settings& defaults) {
    if (!is_destination_name(d.key)) {
        fail(d.from, "a destination name is 1 to 64 letters, digits, '_' or '-'");
    }
    pending_destination out;
    out.name = std::string(d.key);
    out.declared = d.from;
    out.settings = defaults;
    const auto es = entries(f, table_of(d), d.from.key,
                            {"type", "url", "connect_timeout", "request_timeout", "max_concurrency", "signing_secrets",
                             "signing_secrets_env", "headers", "retry", "tls"});
    refuse_both_secret_keys(es);
    for (const auto& e : es) {
        if (e.key != "type") continue;
        const auto* s = e.node->as_string();
        if (s != nullptr && s->get() == "webhook") {
            out.kind = transport::webhook;
        } else if (s != nullptr && s->get() == "stdout") {
            out.kind = transport::stdout_lines;
        } else {
            fail(e.from, fmt::format("expected \"webhook\" or \"stdout\", got {}", got(*e.node)));
        }
    }
    bool has_url = false;
    for (const auto& e : es) {
        if (e.key == "type") continue;
        if (out.kind == transport::stdout_lines && e.key != "retry") {
            fail(e.from, "does not apply to a stdout destination (only retry does)");
        }
        if (e.key == "url") {
            const auto* s = e.node->as_string();
            if (s == nullptr) fail(e.from, fmt::format("expected a URL string, got {}", got(*e.node)));
            out.url = {url_checked(s->get(), e.from), e.from};
            has_url = true;
        } else {
            (void)read_shared(f, in, e, out.settings);
        }
    }
    if (out.kind == transport::webhook && !has_url) fail(d.from, "missing url (a webhook destination needs one)");
    return out;
}

struct file_routes {
    std::vector<route_config> routes;
    std::vector<origin> declared;  // per route
};

file_routes read_routes(const file_reader& f, const entry& r, const std::vector<pending_destination>& destinations) {
    file_routes out;
    const auto& array = array_of(r, "an array of tables ([[routes]])");
    for (const auto& el : elements(f, array, r.from)) {
        const auto* t = el.node->as_table();
        if (t == nullptr) fail(el.from, fmt::format("expected a table, got {}", got(*el.node)));
        route_config route;
        const auto es = entries(f, *t, el.from.key, {"topics", "topic", "destinations"});
        std::optional<origin> topics_at;
        bool has_destinations = false;
        for (const auto& e : es) {
            if (e.key == "topics" || e.key == "topic") {
                if (topics_at) fail(e.from, "give topics or topic, not both");
                topics_at = e.from;
                std::vector<entry> patterns;
                if (e.key == "topic") {
                    patterns.push_back(e);
                } else {
                    patterns = elements(f, array_of(e, "an array of topic patterns like [\"orders.*\"]"), e.from);
                    if (patterns.empty()) fail(e.from, "expected at least one topic pattern, got []");
                }
                for (const auto& p : patterns) {
                    const auto* s = p.node->as_string();
                    if (s == nullptr) fail(p.from, fmt::format("expected a topic pattern, got {}", got(*p.node)));
                    try {
                        (void)topic_pattern::parse(s->get());
                    } catch (const std::invalid_argument& err) {
                        fail(p.from, err.what());
                    }
                    route.topics.push_back(s->get());
                }
            } else if (e.key == "destinations") {
                has_destinations = true;
                const auto names = elements(f, array_of(e, "an array of destination names like [\"orders\"]"), e.from);
                if (names.empty()) fail(e.from, "expected at least one destination name, got []");
                for (const auto& n : names) {
                    const auto* s = n.node->as_string();
                    if (s == nullptr) fail(n.from, fmt::format("expected a destination name, got {}", got(*n.node)));
                    const bool known = std::any_of(destinations.begin(), destinations.end(),
                                                   [&](const pending_destination& d) { return d.name == s->get(); });
                    if (!known) fail(n.from, fmt::format("no destination named {}", quoted(s->get())));
                    route.destinations.push_back(s->get());
                }
            }
        }
        if (!topics_at) fail(el.from, "missing topics (the patterns this route matches)");
        if (!has_destinations) fail(el.from, "missing destinations (where the matching events go)");
        out.routes.push_back(std::move(route));
        out.declared.push_back(el.from);
    }
    return out;
}

// ---- cross-checks ------------------------------------------------------------------------

void check_destination(const pending_destination& d, const top_settings& top) {
    const auto& s = d.settings;
    if (s.retry_base.value > s.retry_cap.value) {
        fail(s.retry_base.from,
             fmt::format("destination {}: retry base {} must not exceed the retry cap {} ({})", d.name,
                         format_duration(s.retry_base.value), format_duration(s.retry_cap.value),
                         s.retry_cap.from.source()));
    }
    if (d.kind != transport::webhook) return;
    // A lease that could expire while its delivery is still running would let
    // a second relay deliver the same event concurrently.
    const auto attempt = s.connect_timeout.value + s.request_timeout.value;
    if (top.lease.value <= attempt) {
        fail(top.lease.from,
             fmt::format("lease {} must be longer than connect_timeout + request_timeout of destination {} ({}: "
                         "connect_timeout {} {}, request_timeout {} {})",
                         format_duration(top.lease.value), d.name, format_duration(attempt),
                         format_duration(s.connect_timeout.value), s.connect_timeout.from.source(),
                         format_duration(s.request_timeout.value), s.request_timeout.from.source()));
    }
}

destination_config to_config(pending_destination d) {
    destination_config out;
    out.name = std::move(d.name);
    out.kind = d.kind;
    auto& s = d.settings;
    out.retry.base = s.retry_base.value;
    out.retry.cap = s.retry_cap.value;
    out.retry.max_attempts = s.max_attempts.value;
    out.retry.permanent_statuses = std::move(s.permanent_statuses.value);
    out.retry.throttle_statuses = std::move(s.throttle_statuses.value);
    if (out.kind != transport::webhook) return out;  // only retry applies to stdout
    out.url = std::move(d.url.value);
    for (auto& h : s.headers) out.headers.emplace_back(std::move(h.name), std::move(h.value));
    out.connect_timeout = s.connect_timeout.value;
    out.request_timeout = s.request_timeout.value;
    out.max_concurrency = s.max_concurrency.value;
    out.tls.verify = s.tls_verify.value;
    out.tls.ca_file = std::move(s.ca_file.value);
    out.signing_secrets = std::move(s.signing_secrets.value);
    if (const auto& from = s.signing_secrets.from;
        !out.signing_secrets.empty() && from.k == origin::kind::file && !from.key.ends_with("_env")) {
        out.signing_secrets_in_file = from.prefix();
    }
    return out;
}

}  // namespace

namespace {

// What is wrong with a database URL libpq refused. A string that is neither
// a PostgreSQL URL nor key=value settings (a web URL, a bare host name) gets
// the shape that was expected; only its scheme is shown, since the rest may
// hold a password.
std::string database_url_complaint(const std::string& url, const std::string& libpq_error) {
    constexpr std::string_view expected =
        "expected a PostgreSQL URL (postgresql://user@host:5432/dbname) or key=value settings (host=... dbname=...)";
    if (is_uri_dsn(url)) return fmt::format("invalid database URL ({}): {}", redact_dsn(url), libpq_error);
    if (const auto scheme_end = url.find("://"); scheme_end != std::string::npos) {
        const auto scheme = std::string_view(url).substr(0, scheme_end);
        if (!scheme.empty() && std::all_of(scheme.begin(), scheme.end(), [](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
            })) {
            return fmt::format("{}, got a URL of scheme \"{}\"", expected, scheme);
        }
    }
    if (url.find('=') == std::string::npos) {
        return fmt::format("{}, got neither (not shown: it may hold a password)", expected);
    }
    return fmt::format("invalid database URL ({}): {}", redact_dsn(url), libpq_error);
}

}  // namespace

bool valid_destination_name(std::string_view name) noexcept { return is_destination_name(name); }

config resolve_config(const config_sources& sources) {
    const inputs in(sources);
    const file_reader f(sources.file_name.empty() ? std::string("config") : sources.file_name);

    toml::table doc;
    if (sources.file_text) {
        try {
            doc = toml::parse(*sources.file_text, std::string_view(f.name()));
        } catch (const toml::parse_error& e) {
            const auto& p = e.source().begin;
            throw config_error(fmt::format("{}:{}:{}: invalid TOML: {}", f.name(), p.line, p.column, e.description()));
        }
    }
    const auto root = entries(f, doc, "", {"database", "relay", "egress", "defaults", "destinations", "routes"});
    const auto section = [&](std::string_view key) -> const entry* {
        const auto it = std::find_if(root.begin(), root.end(), [&](const entry& e) { return e.key == key; });
        return it == root.end() ? nullptr : &*it;
    };

    top_settings top;
    destination_settings defaults;
    read_top_tables(f, in, root, top, defaults);
    apply_env_and_flags(in, top);
    apply_env_and_flags(in, defaults);

    // Destinations: the single-destination shortcut (--url), or the file's.
    std::vector<pending_destination> destinations;
    std::optional<origin> shortcut;
    std::optional<std::string> shortcut_url;
    if (auto v = in.flag("url")) {
        shortcut = from_flag("url");
        shortcut_url = *v;
    } else if (auto e = in.env("OUTBOXD_WEBHOOK_URL")) {
        shortcut = from_env("OUTBOXD_WEBHOOK_URL");
        shortcut_url = *e;
    }
    std::vector<route_config> routes;
    std::vector<origin> route_declared;
    if (shortcut) {
        if (section("destinations") != nullptr) {
            throw config_error(fmt::format("{} defines the only destination; remove it or the [destinations] of {}",
                                           shortcut->key, f.name()));
        }
        if (section("routes") != nullptr) {
            throw config_error(fmt::format("{} defines the only destination and routes every topic to it; remove it "
                                           "or the [[routes]] of {}",
                                           shortcut->key, f.name()));
        }
        pending_destination d;
        d.name = std::string(default_destination);
        d.declared = *shortcut;
        d.settings = defaults;
        if (*shortcut_url == "stdout") {
            d.kind = transport::stdout_lines;
        } else {
            d.url = {url_checked(*shortcut_url, *shortcut), *shortcut};
        }
        destinations.push_back(std::move(d));
        routes.push_back({{">"}, {std::string(default_destination)}});
        route_declared.push_back(*shortcut);
    } else {
        if (const auto* ds = section("destinations")) {
            for (const auto& d : entries(f, table_of(*ds), "destinations", {})) {
                destinations.push_back(read_destination(f, in, d, defaults));
            }
        }
        if (const auto* rs = section("routes")) {
            auto read = read_routes(f, *rs, destinations);
            routes = std::move(read.routes);
            route_declared = std::move(read.declared);
        }
    }
    if (destinations.empty() && sources.destinations_required) {
        throw config_error(
            "no destination: give --url URL (or OUTBOXD_WEBHOOK_URL), or [destinations.NAME] and [[routes]] in the "
            "configuration file (--config)");
    }
    for (const auto& d : destinations) {
        const bool routed = std::any_of(routes.begin(), routes.end(), [&](const route_config& r) {
            return std::find(r.destinations.begin(), r.destinations.end(), d.name) != r.destinations.end();
        });
        if (!routed) {
            fail(d.declared, "no route sends events to this destination: name it in the destinations of a [[routes]] "
                             "entry, or remove it");
        }
    }

    if (top.database_url.value.empty() && sources.database_required) {
        throw config_error("no database URL: give --database-url, DATABASE_URL or database.url in the configuration file");
    }
    if (sources.database_url_error && !top.database_url.value.empty()) {
        if (const auto error = sources.database_url_error(top.database_url.value)) {
            fail(top.database_url.from, database_url_complaint(top.database_url.value, *error));
        }
    }
    for (const auto& d : destinations) check_destination(d, top);

    config c;
    c.database_url = std::move(top.database_url.value);
    c.schema = std::move(top.schema.value);
    c.db_connect_timeout = top.db_connect_timeout.value;
    c.db_keepalive_timeout = top.db_keepalive_timeout.value;
    c.db_statement_timeout = top.db_statement_timeout.value;
    c.log_level = std::move(top.log_level.value);
    c.concurrency = top.concurrency.value;
    c.lease = top.lease.value;
    c.sweep_interval = top.sweep_interval.value;
    c.shutdown_timeout = top.shutdown_timeout.value;
    c.idempotency_retention = top.idempotency_retention.value;
    c.dead_letter_retention = top.dead_letter_retention.value;
    c.block_private_addresses = top.block_private_addresses.value;
    for (auto& d : destinations) {
        // Unset, a destination may use every delivery slot of the relay: a
        // lower built-in limit would defer deliveries for no reason.
        auto& limit = d.settings.max_concurrency;
        if (limit.from.k == origin::kind::builtin) limit.value = c.concurrency;
        c.destinations.push_back(to_config(std::move(d)));
    }
    c.routes = std::move(routes);
    c.default_retry.base = defaults.retry_base.value;
    c.default_retry.cap = defaults.retry_cap.value;
    c.default_retry.max_attempts = defaults.max_attempts.value;
    c.default_retry.permanent_statuses = defaults.permanent_statuses.value;
    c.default_retry.throttle_statuses = defaults.throttle_statuses.value;
    return c;
}

// ---- render_config --------------------------------------------------------------------------

namespace {

std::string duration_value(milliseconds d) { return quoted(format_duration(d)); }

template <typename Range, typename F>
std::string array_value(const Range& items, F&& item) {
    std::string out = "[";
    bool first = true;
    for (const auto& i : items) {
        if (!first) out += ", ";
        first = false;
        out += item(i);
    }
    out += "]";
    return out;
}

std::string url_text(const endpoint_url& u) { return loggable_url(u); }

}  // namespace

std::string render_config(const config& c) {
    std::string out;
    auto line = [&](std::string_view key, const std::string& value) {
        out += fmt::format("{} = {}\n", key, value);
    };
    out += "# The effective configuration of outboxd; secrets are shown as \"<redacted>\".\n\n";
    out += "[database]\n";
    line("url", quoted(redact_dsn(c.database_url)));
    line("schema", quoted(c.schema));
    line("connect_timeout", duration_value(c.db_connect_timeout));
    line("keepalive_timeout", duration_value(c.db_keepalive_timeout));
    line("statement_timeout", duration_value(c.db_statement_timeout));
    out += "\n[relay]\n";
    line("concurrency", fmt::format("{}", c.concurrency));
    line("lease", duration_value(c.lease));
    line("sweep_interval", duration_value(c.sweep_interval));
    line("shutdown_timeout", duration_value(c.shutdown_timeout));
    line("log_level", quoted(c.log_level));
    line("idempotency_retention", duration_value(c.idempotency_retention));
    line("dead_letter_retention", duration_value(c.dead_letter_retention));
    out += "\n[egress]\n";
    line("block_private_addresses", c.block_private_addresses ? "true" : "false");
    const auto number = [](unsigned s) { return fmt::format("{}", s); };
    const auto string = [](const std::string& s) { return quoted(s); };
    for (const auto& d : c.destinations) {
        const auto table = fmt::format("destinations.{}", key_text(d.name));
        out += fmt::format("\n[{}]\n", table);
        if (d.kind == transport::webhook) {
            line("type", quoted("webhook"));
            line("url", quoted(url_text(d.url)));
            line("connect_timeout", duration_value(d.connect_timeout));
            line("request_timeout", duration_value(d.request_timeout));
            line("max_concurrency", fmt::format("{}", d.max_concurrency));
            line("signing_secrets", array_value(d.signing_secrets, [](const auto&) { return quoted(redacted); }));
            std::string headers = "{";
            for (std::size_t i = 0; i < d.headers.size(); ++i) {
                headers += fmt::format("{} {} = {}", i == 0 ? "" : ",", key_text(d.headers[i].first), quoted(redacted));
            }
            headers += d.headers.empty() ? "}" : " }";
            line("headers", headers);
        } else {
            line("type", quoted("stdout"));
        }
        out += fmt::format("\n[{}.retry]\n", table);
        line("base", duration_value(d.retry.base));
        line("cap", duration_value(d.retry.cap));
        line("max_attempts", fmt::format("{}", d.retry.max_attempts));
        line("permanent_statuses", array_value(d.retry.permanent_statuses, number));
        line("throttle_statuses", array_value(d.retry.throttle_statuses, number));
        if (d.kind == transport::webhook) {
            out += fmt::format("\n[{}.tls]\n", table);
            line("verify", d.tls.verify ? "true" : "false");
            if (d.tls.ca_file) {
                line("ca_file", quoted(*d.tls.ca_file));
            } else {
                out += "# ca_file: not set, the system's CA certificates\n";
            }
        }
    }
    for (const auto& r : c.routes) {
        out += "\n[[routes]]\n";
        line("topics", array_value(r.topics, string));
        line("destinations", array_value(r.destinations, string));
    }
    return out;
}

}  // namespace outboxd
