// The effective configuration: built-in defaults < TOML file < environment <
// flags, validated key by key where each value is read, so every message
// names the value's own source. Which settings exist, their spellings,
// bounds and members are the rows of config_table.cpp; this file reads them.
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
#include <span>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "core/config_table.hpp"
#include "core/dsn.hpp"
#include "core/duration.hpp"
#include "core/http_token.hpp"
#include "core/integer.hpp"
#include "core/listen_address.hpp"
#include "core/sql_ident.hpp"
#include "core/toml_text.hpp"
#include "core/topic_pattern.hpp"
#include "core/webhook_request.hpp"
#include "nats/subject.hpp"

namespace outboxd {
namespace {

using std::chrono::milliseconds;
using settings::kind;
using settings::row;
using settings::expected_one_of;
using settings::value;

constexpr std::string_view default_destination = "default";

// ---- text helpers -----------------------------------------------------------

// How messages quote a value (and how TOML spells a string).
std::string quoted(std::string_view raw) { return toml_quoted(raw); }

std::string child(std::string_view path, std::string_view key) {
    return path.empty() ? toml_key(key) : fmt::format("{}.{}", path, toml_key(key));
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

// The settings of one table of rows (config_table.hpp) while they are
// resolved: their values, and where each came from.
template <typename Owner>
struct layer {
    std::span<const row<Owner>> rows;
    Owner values{};
    std::vector<origin> from;

    // Built-in defaults; `path` is how messages name the layer's keys ("defaults.").
    layer(std::span<const row<Owner>> r, std::string_view path) : rows(r) {
        for (const auto& s : rows) from.push_back(builtin(fmt::format("{}{}", path, s.key)));
    }

    void assign(std::size_t i, value v, origin o) {
        const auto& r = rows[i];
        if (r.value.k == kind::headers) {
            // Per name: a destination's header replaces an inherited one.
            auto merged = std::get<header_list>(r.at.get(values));
            for (auto& h : std::get<header_list>(v)) {
                std::erase_if(merged, [&](const auto& old) { return same_header_name(old.first, h.first); });
                merged.push_back(std::move(h));
            }
            v = std::move(merged);
        }
        r.at.set(values, std::move(v));
        from[i] = std::move(o);
    }
    [[nodiscard]] const origin& origin_of(std::string_view key) const {
        for (std::size_t i = 0; i < rows.size(); ++i) {
            if (rows[i].key == key) return from[i];
        }
        throw std::logic_error(fmt::format("no setting {}", key));
    }
};

using relay_layer = layer<config>;
using destination_layer = layer<destination_config>;

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

milliseconds duration_checked(std::string_view text, const origin& o, milliseconds min, milliseconds max,
                              std::string_view got) {
    milliseconds d{};
    try {
        d = parse_duration(text);
    } catch (const std::invalid_argument&) {
        fail(o, fmt::format("expected a duration like \"5s\" or \"250ms\", got {}", got));
    }
    if (d < min || d > max) {
        fail(o, max == milliseconds::max()
                    ? fmt::format("expected a duration of at least {}, got {}", format_duration(min), got)
                    : fmt::format("expected a duration from {} to {}, got {}", format_duration(min),
                                  format_duration(max), got));
    }
    return d;
}

// A flag without a value means true: --block-private-addresses. (An empty
// environment variable never gets here: it counts as unset.)
bool bool_from_text(std::string_view text, const origin& o) {
    if (text.empty() || text == "true") return true;
    if (text == "false") return false;
    fail(o, fmt::format("expected true or false, got {}", quoted(text)));
}

std::vector<unsigned> statuses_from_text(std::string_view text, const origin& o) {
    try {
        return parse_status_list(text);
    } catch (const std::invalid_argument& e) {
        fail(o, e.what());
    }
}

std::string subject_checked(std::string_view text, const origin& o) {
    if (const auto why = nats::subject_template_error(text)) fail(o, fmt::format("{}, got {}", *why, quoted(text)));
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

bool is_one_of(std::string_view text, std::span<const std::string_view> choices) {
    return std::find(choices.begin(), choices.end(), text) != choices.end();
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

std::string non_empty(std::string_view text, const origin& o, std::string_view what) {
    if (text.empty()) fail(o, fmt::format("expected {}, got \"\"", what));
    return std::string(text);
}

// "" (none) or HOST:PORT.
std::string address_checked(std::string_view text, const origin& o) {
    if (text.empty()) return {};
    try {
        (void)parse_listen_address(text);
    } catch (const std::invalid_argument& e) {
        fail(o, fmt::format("{}, got {}", e.what(), quoted(text)));
    }
    return std::string(text);
}

// A setting's value from an environment variable or a flag.
value from_text(const settings::rule& r, std::string_view text, const origin& o) {
    switch (r.k) {
        case kind::duration: return duration_checked(text, o, r.min, r.max, quoted(text));
        case kind::integer: return int_from_text(text, o, r.lo, r.hi);
        case kind::boolean: return bool_from_text(text, o) != r.negated_outside_file;
        case kind::one_of:
            if (!is_one_of(text, r.choices)) fail(o, fmt::format("{}, got {}", expected_one_of(r.choices), quoted(text)));
            return std::string(text);
        case kind::schema: return schema_checked(text, o);
        case kind::subject: return subject_checked(text, o);
        case kind::dsn: return non_empty(text, o, "a database URL");
        case kind::file_name: return std::optional<std::string>(non_empty(text, o, "a file name"));
        case kind::listen_address: return address_checked(text, o);
        case kind::statuses: return statuses_from_text(text, o);
        case kind::secrets: return secrets_from_text(text, o);
        case kind::headers: break;
    }
    throw std::logic_error("this setting has no environment variable or flag");
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

// Where a key lives that was put in the wrong table: "relay.lease", or
// "defaults.retry.base (or destinations.NAME.retry.base)". Empty if none.
std::string home_of(std::string_view key) {
    const auto last = [](std::string_view k) { return k.substr(k.rfind('.') + 1); };
    for (const auto& r : settings::destination_rows()) {
        for (const auto k : {r.key, r.by_env_key}) {
            if (!k.empty() && last(k) == key) return fmt::format("defaults.{0} (or destinations.NAME.{0})", k);
        }
    }
    for (const auto& r : settings::relay_rows()) {
        if (last(r.key) == key) return std::string(r.key);
    }
    return {};
}

// "; did you mean relay.concurrency?" for an unknown key: a close spelling
// of a key of the same table, or the table where that key lives.
std::string suggestion(std::string_view path, std::string_view key, std::span<const std::string_view> allowed) {
    std::string_view best;
    std::size_t best_distance = std::max<std::size_t>(1, key.size() / 4) + 1;
    for (const auto candidate : allowed) {
        if (const auto d = distance(key, candidate); d < best_distance) {
            best = candidate;
            best_distance = d;
        }
    }
    if (!best.empty()) return fmt::format("; did you mean {}?", child(path, best));
    if (auto home = home_of(key); !home.empty()) return fmt::format("; did you mean {}?", home);
    return {};
}

// The table's entries in file order (toml++ keeps them sorted by key), after
// refusing any key not in `allowed` (the typo guard). An empty `allowed`
// accepts every key (header names, destination names).
std::vector<entry> entries(const file_reader& f, const toml::table& t, std::string_view path,
                           std::span<const std::string_view> allowed) {
    std::vector<std::pair<const toml::key*, const toml::node*>> items;
    for (const auto& [k, v] : t) items.emplace_back(&k, &v);
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return before(a.first->source().begin, b.first->source().begin); });
    std::vector<entry> out;
    for (const auto& [k, v] : items) {
        const auto key = k->str();
        auto o = f.at(k->source(), child(path, key));
        if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
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

milliseconds duration_of(const entry& e, milliseconds min, milliseconds max) {
    if (const auto* s = e.node->as_string()) return duration_checked(s->get(), e.from, min, max, quoted(s->get()));
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

// Header values may be secret (tokens): no message shows one.
header_list headers_of(const file_reader& f, const entry& e) {
    header_list out;
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
        const auto dup = std::find_if(out.begin(), out.end(), [&](const auto& o) { return same_header_name(o.first, name); });
        if (dup != out.end()) fail(h.from, fmt::format("the same header as {} (names are case-insensitive)", dup->first));
        out.emplace_back(name, value->get());
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

// A setting's value from the file.
value from_file(const settings::rule& r, const file_reader& f, const entry& e) {
    switch (r.k) {
        case kind::duration: return duration_of(e, r.min, r.max);
        case kind::integer: return int_of(e, r.lo, r.hi);
        case kind::boolean: return bool_of(e);
        case kind::one_of: {
            const auto* s = e.node->as_string();
            if (s == nullptr || !is_one_of(s->get(), r.choices)) {
                fail(e.from, fmt::format("{}, got {}", expected_one_of(r.choices), got(*e.node)));
            }
            return s->get();
        }
        case kind::schema: {
            const auto* s = e.node->as_string();
            if (s == nullptr) fail(e.from, fmt::format("expected a string, got {}", got(*e.node)));
            return schema_checked(s->get(), e.from);
        }
        case kind::subject: {
            const auto* s = e.node->as_string();
            if (s == nullptr) fail(e.from, fmt::format("expected a string, got {}", got(*e.node)));
            return subject_checked(s->get(), e.from);
        }
        case kind::dsn: return string_of(e);
        case kind::file_name: return std::optional<std::string>(string_of(e));
        case kind::listen_address: {
            const auto* s = e.node->as_string();
            if (s == nullptr) fail(e.from, fmt::format("expected a string, got {}", got(*e.node)));
            return address_checked(s->get(), e.from);
        }
        case kind::statuses: return statuses_of(f, e);
        case kind::secrets: return secrets_of(f, e);
        case kind::headers: return headers_of(f, e);
    }
    throw std::logic_error("unknown kind of setting");
}

// signing_secrets_env = "NAME": the secrets from that variable.
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

// ---- reading a table of rows ----------------------------------------------------------

// The keys a table at `prefix` may hold: the next part of every row's key
// under it ("retry" for "retry.base" at ""), and the by_env_key spellings.
template <typename Owner>
std::vector<std::string_view> keys_under(std::span<const row<Owner>> rows, std::string_view prefix) {
    std::vector<std::string_view> out;
    const auto add = [&](std::string_view key) {
        if (!key.starts_with(prefix)) return;
        key.remove_prefix(prefix.size());
        key = key.substr(0, key.find('.'));
        if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
    };
    for (const auto& r : rows) {
        add(r.key);
        if (!r.by_env_key.empty()) add(r.by_env_key);
    }
    return out;
}

template <typename Owner>
void refuse_both_spellings(std::span<const row<Owner>> rows, std::string_view prefix, const std::vector<entry>& es) {
    const auto find = [&](std::string_view key) {
        return std::find_if(es.begin(), es.end(), [&](const entry& e) { return fmt::format("{}{}", prefix, e.key) == key; });
    };
    for (const auto& r : rows) {
        if (r.by_env_key.empty()) continue;
        if (const auto a = find(r.key), b = find(r.by_env_key); a != es.end() && b != es.end()) {
            fail(b->from, fmt::format("give {} or {}, not both", a->key, b->key));
        }
    }
}

template <typename Owner>
void read_entries(const file_reader& f, const inputs& in, const std::vector<entry>& es, std::string_view prefix,
                  layer<Owner>& into);

// Reads `e` of the table at `prefix` into `into`: a setting, or a table of
// them (retry, tls, relay). False when it is neither (a destination's url).
template <typename Owner>
bool read_entry(const file_reader& f, const inputs& in, const entry& e, std::string_view prefix, layer<Owner>& into) {
    const auto key = fmt::format("{}{}", prefix, e.key);
    for (std::size_t i = 0; i < into.rows.size(); ++i) {
        const auto& r = into.rows[i];
        if (r.key == key) {
            into.assign(i, from_file(r.value, f, e), e.from);
            return true;
        }
        if (r.by_env_key == key) {
            into.assign(i, secrets_from_env_var(in, e), e.from);
            return true;
        }
    }
    const auto table = key + ".";
    const auto under = keys_under(into.rows, table);
    if (under.empty()) return false;
    read_entries(f, in, entries(f, table_of(e), e.from.key, under), table, into);
    return true;
}

template <typename Owner>
void read_entries(const file_reader& f, const inputs& in, const std::vector<entry>& es, std::string_view prefix,
                  layer<Owner>& into) {
    refuse_both_spellings(into.rows, prefix, es);
    for (const auto& e : es) (void)read_entry(f, in, e, prefix, into);
}

// Environment, then flags, over the file: for [defaults], over the file's
// [defaults] only (a destination's own keys win over both).
template <typename Owner>
void apply_env_and_flags(const inputs& in, layer<Owner>& into) {
    for (std::size_t i = 0; i < into.rows.size(); ++i) {
        const auto& r = into.rows[i];
        if (!r.env.empty()) {
            if (auto v = in.env(r.env)) into.assign(i, from_text(r.value, *v, from_env(r.env)), from_env(r.env));
        }
        if (r.flag.empty()) continue;
        if (r.value.k == kind::secrets) {
            // Repeatable, each value space-separated: all of them together.
            const auto values = in.flag_values(r.flag);
            if (values.empty()) continue;
            std::vector<signing_secret> all;
            for (const auto& text : values) {
                auto some = secrets_from_text(text, from_flag(r.flag));
                std::move(some.begin(), some.end(), std::back_inserter(all));
            }
            into.assign(i, std::move(all), from_flag(r.flag));
        } else if (auto v = in.flag(r.flag)) {
            into.assign(i, from_text(r.value, *v, from_flag(r.flag)), from_flag(r.flag));
        }
    }
}

// ---- destinations and routes -------------------------------------------------------

// A destination while it is being resolved: its settings, and where it was
// declared (for the messages of cross-checks).
struct pending_destination {
    std::string name;
    transport kind = transport::webhook;
    endpoint_url url;
    std::string nats_servers;  // a nats destination's url
    destination_layer settings;
    origin declared;
};

pending_destination read_destination(const file_reader& f, const inputs& in, const entry& d,
                                     const destination_layer& defaults) {
    if (!is_destination_name(d.key)) {
        fail(d.from, "a destination name is 1 to 64 letters, digits, '_' or '-'");
    }
    pending_destination out{std::string(d.key), transport::webhook, {}, {}, defaults, d.from};
    std::vector<std::string_view> allowed{"type", "url"};  // a destination's own, not inherited
    for (const auto key : keys_under(settings::destination_rows(), "")) allowed.push_back(key);
    const auto es = entries(f, table_of(d), d.from.key, allowed);
    refuse_both_spellings(settings::destination_rows(), "", es);
    for (const auto& e : es) {
        if (e.key != "type") continue;
        const auto* s = e.node->as_string();
        if (s != nullptr && s->get() == "webhook") {
            out.kind = transport::webhook;
        } else if (s != nullptr && s->get() == "stdout") {
            out.kind = transport::stdout_lines;
        } else if (s != nullptr && s->get() == "nats") {
            out.kind = transport::nats;
        } else {
            fail(e.from, fmt::format("expected \"webhook\", \"stdout\" or \"nats\", got {}", got(*e.node)));
        }
    }
    bool has_url = false;
    for (const auto& e : es) {
        if (e.key == "type") continue;
        if (out.kind == transport::stdout_lines && !settings::applies_to_stdout(e.key)) {
            fail(e.from, "does not apply to a stdout destination (only retry does)");
        }
        if (e.key != "url" && !settings::applies_to(out.kind, e.key)) {
            fail(e.from, out.kind == transport::nats ? "does not apply to a nats destination"
                                                     : "applies to a nats destination only");
        }
        if (e.key == "url" && out.kind == transport::nats) {
            const auto* s = e.node->as_string();
            if (s == nullptr) fail(e.from, fmt::format("expected a string of NATS server URLs, got {}", got(*e.node)));
            try {
                (void)nats::parse_servers(s->get());
            } catch (const std::invalid_argument& err) {
                // The URL is not repeated: it may hold a password.
                fail(e.from, err.what());
            }
            out.nats_servers = s->get();
            has_url = true;
        } else if (e.key == "url") {
            const auto* s = e.node->as_string();
            if (s == nullptr) fail(e.from, fmt::format("expected a URL string, got {}", got(*e.node)));
            out.url = url_checked(s->get(), e.from);
            has_url = true;
        } else {
            (void)read_entry(f, in, e, "", out.settings);
        }
    }
    if (out.kind == transport::webhook && !has_url) fail(d.from, "missing url (a webhook destination needs one)");
    if (out.kind == transport::nats && !has_url) {
        fail(d.from, "missing url (a nats destination needs its servers: \"nats://host:4222\")");
    }
    return out;
}

struct file_routes {
    std::vector<route_config> routes;
    std::vector<origin> declared;  // per route
};

constexpr std::array<std::string_view, 3> route_keys{"topics", "topic", "destinations"};

file_routes read_routes(const file_reader& f, const entry& r, const std::vector<pending_destination>& destinations) {
    file_routes out;
    const auto& array = array_of(r, "an array of tables ([[routes]])");
    for (const auto& el : elements(f, array, r.from)) {
        const auto* t = el.node->as_table();
        if (t == nullptr) fail(el.from, fmt::format("expected a table, got {}", got(*el.node)));
        route_config route;
        const auto es = entries(f, *t, el.from.key, route_keys);
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

void check_destination(const pending_destination& d, const relay_layer& top) {
    const auto& s = d.settings.values;
    const auto& base_from = d.settings.origin_of("retry.base");
    if (s.retry.base > s.retry.cap) {
        fail(base_from, fmt::format("destination {}: retry base {} must not exceed the retry cap {} ({})", d.name,
                                    format_duration(s.retry.base), format_duration(s.retry.cap),
                                    d.settings.origin_of("retry.cap").source()));
    }
    if (d.kind == transport::stdout_lines) return;
    // A lease that could expire while its delivery is still running would let
    // a second relay deliver the same event concurrently.
    const auto attempt = s.connect_timeout + s.request_timeout;
    const auto lease = top.values.lease;
    if (lease <= attempt) {
        fail(top.origin_of("relay.lease"),
             fmt::format("lease {} must be longer than connect_timeout + request_timeout of destination {} ({}: "
                         "connect_timeout {} {}, request_timeout {} {})",
                         format_duration(lease), d.name, format_duration(attempt), format_duration(s.connect_timeout),
                         d.settings.origin_of("connect_timeout").source(), format_duration(s.request_timeout),
                         d.settings.origin_of("request_timeout").source()));
    }
}

destination_config to_config(pending_destination d, std::size_t relay_concurrency) {
    const bool secrets_in_file = [&] {
        const auto& from = d.settings.origin_of("signing_secrets");
        return from.k == origin::kind::file && !from.key.ends_with("_env");
    }();
    const bool max_concurrency_unset = d.settings.origin_of("max_concurrency").k == origin::kind::builtin;
    destination_config out;
    if (d.kind == transport::webhook || d.kind == transport::nats) {
        out = std::move(d.settings.values);
        out.url = std::move(d.url);
        out.nats.servers = std::move(d.nats_servers);
        // Unset, a destination may use every delivery slot of the relay: a
        // lower built-in limit would defer deliveries for no reason.
        if (max_concurrency_unset) out.max_concurrency = relay_concurrency;
        if (secrets_in_file && !out.signing_secrets.empty()) {
            out.signing_secrets_in_file = d.settings.origin_of("signing_secrets").prefix();
        }
    } else {
        out.retry = std::move(d.settings.values.retry);  // only retry applies to stdout
    }
    out.name = std::move(d.name);
    out.kind = d.kind;
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
    auto sections = keys_under(settings::relay_rows(), "");  // database, relay, egress
    for (const auto key : {"defaults", "destinations", "routes"}) sections.emplace_back(key);
    const auto root = entries(f, doc, "", sections);
    const auto section = [&](std::string_view key) -> const entry* {
        const auto it = std::find_if(root.begin(), root.end(), [&](const entry& e) { return e.key == key; });
        return it == root.end() ? nullptr : &*it;
    };

    relay_layer top(settings::relay_rows(), "");
    destination_layer defaults(settings::destination_rows(), "defaults.");
    for (const auto& e : root) {
        if (e.key == "defaults") {
            const auto keys = keys_under(settings::destination_rows(), "");
            read_entries(f, in, entries(f, table_of(e), "defaults", keys), "", defaults);
        } else if (e.key != "destinations" && e.key != "routes") {
            (void)read_entry(f, in, e, "", top);
        }
    }
    apply_env_and_flags(in, top);
    apply_env_and_flags(in, defaults);

    // Destinations: the single-destination shortcut (--url), or the file's.
    std::vector<pending_destination> destinations;
    std::optional<origin> shortcut;
    std::optional<std::string> shortcut_url;
    if (auto v = in.flag(settings::shortcut_flag)) {
        shortcut = from_flag(settings::shortcut_flag);
        shortcut_url = *v;
    } else if (auto e = in.env(settings::shortcut_env)) {
        shortcut = from_env(settings::shortcut_env);
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
        pending_destination d{std::string(default_destination), transport::webhook, {}, {}, defaults, *shortcut};
        if (*shortcut_url == "stdout") {
            d.kind = transport::stdout_lines;
        } else {
            d.url = url_checked(*shortcut_url, *shortcut);
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

    const auto& database_url = top.values.database_url;
    if (database_url.empty() && sources.database_required) {
        throw config_error("no database URL: give --database-url, DATABASE_URL or database.url in the configuration file");
    }
    if (sources.database_url_error && !database_url.empty()) {
        if (const auto error = sources.database_url_error(database_url)) {
            fail(top.origin_of("database.url"), database_url_complaint(database_url, *error));
        }
    }
    for (const auto& d : destinations) check_destination(d, top);

    config c = std::move(top.values);
    for (auto& d : destinations) c.destinations.push_back(to_config(std::move(d), c.concurrency));
    c.routes = std::move(routes);
    // [defaults.retry] after environment and flags: for events no route matches.
    c.default_retry = std::move(defaults.values.retry);
    return c;
}

}  // namespace outboxd
