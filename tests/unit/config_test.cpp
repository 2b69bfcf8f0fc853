#include "core/config.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/signing.hpp"

using namespace outboxd;
using namespace std::chrono_literals;

namespace {

// Valid Standard Webhooks secrets (24 key bytes each); the middle of each is
// what a leak would show.
constexpr std::string_view secret_a = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::string_view secret_b = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
constexpr std::string_view password = "hunter2pw";
constexpr std::string_view header_secret = "Bearer tok3n-value";

// The process's inputs, faked.
struct fake {
    std::string file;  // empty: no file (the same as an empty one)
    std::string file_name = "t.toml";
    std::map<std::string, std::string, std::less<>> env;
    std::map<std::string, std::vector<std::string>, std::less<>> flags;
    std::function<std::optional<std::string>(const std::string&)> database_url_error;
    bool destinations_required = true;
    bool database_required = true;

    [[nodiscard]] config_sources sources() const {
        config_sources s;
        if (!file.empty()) s.file_text = file;
        s.file_name = file_name;
        s.env = [this](std::string_view name) -> std::optional<std::string> {
            const auto it = env.find(name);
            if (it == env.end()) return std::nullopt;
            return it->second;
        };
        s.flags = [this](std::string_view name) {
            const auto it = flags.find(name);
            return it == flags.end() ? std::vector<std::string>{} : it->second;
        };
        s.database_url_error = database_url_error;
        s.destinations_required = destinations_required;
        s.database_required = database_required;
        return s;
    }
};

config resolve(const fake& f) { return resolve_config(f.sources()); }

std::string error_of(const fake& f) {
    try {
        (void)resolve(f);
    } catch (const config_error& e) {
        return e.what();
    }
    return "(no error)";
}

// A file whose only problem is `body`; the database URL comes from the
// environment so that the file needs nothing else.
fake file_only(std::string body) {
    fake f;
    f.file = std::move(body);
    f.env["DATABASE_URL"] = "postgresql://outboxd@db/app";
    return f;
}

// The minimum beside `body` for a file with a destination.
constexpr std::string_view one_destination = R"(
[destinations.d]
url = "http://h/"
[[routes]]
topics = [">"]
destinations = ["d"]
)";

std::vector<unsigned> statuses(std::initializer_list<unsigned> s) { return s; }

std::string read_file(const char* path) {
    std::ifstream in(path);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
    for (auto pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
        s.replace(pos, from.size(), to);
    }
}

bool leaks(std::string_view text) {
    return text.find(password) != std::string_view::npos || text.find(header_secret) != std::string_view::npos ||
           text.find("MfKQ9r8G") != std::string_view::npos || text.find("AAAAAAAAAAAA") != std::string_view::npos;
}

}  // namespace

// ---- happy paths ------------------------------------------------------------------

TEST_CASE("config: a complete file gives every field") {
    fake f;
    f.file = R"(# a full configuration
[database]
url = "postgresql://outboxd:hunter2pw@db/app"
schema = "events"

[relay]
concurrency = 64
lease = "45s"
sweep_interval = "250ms"
busy_gap = "20ms"
shutdown_timeout = "3s"
log_level = "debug"
dead_letter_retention = "2160h"

[egress]
block_private_addresses = true

[defaults]
connect_timeout = "2s"
request_timeout = "4s"
max_concurrency = 16
signing_secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
headers = { X-Env = "prod", Authorization = "Bearer tok3n-value" }

[defaults.retry]
base = "1s"
cap = "1h"
max_attempts = 7
permanent_statuses = [410, 422]
throttle_statuses = [429]

[defaults.tls]
ca_file = "/etc/ca.pem"
verify = false

[destinations.orders]
type = "webhook"
url = "https://orders.example.com:8443/hook?x=1"
connect_timeout = "1s"
request_timeout = "9s"
max_concurrency = 2
signing_secrets_env = "ORDERS_SECRETS"
headers = { x-env = "staging", X-Orders = "1" }
retry = { base = "2s", max_attempts = 3 }
tls = { verify = true }

[destinations.audit]
type = "stdout"
retry = { max_attempts = 1 }

[destinations.plain]
url = "http://plain.internal/"
signing_secrets = []

[[routes]]
topics = ["orders.*", "billing.>"]
destinations = ["orders", "audit"]

[[routes]]
topic = "plain.event"
destinations = ["plain"]
)";
    f.env["ORDERS_SECRETS"] = std::string(secret_a) + " " + std::string(secret_b);
    const auto c = resolve(f);

    CHECK(c.database_url == "postgresql://outboxd:hunter2pw@db/app");
    CHECK(c.schema == "events");
    CHECK(c.concurrency == 64);
    CHECK(c.lease == 45s);
    CHECK(c.sweep_interval == 250ms);
    CHECK(c.busy_gap == 20ms);
    CHECK(c.shutdown_timeout == 3s);
    CHECK(c.log_level == "debug");
    CHECK(c.dead_letter_retention == 2160h);
    CHECK(c.block_private_addresses);

    REQUIRE(c.destinations.size() == 3);
    // file order, not alphabetical
    const auto& orders = c.destinations[0];
    const auto& audit = c.destinations[1];
    const auto& plain = c.destinations[2];
    CHECK(orders.name == "orders");
    CHECK(audit.name == "audit");
    CHECK(plain.name == "plain");

    CHECK(orders.kind == transport::webhook);
    CHECK(orders.url.scheme == "https");
    CHECK(orders.url.host == "orders.example.com");
    CHECK(orders.url.port == "8443");
    CHECK(orders.url.target == "/hook?x=1");
    CHECK(orders.connect_timeout == 1s);
    CHECK(orders.request_timeout == 9s);
    CHECK(orders.max_concurrency == 2);
    REQUIRE(orders.signing_secrets.size() == 2);
    CHECK(orders.signing_secrets[0].key() == signing_secret::parse(secret_a).key());
    CHECK(orders.signing_secrets[1].key() == signing_secret::parse(secret_b).key());
    // headers merge per name, case-insensitively; the destination's win
    CHECK(orders.headers == header_list{{"Authorization", std::string(header_secret)},
                                        {"x-env", "staging"},
                                        {"X-Orders", "1"}});
    // retry merges per key
    CHECK(orders.retry.base == 2s);
    CHECK(orders.retry.cap == 1h);
    CHECK(orders.retry.max_attempts == 3);
    CHECK(orders.retry.permanent_statuses == statuses({410, 422}));
    CHECK(orders.retry.throttle_statuses == statuses({429}));
    // tls merges per key
    CHECK(orders.tls.verify);
    CHECK(orders.tls.ca_file == "/etc/ca.pem");

    CHECK(audit.kind == transport::stdout_lines);
    CHECK(audit.retry.base == 1s);
    CHECK(audit.retry.max_attempts == 1);
    CHECK(audit.signing_secrets.empty());
    CHECK(audit.headers.empty());

    // everything inherited from [defaults]; an empty list turns signing off
    CHECK(plain.url.host == "plain.internal");
    CHECK(plain.connect_timeout == 2s);
    CHECK(plain.request_timeout == 4s);
    CHECK(plain.max_concurrency == 16);
    CHECK(plain.signing_secrets.empty());
    CHECK(plain.headers == header_list{{"X-Env", "prod"}, {"Authorization", std::string(header_secret)}});  // file order
    CHECK(plain.retry.base == 1s);
    CHECK(plain.retry.max_attempts == 7);
    CHECK_FALSE(plain.tls.verify);
    CHECK(plain.tls.ca_file == "/etc/ca.pem");

    REQUIRE(c.routes.size() == 2);
    CHECK(c.routes[0].topics == std::vector<std::string>{"orders.*", "billing.>"});
    CHECK(c.routes[0].destinations == std::vector<std::string>{"orders", "audit"});
    CHECK(c.routes[1].topics == std::vector<std::string>{"plain.event"});
    CHECK(c.routes[1].destinations == std::vector<std::string>{"plain"});
}

TEST_CASE("config: built-in defaults with only the --url shortcut") {
    fake f;
    f.env["DATABASE_URL"] = "postgresql://db/app";
    f.flags["url"] = {"http://127.0.0.1:8080/hook"};
    const auto c = resolve(f);
    CHECK(c.schema == "outbox");
    CHECK(c.log_level == "info");
    CHECK(c.concurrency == 32);
    CHECK(c.lease == 30s);
    CHECK(c.sweep_interval == 30s);
    CHECK(c.busy_gap == 5ms);
    CHECK(c.shutdown_timeout == 10s);
    CHECK(c.dead_letter_retention == 720h);  // 30 days
    CHECK_FALSE(c.block_private_addresses);
    REQUIRE(c.destinations.size() == 1);
    const auto& d = c.destinations[0];
    CHECK(d.name == "default");
    CHECK(d.kind == transport::webhook);
    CHECK(d.url.host_header == "127.0.0.1:8080");
    CHECK(d.url.target == "/hook");
    CHECK(d.connect_timeout == 5s);
    CHECK(d.request_timeout == 10s);
    CHECK(d.max_concurrency == 32);
    CHECK(d.signing_secrets.empty());
    CHECK(d.headers.empty());
    CHECK(d.tls.verify);
    CHECK_FALSE(d.tls.ca_file);
    CHECK(d.retry.base == 5s);
    CHECK(d.retry.cap == 6h);
    CHECK(d.retry.max_attempts == 20);
    CHECK(d.retry.permanent_statuses == statuses({410}));
    CHECK(d.retry.throttle_statuses == statuses({429, 502, 503, 504}));
    REQUIRE(c.routes.size() == 1);
    CHECK(c.routes[0].topics == std::vector<std::string>{">"});
    CHECK(c.routes[0].destinations == std::vector<std::string>{"default"});
}

TEST_CASE("config: every flag of today's `outboxd run` keeps its meaning") {
    fake f;
    f.flags = {
        {"database-url", {"postgresql://db/app"}},
        {"schema", {"s1"}},
        {"log-level", {"warn"}},
        {"url", {"http://h/x"}},
        {"concurrency", {"8"}},
        {"lease", {"2s"}},
        {"sweep-interval", {"1h"}},
        {"connect-timeout", {"500ms"}},
        {"request-timeout", {"1s"}},
        {"retry-base", {"50ms"}},
        {"retry-cap", {"200ms"}},
        {"max-attempts", {"3"}},
        {"shutdown-timeout", {"0s"}},
        {"dead-letter-retention", {"48h"}},
        {"permanent-statuses", {""}},  // empty: none
        {"throttle-statuses", {"429, 503"}},
        {"signing-secret", {std::string(secret_a), std::string(secret_b) + " " + std::string(secret_a)}},
        {"block-private-addresses", {""}},
        {"insecure-skip-tls-verify", {""}},
        {"ca-file", {"/ca.pem"}},
    };
    const auto c = resolve(f);
    CHECK(c.database_url == "postgresql://db/app");
    CHECK(c.schema == "s1");
    CHECK(c.log_level == "warn");
    CHECK(c.concurrency == 8);
    CHECK(c.lease == 2s);
    CHECK(c.sweep_interval == 1h);
    CHECK(c.shutdown_timeout == 0s);
    CHECK(c.dead_letter_retention == 48h);
    CHECK(c.block_private_addresses);
    const auto& d = c.destinations.at(0);
    CHECK(d.url.target == "/x");
    CHECK(d.connect_timeout == 500ms);
    CHECK(d.request_timeout == 1s);
    CHECK(d.retry.base == 50ms);
    CHECK(d.retry.cap == 200ms);
    CHECK(d.retry.max_attempts == 3);
    CHECK(d.retry.permanent_statuses.empty());
    CHECK(d.retry.throttle_statuses == statuses({429, 503}));
    CHECK(d.signing_secrets.size() == 3);  // repeatable, each space-separated
    CHECK_FALSE(d.tls.verify);
    CHECK(d.tls.ca_file == "/ca.pem");
}

TEST_CASE("config: every environment variable") {
    fake f;
    f.env = {
        {"DATABASE_URL", "postgresql://db/app"},
        {"OUTBOXD_SCHEMA", "s2"},
        {"OUTBOXD_LOG_LEVEL", "error"},
        {"OUTBOXD_WEBHOOK_URL", "http://h/env"},
        {"OUTBOXD_CONCURRENCY", "9"},
        {"OUTBOXD_LEASE", "40s"},
        {"OUTBOXD_SWEEP_INTERVAL", "5s"},
        {"OUTBOXD_BUSY_GAP", "40ms"},
        {"OUTBOXD_SHUTDOWN_TIMEOUT", "1m"},
        {"OUTBOXD_BLOCK_PRIVATE_ADDRESSES", "true"},
        {"OUTBOXD_CONNECT_TIMEOUT", "3s"},
        {"OUTBOXD_REQUEST_TIMEOUT", "6s"},
        {"OUTBOXD_RETRY_BASE", "10s"},
        {"OUTBOXD_RETRY_CAP", "1h"},
        {"OUTBOXD_MAX_ATTEMPTS", "11"},
        {"OUTBOXD_PERMANENT_STATUSES", "410,451"},
        {"OUTBOXD_THROTTLE_STATUSES", "503"},
        {"OUTBOXD_SIGNING_SECRETS", std::string(secret_a) + " " + std::string(secret_b)},
        {"OUTBOXD_CA_FILE", "/env-ca.pem"},
        {"OUTBOXD_DEAD_LETTER_RETENTION", "0s"},
        {"OUTBOXD_INSECURE_SKIP_TLS_VERIFY", "true"},
        {"OUTBOXD_SOMETHING_NEW", "ignored"},  // unknown OUTBOXD_* variables are not errors
    };
    const auto c = resolve(f);
    CHECK(c.schema == "s2");
    CHECK(c.log_level == "error");
    CHECK(c.concurrency == 9);
    CHECK(c.lease == 40s);
    CHECK(c.sweep_interval == 5s);
    CHECK(c.busy_gap == 40ms);
    CHECK(c.shutdown_timeout == 1min);
    CHECK(c.dead_letter_retention == 0s);  // 0: kept forever
    CHECK(c.block_private_addresses);
    const auto& d = c.destinations.at(0);
    CHECK(d.name == "default");
    CHECK(d.url.target == "/env");
    CHECK(d.connect_timeout == 3s);
    CHECK(d.request_timeout == 6s);
    CHECK(d.retry.base == 10s);
    CHECK(d.retry.cap == 1h);
    CHECK(d.retry.max_attempts == 11);
    CHECK(d.retry.permanent_statuses == statuses({410, 451}));
    CHECK(d.retry.throttle_statuses == statuses({503}));
    CHECK(d.signing_secrets.size() == 2);
    CHECK(d.tls.ca_file == "/env-ca.pem");
    CHECK_FALSE(d.tls.verify);
}

TEST_CASE("config: precedence is flags > environment > file > built-in defaults") {
    auto f = file_only(std::string(R"(
[database]
url = "postgresql://file/app"
schema = "from_file"
[relay]
concurrency = 10
lease = "50s"
log_level = "debug"
[egress]
block_private_addresses = true
[defaults]
request_timeout = "7s"
signing_secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
[defaults.retry]
max_attempts = 5
[defaults.tls]
verify = false
)") + std::string(one_destination));
    f.env.clear();

    SUBCASE("file over built-in defaults") {
        const auto c = resolve(f);
        CHECK(c.database_url == "postgresql://file/app");
        CHECK(c.schema == "from_file");
        CHECK(c.concurrency == 10);
        CHECK(c.lease == 50s);
        CHECK(c.sweep_interval == 30s);  // not in the file: built-in
        CHECK(c.log_level == "debug");
        CHECK(c.block_private_addresses);
        CHECK(c.destinations[0].request_timeout == 7s);
        CHECK(c.destinations[0].connect_timeout == 5s);
        CHECK(c.destinations[0].retry.max_attempts == 5);
        CHECK(c.destinations[0].signing_secrets.size() == 1);
        CHECK_FALSE(c.destinations[0].tls.verify);
    }
    SUBCASE("environment over file") {
        f.env = {{"DATABASE_URL", "postgresql://env/app"}, {"OUTBOXD_SCHEMA", "from_env"},
                 {"OUTBOXD_CONCURRENCY", "20"}, {"OUTBOXD_LOG_LEVEL", "warn"},
                 {"OUTBOXD_BLOCK_PRIVATE_ADDRESSES", "false"}, {"OUTBOXD_REQUEST_TIMEOUT", "8s"},
                 {"OUTBOXD_MAX_ATTEMPTS", "6"}, {"OUTBOXD_INSECURE_SKIP_TLS_VERIFY", "false"},
                 {"OUTBOXD_SIGNING_SECRETS", std::string(secret_a) + " " + std::string(secret_b)}};
        const auto c = resolve(f);
        CHECK(c.database_url == "postgresql://env/app");
        CHECK(c.schema == "from_env");
        CHECK(c.concurrency == 20);
        CHECK(c.lease == 50s);
        CHECK(c.log_level == "warn");
        CHECK_FALSE(c.block_private_addresses);
        CHECK(c.destinations[0].request_timeout == 8s);
        CHECK(c.destinations[0].retry.max_attempts == 6);
        CHECK(c.destinations[0].signing_secrets.size() == 2);
        CHECK(c.destinations[0].tls.verify);
    }
    SUBCASE("flags over environment") {
        f.env = {{"DATABASE_URL", "postgresql://env/app"}, {"OUTBOXD_CONCURRENCY", "20"},
                 {"OUTBOXD_REQUEST_TIMEOUT", "8s"}, {"OUTBOXD_SIGNING_SECRETS", std::string(secret_b)},
                 {"OUTBOXD_BLOCK_PRIVATE_ADDRESSES", "false"}};
        f.flags = {{"database-url", {"postgresql://flag/app"}}, {"concurrency", {"30"}},
                   {"request-timeout", {"9s"}}, {"signing-secret", {std::string(secret_a), std::string(secret_a)}},
                   {"block-private-addresses", {""}}};
        const auto c = resolve(f);
        CHECK(c.database_url == "postgresql://flag/app");
        CHECK(c.concurrency == 30);
        CHECK(c.block_private_addresses);
        CHECK(c.destinations[0].request_timeout == 9s);
        REQUIRE(c.destinations[0].signing_secrets.size() == 2);
        CHECK(c.destinations[0].signing_secrets[0].key() == signing_secret::parse(secret_a).key());
    }
    SUBCASE("an empty environment variable counts as unset") {
        f.env = {{"OUTBOXD_CONCURRENCY", ""}, {"DATABASE_URL", ""}};
        const auto c = resolve(f);
        CHECK(c.concurrency == 10);
        CHECK(c.database_url == "postgresql://file/app");
    }
}

TEST_CASE("config: flags and environment set [defaults]; a destination's own value wins over them") {
    auto f = file_only(R"(
[defaults]
request_timeout = "7s"
[destinations.own]
url = "http://own/"
request_timeout = "3s"
retry = { max_attempts = 2 }
[destinations.inherits]
url = "http://inherits/"
[[routes]]
topics = [">"]
destinations = ["own", "inherits"]
)");
    f.flags = {{"request-timeout", {"12s"}}, {"max-attempts", {"9"}}};
    const auto c = resolve(f);
    CHECK(c.destinations[0].request_timeout == 3s);
    CHECK(c.destinations[0].retry.max_attempts == 2);
    CHECK(c.destinations[1].request_timeout == 12s);
    CHECK(c.destinations[1].retry.max_attempts == 9);
}

TEST_CASE("config: --url stdout is the stdout transport") {
    fake f;
    f.env["DATABASE_URL"] = "postgresql://db/app";
    f.flags["url"] = {"stdout"};
    f.flags["max-attempts"] = {"4"};
    f.flags["lease"] = {"1s"};  // no webhook: no lease-versus-timeouts check
    const auto c = resolve(f);
    REQUIRE(c.destinations.size() == 1);
    CHECK(c.destinations[0].name == "default");
    CHECK(c.destinations[0].kind == transport::stdout_lines);
    CHECK(c.destinations[0].retry.max_attempts == 4);
    CHECK(c.routes.at(0).topics == std::vector<std::string>{">"});
}

TEST_CASE("config: the --url shortcut takes [defaults] from the file") {
    auto f = file_only(R"(
[defaults]
request_timeout = "2s"
headers = { X-A = "1" }
)");
    f.flags["url"] = {"http://h/"};
    const auto c = resolve(f);
    CHECK(c.destinations.at(0).request_timeout == 2s);
    CHECK(c.destinations.at(0).headers == header_list{{"X-A", "1"}});
}

TEST_CASE("config: the --url flag wins over OUTBOXD_WEBHOOK_URL") {
    fake f;
    f.env = {{"DATABASE_URL", "postgresql://db/app"}, {"OUTBOXD_WEBHOOK_URL", "http://env/"}};
    f.flags["url"] = {"http://flag/"};
    CHECK(resolve(f).destinations.at(0).url.host == "flag");
}

TEST_CASE("config: signing_secrets_env reads the named variable") {
    auto f = file_only(std::string(R"(
[defaults]
signing_secrets_env = "MY_SECRETS"
)") + std::string(one_destination));
    f.env["MY_SECRETS"] = std::string(secret_a);
    CHECK(resolve(f).destinations.at(0).signing_secrets.size() == 1);
}

TEST_CASE("config: destinations_required = false accepts a file without destinations") {
    auto f = file_only("[relay]\nlog_level = \"warn\"\n");
    f.destinations_required = false;
    const auto c = resolve(f);
    CHECK(c.destinations.empty());
    CHECK(c.routes.empty());
    CHECK(c.log_level == "warn");
}

TEST_CASE("config: the example file resolves cleanly") {
    fake f;
    f.file = read_file(OUTBOXD_EXAMPLE_CONFIG);
    f.file_name = "outboxd.example.toml";
    f.env["OUTBOXD_EXAMPLE_SIGNING_SECRETS"] = std::string(secret_a);
    f.env["OUTBOXD_EXAMPLE_BILLING_SECRETS"] = std::string(secret_a) + " " + std::string(secret_b);
    const auto c = resolve(f);
    CHECK(c.destinations.size() == 3);
    CHECK(c.routes.size() == 3);
    CHECK(c.destinations[0].name == "orders");
    CHECK(c.destinations[0].signing_secrets.size() == 1);
    CHECK(c.destinations[1].name == "billing");
    CHECK(c.destinations[1].signing_secrets.size() == 2);
    CHECK(c.destinations[1].retry.max_attempts == 50);
    CHECK(c.destinations[2].kind == transport::stdout_lines);

    // ... and complains, naming the variable, when the secrets are missing
    f.env.erase("OUTBOXD_EXAMPLE_BILLING_SECRETS");
    CHECK(error_of(f).find("the environment variable OUTBOXD_EXAMPLE_BILLING_SECRETS is not set") !=
          std::string::npos);
}

// ---- errors ------------------------------------------------------------------------

TEST_CASE("config: table of file errors: every key, wrong type and invalid value") {
    struct error_case {
        std::string_view toml;
        std::string_view message;
    };
    const error_case cases[] = {
        // syntax and unknown keys
        {"[relay\n", "t.toml:1:7: invalid TOML: "},
        {"concurrency = 5\n", "t.toml:1:1: unknown key concurrency"},
        {"[relay]\nconcurency = 5\n", "t.toml:2:1: unknown key relay.concurency"},
        {"[database]\nname = \"x\"\n", "t.toml:2:1: unknown key database.name"},
        {"[egress]\nblock = true\n", "t.toml:2:1: unknown key egress.block"},
        {"[defaults]\ntimeout = \"1s\"\n", "t.toml:2:1: unknown key defaults.timeout"},
        {"[defaults.retry]\nbse = \"1s\"\n", "t.toml:2:1: unknown key defaults.retry.bse"},
        {"[defaults.tls]\nverfy = true\n", "t.toml:2:1: unknown key defaults.tls.verfy"},
        {"[destinations.d]\nurl = \"http://h/\"\nuri = \"x\"\n", "t.toml:3:1: unknown key destinations.d.uri"},
        {"[destinations.d]\nurl = \"http://h/\"\ntls = { verfy = true }\n",
         "t.toml:3:9: unknown key destinations.d.tls.verfy"},
        {"[[routes]]\ntopicz = [\">\"]\n", "t.toml:2:1: unknown key routes[0].topicz"},
        // sections of the wrong type
        {"relay = 5\n", "t.toml:1:1: relay: expected a table, got 5"},
        {"database = \"x\"\n", "t.toml:1:1: database: expected a table, got \"x\""},
        {"egress = []\n", "t.toml:1:1: egress: expected a table, got an array"},
        {"defaults = true\n", "t.toml:1:1: defaults: expected a table, got true"},
        {"destinations = 1\n", "t.toml:1:1: destinations: expected a table, got 1"},
        {"routes = 1\n", "t.toml:1:1: routes: expected an array of tables ([[routes]]), got 1"},
        {"routes = [1]\n", "t.toml:1:11: routes[0]: expected a table, got 1"},
        // [database]
        {"[database]\nurl = 5\n", "t.toml:2:1: database.url: expected a non-empty string, got 5"},
        {"[database]\nurl = \"\"\n", "t.toml:2:1: database.url: expected a non-empty string, got \"\""},
        {"[database]\nschema = 5\n", "t.toml:2:1: database.schema: expected a string, got 5"},
        {"[database]\nschema = \"pg_x\"\n",
         "t.toml:2:1: database.schema: schema names starting with pg_ are reserved by PostgreSQL"},
        {"[database]\nschema = \"\"\n", "t.toml:2:1: database.schema: schema name is empty"},
        // [relay]
        {"[relay]\nconcurrency = \"32\"\n",
         "t.toml:2:1: relay.concurrency: expected an integer from 1 to 1024, got \"32\""},
        {"[relay]\nconcurrency = 0\n", "t.toml:2:1: relay.concurrency: expected an integer from 1 to 1024, got 0"},
        {"[relay]\nconcurrency = 1025\n",
         "t.toml:2:1: relay.concurrency: expected an integer from 1 to 1024, got 1025"},
        {"[relay]\nconcurrency = 1.5\n", "t.toml:2:1: relay.concurrency: expected an integer from 1 to 1024, got 1.5"},
        {"[relay]\nlease = 30\n", "t.toml:2:1: relay.lease: expected a duration like \"5s\" or \"250ms\", got 30"},
        {"[relay]\nlease = \"soon\"\n",
         "t.toml:2:1: relay.lease: expected a duration like \"5s\" or \"250ms\", got \"soon\""},
        {"[relay]\nlease = \"0s\"\n", "t.toml:2:1: relay.lease: expected a duration of at least 1ms, got \"0s\""},
        {"[relay]\nsweep_interval = true\n",
         "t.toml:2:1: relay.sweep_interval: expected a duration like \"5s\" or \"250ms\", got true"},
        {"[relay]\nsweep_interval = \"99ms\"\n",
         "t.toml:2:1: relay.sweep_interval: expected a duration of at least 100ms, got \"99ms\""},
        {"[relay]\nbusy_gap = \"0ms\"\n", "t.toml:2:1: relay.busy_gap: expected a duration from 1ms to 1s, got \"0ms\""},
        {"[relay]\nbusy_gap = \"2s\"\n", "t.toml:2:1: relay.busy_gap: expected a duration from 1ms to 1s, got \"2s\""},
        {"[relay]\nshutdown_timeout = [1]\n",
         "t.toml:2:1: relay.shutdown_timeout: expected a duration like \"5s\" or \"250ms\", got an array"},
        {"[relay]\nshutdown_timeout = \"-1s\"\n",
         "t.toml:2:1: relay.shutdown_timeout: expected a duration like \"5s\" or \"250ms\", got \"-1s\""},
        {"[relay]\nidempotency_retention = \"forever\"\n",
         "t.toml:2:1: relay.idempotency_retention: expected a duration like \"5s\" or \"250ms\", got \"forever\""},
        {"[relay]\ndead_letter_retention = \"-1h\"\n",
         "t.toml:2:1: relay.dead_letter_retention: expected a duration like \"5s\" or \"250ms\", got \"-1h\""},
        {"[relay]\nlog_level = 1\n", "t.toml:2:1: relay.log_level: expected debug, info, warn or error, got 1"},
        {"[relay]\nlog_level = \"chatty\"\n",
         "t.toml:2:1: relay.log_level: expected debug, info, warn or error, got \"chatty\""},
        // [egress]
        {"[egress]\nblock_private_addresses = \"yes\"\n",
         "t.toml:2:1: egress.block_private_addresses: expected true or false, got \"yes\""},
        {"[egress]\nblock_private_addresses = 1\n",
         "t.toml:2:1: egress.block_private_addresses: expected true or false, got 1"},
        // [defaults]
        {"[defaults]\nconnect_timeout = 5\n",
         "t.toml:2:1: defaults.connect_timeout: expected a duration like \"5s\" or \"250ms\", got 5"},
        {"[defaults]\nconnect_timeout = \"0ms\"\n",
         "t.toml:2:1: defaults.connect_timeout: expected a duration of at least 1ms, got \"0ms\""},
        {"[defaults]\nrequest_timeout = \"10\"\n",
         "t.toml:2:1: defaults.request_timeout: expected a duration like \"5s\" or \"250ms\", got \"10\""},
        {"[defaults]\nrequest_timeout = \"0s\"\n",
         "t.toml:2:1: defaults.request_timeout: expected a duration of at least 1ms, got \"0s\""},
        {"[defaults]\nmax_concurrency = \"x\"\n",
         "t.toml:2:1: defaults.max_concurrency: expected an integer from 1 to 1024, got \"x\""},
        {"[defaults]\nmax_concurrency = 0\n",
         "t.toml:2:1: defaults.max_concurrency: expected an integer from 1 to 1024, got 0"},
        {"[defaults]\nmax_concurrency = 2000\n",
         "t.toml:2:1: defaults.max_concurrency: expected an integer from 1 to 1024, got 2000"},
        {"[defaults]\nsigning_secrets = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
         "t.toml:2:1: defaults.signing_secrets: expected an array of strings like [\"whsec_...\"], got a string"},
        {"[defaults]\nsigning_secrets = [5]\n",
         "t.toml:2:20: defaults.signing_secrets[0]: expected a string, got an integer"},
        {"[defaults]\nsigning_secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS\"]\n",
         "t.toml:2:20: defaults.signing_secrets[0]: signing secret after whsec_ is not base64"},
        {"[defaults]\nsigning_secrets = [\"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n",
         "t.toml:2:20: defaults.signing_secrets[0]: a signing secret starts with whsec_"},
        {"[defaults]\nsigning_secrets_env = 5\n",
         "t.toml:2:1: defaults.signing_secrets_env: expected a non-empty string, got 5"},
        {"[defaults]\nsigning_secrets_env = \"1BAD\"\n",
         "t.toml:2:1: defaults.signing_secrets_env: expected the name of an environment variable (letters, digits "
         "and '_'), not the secrets"},
        {"[defaults]\nsigning_secrets_env = \"NOT_SET\"\n",
         "t.toml:2:1: defaults.signing_secrets_env: the environment variable NOT_SET is not set"},
        {"[defaults]\nsigning_secrets = []\nsigning_secrets_env = \"X\"\n",
         "t.toml:3:1: defaults.signing_secrets_env: give signing_secrets or signing_secrets_env, not both"},
        {"[defaults]\nheaders = 5\n", "t.toml:2:1: defaults.headers: expected a table, got 5"},
        {"[defaults.headers]\n\"Bad Name\" = \"x\"\n",
         "t.toml:2:1: defaults.headers: a header name is not a valid HTTP token"},
        {"[defaults.headers]\nHost = \"x\"\n", "t.toml:2:1: defaults.headers.Host: outboxd sets this header itself"},
        {"[defaults.headers]\nwebhook-signature = \"x\"\n",
         "t.toml:2:1: defaults.headers.webhook-signature: outboxd sets this header itself"},
        {"[defaults.headers]\nX-Token = 12345\n", "t.toml:2:1: defaults.headers.X-Token: expected a string, got an integer"},
        {"[defaults.headers]\nX-Token = \"Bearer tok3n-value\\r\\nX: y\"\n",
         "t.toml:2:1: defaults.headers.X-Token: the value contains a control character"},
        {"[defaults.headers]\nX-A = \"1\"\nx-a = \"2\"\n",
         "t.toml:3:1: defaults.headers.x-a: the same header as X-A (names are case-insensitive)"},
        {"[defaults]\nretry = 5\n", "t.toml:2:1: defaults.retry: expected a table, got 5"},
        {"[defaults.retry]\nbase = \"soon\"\n",
         "t.toml:2:1: defaults.retry.base: expected a duration like \"5s\" or \"250ms\", got \"soon\""},
        {"[defaults.retry]\ncap = 5\n",
         "t.toml:2:1: defaults.retry.cap: expected a duration like \"5s\" or \"250ms\", got 5"},
        {"[defaults.retry]\nmax_attempts = 0\n",
         "t.toml:2:1: defaults.retry.max_attempts: expected an integer from 1 to 1000, got 0"},
        {"[defaults.retry]\nmax_attempts = 1001\n",
         "t.toml:2:1: defaults.retry.max_attempts: expected an integer from 1 to 1000, got 1001"},
        {"[defaults.retry]\nmax_attempts = \"20\"\n",
         "t.toml:2:1: defaults.retry.max_attempts: expected an integer from 1 to 1000, got \"20\""},
        {"[defaults.retry]\npermanent_statuses = \"410\"\n",
         "t.toml:2:1: defaults.retry.permanent_statuses: expected an array of HTTP statuses like [410, 422], got \"410\""},
        {"[defaults.retry]\npermanent_statuses = [410, 99]\n",
         "t.toml:2:28: defaults.retry.permanent_statuses[1]: expected an HTTP status from 100 to 599, got 99"},
        {"[defaults.retry]\npermanent_statuses = [\"410\"]\n",
         "t.toml:2:23: defaults.retry.permanent_statuses[0]: expected an HTTP status from 100 to 599, got \"410\""},
        {"[defaults.retry]\npermanent_statuses = [204]\n",
         "t.toml:2:23: defaults.retry.permanent_statuses[0]: 2xx means delivered and cannot be listed, got 204"},
        {"[defaults.retry]\nthrottle_statuses = {}\n",
         "t.toml:2:1: defaults.retry.throttle_statuses: expected an array of HTTP statuses like [410, 422], got a table"},
        {"[defaults.retry]\nthrottle_statuses = [600]\n",
         "t.toml:2:22: defaults.retry.throttle_statuses[0]: expected an HTTP status from 100 to 599, got 600"},
        {"[defaults]\ntls = \"on\"\n", "t.toml:2:1: defaults.tls: expected a table, got \"on\""},
        {"[defaults.tls]\nca_file = 5\n", "t.toml:2:1: defaults.tls.ca_file: expected a non-empty string, got 5"},
        {"[defaults.tls]\nca_file = \"\"\n", "t.toml:2:1: defaults.tls.ca_file: expected a non-empty string, got \"\""},
        {"[defaults.tls]\nverify = \"no\"\n", "t.toml:2:1: defaults.tls.verify: expected true or false, got \"no\""},
        // [destinations.NAME]
        {"[destinations]\nd = 5\n", "t.toml:2:1: destinations.d: expected a table, got 5"},
        {"[destinations.\"bad name\"]\nurl = \"http://h/\"\n",
         "t.toml:1:15: destinations.\"bad name\": a destination name is 1 to 64 letters, digits, '_' or '-'"},
        {"[destinations.d]\ntype = \"http\"\n",
         "t.toml:2:1: destinations.d.type: expected \"webhook\", \"stdout\" or \"nats\", got \"http\""},
        {"[destinations.d]\ntype = 1\n", "t.toml:2:1: destinations.d.type: expected \"webhook\", \"stdout\" or \"nats\", got 1"},
        {"[destinations.d]\nurl = 5\n", "t.toml:2:1: destinations.d.url: expected a URL string, got 5"},
        {"[destinations.d]\nurl = \"ftp://h/\"\n",
         "t.toml:2:1: destinations.d.url: invalid endpoint URL: unsupported scheme 'ftp' (expected http or https)"},
        {"[destinations.d]\nrequest_timeout = \"1s\"\n",
         "t.toml:1:15: destinations.d: missing url (a webhook destination needs one)"},
        {"[destinations.d]\nurl = \"http://h/\"\nconnect_timeout = \"0s\"\n",
         "t.toml:3:1: destinations.d.connect_timeout: expected a duration of at least 1ms, got \"0s\""},
        {"[destinations.d]\nurl = \"http://h/\"\nmax_concurrency = 0\n",
         "t.toml:3:1: destinations.d.max_concurrency: expected an integer from 1 to 1024, got 0"},
        {"[destinations.d]\nurl = \"http://h/\"\nretry = { max_attempts = 0 }\n",
         "t.toml:3:11: destinations.d.retry.max_attempts: expected an integer from 1 to 1000, got 0"},
        {"[destinations.d]\nurl = \"http://h/\"\ntls = { verify = 1 }\n",
         "t.toml:3:9: destinations.d.tls.verify: expected true or false, got 1"},
        {"[destinations.d]\nurl = \"http://h/\"\nheaders = { Host = \"x\" }\n",
         "t.toml:3:13: destinations.d.headers.Host: outboxd sets this header itself"},
        {"[destinations.d]\nurl = \"http://h/\"\nsigning_secrets = [\"x\"]\nsigning_secrets_env = \"E\"\n",
         "t.toml:4:1: destinations.d.signing_secrets_env: give signing_secrets or signing_secrets_env, not both"},
        {"[destinations.d]\ntype = \"stdout\"\nurl = \"http://h/\"\n",
         "t.toml:3:1: destinations.d.url: does not apply to a stdout destination (only retry does)"},
        {"[destinations.d]\ntype = \"stdout\"\nheaders = {}\n",
         "t.toml:3:1: destinations.d.headers: does not apply to a stdout destination (only retry does)"},
        // [[routes]]
        {"[destinations.d]\nurl = \"http://h/\"\n",
         "t.toml:1:15: destinations.d: no route sends events to this destination"},
        {"[destinations.d]\nurl = \"http://h/\"\n[[routes]]\ndestinations = [\"d\"]\n",
         "t.toml:3:1: routes[0]: missing topics"},
        {"[destinations.d]\nurl = \"http://h/\"\n[[routes]]\ntopics = [\">\"]\n",
         "t.toml:3:1: routes[0]: missing destinations"},
        {"[[routes]]\ntopics = []\ndestinations = [\"d\"]\n",
         "t.toml:2:1: routes[0].topics: expected at least one topic pattern, got []"},
        {"[[routes]]\ntopics = \">\"\n",
         "t.toml:2:1: routes[0].topics: expected an array of topic patterns like [\"orders.*\"], got \">\""},
        {"[[routes]]\ntopics = [5]\n", "t.toml:2:11: routes[0].topics[0]: expected a topic pattern, got 5"},
        {"[destinations.d]\nurl = \"http://h/\"\n[[routes]]\ntopics = [\"a\"]\ndestinations = [\"d\"]\n"
         "[[routes]]\ntopics = [\"orders.*\", \"ord*\"]\n",
         "t.toml:7:23: routes[1].topics[1]: invalid topic pattern \"ord*\": '*' and '>' must be whole tokens"},
        {"[[routes]]\ntopics = [\"a.>.b\"]\n",
         "t.toml:2:11: routes[0].topics[0]: invalid topic pattern \"a.>.b\": '>' must be the last token"},
        {"[[routes]]\ntopic = \"a..b\"\n",
         "t.toml:2:1: routes[0].topic: invalid topic pattern \"a..b\": empty token"},
        {"[[routes]]\ntopic = 5\n", "t.toml:2:1: routes[0].topic: expected a topic pattern, got 5"},
        {"[[routes]]\ntopics = [\"a\"]\ntopic = \"b\"\n", "t.toml:3:1: routes[0].topic: give topics or topic, not both"},
        {"[[routes]]\ntopics = [\"a\"]\ndestinations = \"d\"\n",
         "t.toml:3:1: routes[0].destinations: expected an array of destination names like [\"orders\"], got \"d\""},
        {"[[routes]]\ntopics = [\"a\"]\ndestinations = []\n",
         "t.toml:3:1: routes[0].destinations: expected at least one destination name, got []"},
        {"[[routes]]\ntopics = [\"a\"]\ndestinations = [1]\n",
         "t.toml:3:17: routes[0].destinations[0]: expected a destination name, got 1"},
        {"[destinations.orders]\nurl = \"http://h/\"\n[[routes]]\ntopics = [\"a\"]\ndestinations = [\"ordres\"]\n",
         "t.toml:5:17: routes[0].destinations[0]: no destination named \"ordres\""},
    };
    for (const auto& c : cases) {
        CAPTURE(c.toml);
        const auto message = error_of(file_only(std::string(c.toml)));
        CHECK_MESSAGE(message.starts_with(c.message), message);
        CHECK_FALSE(leaks(message));
    }
}

TEST_CASE("config: environment and flag errors name the variable or flag") {
    struct error_case {
        std::string_view name;  // "--flag" or an environment variable
        std::string value;
        std::string_view message;
    };
    const error_case cases[] = {
        {"OUTBOXD_CONCURRENCY", "x", "OUTBOXD_CONCURRENCY: expected an integer from 1 to 1024, got \"x\""},
        {"--concurrency", "0", "--concurrency: expected an integer from 1 to 1024, got \"0\""},
        {"--concurrency", "12abc", "--concurrency: expected an integer from 1 to 1024, got \"12abc\""},
        {"--lease", "soon", "--lease: expected a duration like \"5s\" or \"250ms\", got \"soon\""},
        {"OUTBOXD_LEASE", "0ms", "OUTBOXD_LEASE: expected a duration of at least 1ms, got \"0ms\""},
        {"--sweep-interval", "50ms", "--sweep-interval: expected a duration of at least 100ms, got \"50ms\""},
        {"--busy-gap", "1001ms", "--busy-gap: expected a duration from 1ms to 1s, got \"1001ms\""},
        {"OUTBOXD_BUSY_GAP", "0s", "OUTBOXD_BUSY_GAP: expected a duration from 1ms to 1s, got \"0s\""},
        {"OUTBOXD_SWEEP_INTERVAL", "1", "OUTBOXD_SWEEP_INTERVAL: expected a duration like \"5s\" or \"250ms\", got \"1\""},
        {"--shutdown-timeout", "x", "--shutdown-timeout: expected a duration like"},
        {"OUTBOXD_SHUTDOWN_TIMEOUT", "x", "OUTBOXD_SHUTDOWN_TIMEOUT: expected a duration like"},
        {"--connect-timeout", "0s", "--connect-timeout: expected a duration of at least 1ms, got \"0s\""},
        {"OUTBOXD_CONNECT_TIMEOUT", "0s", "OUTBOXD_CONNECT_TIMEOUT: expected a duration of at least 1ms"},
        {"--request-timeout", "0s", "--request-timeout: expected a duration of at least 1ms, got \"0s\""},
        {"OUTBOXD_REQUEST_TIMEOUT", "1x", "OUTBOXD_REQUEST_TIMEOUT: expected a duration like"},
        {"--retry-base", "x", "--retry-base: expected a duration like"},
        {"OUTBOXD_RETRY_BASE", "x", "OUTBOXD_RETRY_BASE: expected a duration like"},
        {"--retry-cap", "x", "--retry-cap: expected a duration like"},
        {"OUTBOXD_RETRY_CAP", "x", "OUTBOXD_RETRY_CAP: expected a duration like"},
        {"--max-attempts", "0", "--max-attempts: expected an integer from 1 to 1000, got \"0\""},
        {"OUTBOXD_MAX_ATTEMPTS", "1001", "OUTBOXD_MAX_ATTEMPTS: expected an integer from 1 to 1000, got \"1001\""},
        {"--permanent-statuses", "410,x", "--permanent-statuses: expected comma-separated HTTP statuses from 100 to 599"},
        {"OUTBOXD_PERMANENT_STATUSES", "200", "OUTBOXD_PERMANENT_STATUSES: 2xx means delivered"},
        {"--throttle-statuses", "1000", "--throttle-statuses: expected comma-separated HTTP statuses"},
        {"OUTBOXD_THROTTLE_STATUSES", "x", "OUTBOXD_THROTTLE_STATUSES: expected comma-separated HTTP statuses"},
        {"--log-level", "chatty", "--log-level: expected debug, info, warn or error, got \"chatty\""},
        {"OUTBOXD_LOG_LEVEL", "INFO", "OUTBOXD_LOG_LEVEL: expected debug, info, warn or error, got \"INFO\""},
        {"--schema", "pg_catalog", "--schema: schema names starting with pg_ are reserved by PostgreSQL"},
        {"OUTBOXD_SCHEMA", std::string(56, 's'), "OUTBOXD_SCHEMA: schema name"},
        {"OUTBOXD_BLOCK_PRIVATE_ADDRESSES", "yes", "OUTBOXD_BLOCK_PRIVATE_ADDRESSES: expected true or false, got \"yes\""},
        {"--block-private-addresses", "maybe", "--block-private-addresses: expected true or false, got \"maybe\""},
        {"OUTBOXD_INSECURE_SKIP_TLS_VERIFY", "1", "OUTBOXD_INSECURE_SKIP_TLS_VERIFY: expected true or false, got \"1\""},
        {"--ca-file", "", "--ca-file: expected a file name, got \"\""},
        {"--url", "ftp://h/", "--url: invalid endpoint URL: unsupported scheme 'ftp'"},
        {"--url", "http://user:hunter2pw@h/", "--url: invalid endpoint URL: userinfo"},
        {"OUTBOXD_WEBHOOK_URL", "not a url", "OUTBOXD_WEBHOOK_URL: invalid endpoint URL: contains whitespace"},
        {"--database-url", "", "--database-url: expected a database URL, got \"\""},
        {"--signing-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa", "--signing-secret: signing secret"},
        {"OUTBOXD_SIGNING_SECRETS", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw tok3n",
         "OUTBOXD_SIGNING_SECRETS: a signing secret starts with whsec_"},
        {"OUTBOXD_SIGNING_SECRETS", "AAAAAAAAAAAAAAAAAAAAAAAA", "OUTBOXD_SIGNING_SECRETS: a signing secret starts"},
        {"--concurrency", "bad\nline", "--concurrency: expected an integer from 1 to 1024, got \"bad\\nline\""},
    };
    for (const auto& c : cases) {
        CAPTURE(c.name);
        CAPTURE(c.value);
        fake f;
        f.env["DATABASE_URL"] = "postgresql://db/app";
        if (c.name != "--url" && c.name != "OUTBOXD_WEBHOOK_URL") f.flags["url"] = {"http://h/"};
        if (c.name.starts_with("--")) {
            f.flags[std::string(c.name.substr(2))] = {c.value};
        } else {
            f.env[std::string(c.name)] = c.value;
        }
        const auto message = error_of(f);
        CHECK_MESSAGE(message.starts_with(c.message), message);
        CHECK_FALSE(leaks(message));
    }
}

TEST_CASE("config: cross-checks name the destination and where each value came from") {
    SUBCASE("lease versus the timeouts of a webhook destination (today's rule)") {
        fake f;
        f.env["DATABASE_URL"] = "postgresql://db/app";
        f.flags = {{"url", {"http://h/"}}, {"lease", {"10s"}}, {"request-timeout", {"5s"}}};
        CHECK(error_of(f) ==
              "--lease: lease 10s must be longer than connect_timeout + request_timeout of destination default "
              "(10s: connect_timeout 5s the default, request_timeout 5s from --request-timeout)");
        f.flags["lease"] = {"10001ms"};
        CHECK_NOTHROW((void)resolve(f));
    }
    SUBCASE("lease from the built-in default against a destination in the file") {
        auto f = file_only(R"([destinations.slow]
url = "http://h/"
request_timeout = "1m"
[[routes]]
topics = [">"]
destinations = ["slow"]
)");
        CHECK(error_of(f) ==
              "relay.lease: lease 30s must be longer than connect_timeout + request_timeout of destination slow "
              "(65s: connect_timeout 5s the default, request_timeout 1m from destinations.slow.request_timeout at "
              "t.toml:3:1)");
    }
    SUBCASE("a stdout destination has no timeouts to check") {
        auto f = file_only(R"([relay]
lease = "1ms"
[destinations.log]
type = "stdout"
[[routes]]
topics = [">"]
destinations = ["log"]
)");
        CHECK_NOTHROW((void)resolve(f));
    }
    SUBCASE("retry base must not exceed the cap") {
        fake f;
        f.env["DATABASE_URL"] = "postgresql://db/app";
        f.flags = {{"url", {"http://h/"}}, {"retry-base", {"2h"}}, {"retry-cap", {"1h"}}};
        CHECK(error_of(f) ==
              "--retry-base: destination default: retry base 2h must not exceed the retry cap 1h (from --retry-cap)");
        auto g = file_only(R"([destinations.d]
url = "http://h/"
retry = { base = "7h" }
[[routes]]
topics = [">"]
destinations = ["d"]
)");
        CHECK(error_of(g) == "t.toml:3:11: destinations.d.retry.base: destination d: retry base 7h must not exceed "
                             "the retry cap 6h (the default)");
    }
    SUBCASE("--url with a file that has destinations or routes") {
        auto f = file_only(std::string(one_destination));
        f.flags["url"] = {"http://h/"};
        CHECK(error_of(f) == "--url defines the only destination; remove it or the [destinations] of t.toml");
        f.flags.clear();
        f.env["OUTBOXD_WEBHOOK_URL"] = "http://h/";
        CHECK(error_of(f) ==
              "OUTBOXD_WEBHOOK_URL defines the only destination; remove it or the [destinations] of t.toml");
        auto g = file_only("[[routes]]\ntopics = [\">\"]\ndestinations = [\"default\"]\n");
        g.flags["url"] = {"http://h/"};
        CHECK(error_of(g).starts_with("--url defines the only destination and routes every topic to it; remove it "
                                      "or the [[routes]] of t.toml"));
    }
    SUBCASE("no destination at all names both ways to give one") {
        fake f;
        f.env["DATABASE_URL"] = "postgresql://db/app";
        const auto message = error_of(f);
        CHECK(message.starts_with("no destination: "));
        CHECK(message.find("--url") != std::string::npos);
        CHECK(message.find("OUTBOXD_WEBHOOK_URL") != std::string::npos);
        CHECK(message.find("[destinations.NAME]") != std::string::npos);
        auto g = file_only("[relay]\nconcurrency = 4\n");
        CHECK(error_of(g).starts_with("no destination: "));
    }
    SUBCASE("no database URL") {
        fake f;
        f.flags["url"] = {"http://h/"};
        CHECK(error_of(f) ==
              "no database URL: give --database-url, DATABASE_URL or database.url in the configuration file");
    }
}

TEST_CASE("config: a command that never connects (outboxd sql) needs no database URL, and still checks the rest") {
    fake f;
    f.destinations_required = false;
    f.database_required = false;
    f.file = "[database]\nschema = \"from_file\"\n";
    CHECK(resolve(f).schema == "from_file");
    CHECK(resolve(f).database_url.empty());
    f.file = "[database]\nschema = \"pg_x\"\n";
    CHECK(error_of(f) == "t.toml:2:1: database.schema: schema names starting with pg_ are reserved by PostgreSQL");
}

TEST_CASE("config: the database URL check reports the redacted URL and the source") {
    fake f;
    f.flags["url"] = {"http://h/"};
    f.file = "[database]\nurl = \"postgresql://outboxd:hunter2pw@db/app?sslmode=bogus\"\n";
    f.database_url_error = [](const std::string&) -> std::optional<std::string> {
        return "invalid sslmode value: \"bogus\"";
    };
    const auto message = error_of(f);
    CHECK(message == "t.toml:2:1: database.url: invalid database URL (postgresql://outboxd:***@db/app?sslmode=bogus): "
                     "invalid sslmode value: \"bogus\"");
    CHECK_FALSE(leaks(message));
    f.env["DATABASE_URL"] = "postgresql://outboxd:hunter2pw@db/app?sslmode=bogus";
    CHECK(error_of(f).starts_with("DATABASE_URL: invalid database URL (postgresql://outboxd:***@db/app"));
}

TEST_CASE("config: no secret in any message or in render_config") {
    // Secrets given in every wrong shape; none may be repeated.
    const std::string_view files[] = {
        "[defaults]\nsigning_secrets = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        "[defaults]\nsigning_secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwAAAAAAAAAAAAAA\"]\n",
        "[defaults]\nsigning_secrets = [\"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n",
        "[defaults]\nsigning_secrets = [[\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]]\n",
        "[defaults]\nsigning_secrets = { a = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\" }\n",
        "[defaults.headers]\nAuthorization = [\"Bearer tok3n-value\"]\n",
        "[defaults.headers]\nAuthorization = \"Bearer tok3n-value\\n\"\n",
        "[defaults.headers]\nAuthorization = \"Bearer tok3n-value\"\nauthorization = \"Bearer tok3n-value\"\n",
        "[defaults]\nsigning_secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",  // TOML syntax error
        "[defaults]\nheaders = { Authorization = \"Bearer tok3n-value\\q\" }\n",   // TOML syntax error
        "[defaults.headers]\n\"Authorization: Bearer tok3n-value\" = \"\"\n",        // a header line as the name
        "[defaults]\nsigning_secrets_env = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",  // the secret as the name
    };
    for (const auto file : files) {
        CAPTURE(file);
        const auto message = error_of(file_only(std::string(file)));
        CHECK(message != "(no error)");
        CHECK_FALSE(leaks(message));
    }
    auto f = file_only("[defaults]\nsigning_secrets_env = \"S\"\n");
    f.env["S"] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS";
    CHECK_FALSE(leaks(error_of(f)));
}

TEST_CASE("config: render_config is valid TOML of the effective configuration, secrets redacted") {
    auto f = file_only(R"(
[database]
url = "postgresql://outboxd:hunter2pw@db/app"
[relay]
concurrency = 7
lease = "1m"
[egress]
block_private_addresses = true
[defaults]
signing_secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"]
headers = { Authorization = "Bearer tok3n-value", "X-Odd!" = "v" }
[defaults.tls]
ca_file = "/etc/ca \"quoted\".pem"
[destinations.orders]
url = "https://orders.example.com/hook?a=1"
retry = { permanent_statuses = [] }
[destinations.log]
type = "stdout"
[[routes]]
topics = ["orders.*", "billing.>"]
destinations = ["orders", "log"]
[[routes]]
topic = "x"
destinations = ["log"]
)");
    f.env.clear();
    const auto original = resolve(f);
    const auto text = render_config(original);
    CAPTURE(text);
    CHECK_FALSE(leaks(text));
    CHECK(text.find("postgresql://outboxd:***@db/app") != std::string::npos);
    CHECK(text.find("signing_secrets = [\"<redacted>\", \"<redacted>\"]") != std::string::npos);
    CHECK(text.find("headers = { Authorization = \"<redacted>\", \"X-Odd!\" = \"<redacted>\" }") != std::string::npos);
    // A query string may hold a token: redacted like the other secrets.
    CHECK(text.find("url = \"https://orders.example.com/hook?<redacted>\"") != std::string::npos);

    // Re-parse it with the secrets supplied again: the same configuration.
    auto again_text = text;
    replace_all(again_text, "signing_secrets = [\"<redacted>\", \"<redacted>\"]",
                "signing_secrets_env = \"SECRETS\"");
    replace_all(again_text, "/hook?<redacted>", "/hook?a=1");
    fake again;
    again.file = again_text;
    again.env["SECRETS"] = std::string(secret_a) + " " + std::string(secret_b);
    const auto c = resolve(again);
    CHECK(c.database_url == "postgresql://outboxd:***@db/app");
    CHECK(c.schema == original.schema);
    CHECK(c.concurrency == original.concurrency);
    CHECK(c.lease == original.lease);
    CHECK(c.sweep_interval == original.sweep_interval);
    CHECK(c.shutdown_timeout == original.shutdown_timeout);
    CHECK(c.dead_letter_retention == original.dead_letter_retention);
    CHECK(c.log_level == original.log_level);
    CHECK(c.block_private_addresses == original.block_private_addresses);
    REQUIRE(c.destinations.size() == original.destinations.size());
    for (std::size_t i = 0; i < c.destinations.size(); ++i) {
        const auto& a = original.destinations[i];
        const auto& b = c.destinations[i];
        CAPTURE(a.name);
        CHECK(b.name == a.name);
        CHECK(b.kind == a.kind);
        CHECK(b.url.scheme == a.url.scheme);
        CHECK(b.url.host_header == a.url.host_header);
        CHECK(b.url.target == a.url.target);
        CHECK(b.connect_timeout == a.connect_timeout);
        CHECK(b.request_timeout == a.request_timeout);
        CHECK(b.max_concurrency == a.max_concurrency);
        CHECK(b.signing_secrets.size() == a.signing_secrets.size());
        REQUIRE(b.headers.size() == a.headers.size());
        for (std::size_t h = 0; h < a.headers.size(); ++h) CHECK(b.headers[h].first == a.headers[h].first);
        CHECK(b.tls.verify == a.tls.verify);
        CHECK(b.tls.ca_file == a.tls.ca_file);
        CHECK(b.retry.base == a.retry.base);
        CHECK(b.retry.cap == a.retry.cap);
        CHECK(b.retry.max_attempts == a.retry.max_attempts);
        CHECK(b.retry.permanent_statuses == a.retry.permanent_statuses);
        CHECK(b.retry.throttle_statuses == a.retry.throttle_statuses);
    }
    REQUIRE(c.routes.size() == original.routes.size());
    for (std::size_t i = 0; i < c.routes.size(); ++i) {
        CHECK(c.routes[i].topics == original.routes[i].topics);
        CHECK(c.routes[i].destinations == original.routes[i].destinations);
    }
}

TEST_CASE("config: render_config of the --url shortcut re-parses as a file") {
    fake f;
    f.env["DATABASE_URL"] = "host=db user=outboxd password=hunter2pw";
    f.flags = {{"url", {"http://[::1]:8080/h"}}, {"concurrency", {"3"}}};
    const auto text = render_config(resolve(f));
    CAPTURE(text);
    CHECK_FALSE(leaks(text));
    fake again;
    again.file = text;
    const auto c = resolve(again);
    CHECK(c.concurrency == 3);
    CHECK(c.destinations.at(0).name == "default");
    CHECK(c.destinations.at(0).url.host == "::1");
    CHECK(c.destinations.at(0).url.port == "8080");
    CHECK(c.routes.at(0).topics == std::vector<std::string>{">"});
}

TEST_CASE("config: an unknown key names the key it was probably meant to be") {
    const std::vector<std::pair<std::string, std::string>> cases{
        // a typo of a key of the same table
        {"[relay]\nconcurency = 4\n", "t.toml:2:1: unknown key relay.concurency; did you mean relay.concurrency?"},
        {"[defaults.retry]\nmax_attempt = 4\n",
         "t.toml:2:1: unknown key defaults.retry.max_attempt; did you mean defaults.retry.max_attempts?"},
        // a key of another table
        {"[relay]\nmax_attempts = 3\n",
         "t.toml:2:1: unknown key relay.max_attempts; did you mean defaults.retry.max_attempts (or "
         "destinations.NAME.retry.max_attempts)?"},
        {"[defaults]\nlease = \"10s\"\n", "t.toml:2:1: unknown key defaults.lease; did you mean relay.lease?"},
    };
    for (const auto& [file, message] : cases) {
        CAPTURE(file);
        CHECK(error_of(file_only(file)) == message);
    }
    // Nothing close: no guess.
    CHECK(error_of(file_only("[relay]\nwhatever = 1\n")) == "t.toml:2:1: unknown key relay.whatever");
}

TEST_CASE("config: a database URL of the wrong shape says what shape is expected, and never echoes it") {
    fake f;
    f.flags["database-url"] = {"http://user:pw1234@x/db"};
    f.flags["url"] = {"stdout"};
    f.database_url_error = [](const std::string&) -> std::optional<std::string> { return "libpq says no"; };
    const auto error = error_of(f);
    CHECK(error ==
          "--database-url: expected a PostgreSQL URL (postgresql://user@host:5432/dbname) or key=value settings "
          "(host=... dbname=...), got a URL of scheme \"http\"");
    f.flags["database-url"] = {"localhost"};
    CHECK(error_of(f) ==
          "--database-url: expected a PostgreSQL URL (postgresql://user@host:5432/dbname) or key=value settings "
          "(host=... dbname=...), got neither (not shown: it may hold a password)");
}

TEST_CASE("config: database timeouts from the file, environment and flags, with their limits") {
    fake f;
    f.env["DATABASE_URL"] = "postgresql://db/app";
    f.flags["url"] = {"http://127.0.0.1:8080/hook"};
    {
        const auto c = resolve(f);
        CHECK(c.db_connect_timeout == 10s);
        CHECK(c.db_keepalive_timeout == 10s);
        CHECK(c.db_statement_timeout == 5s);
    }
    f.file = "[database]\nconnect_timeout = \"3s\"\nkeepalive_timeout = \"4s\"\nstatement_timeout = \"0s\"\n";
    {
        const auto c = resolve(f);
        CHECK(c.db_connect_timeout == 3s);
        CHECK(c.db_keepalive_timeout == 4s);
        CHECK(c.db_statement_timeout == 0s);  // none
        CHECK(render_config(c).find("keepalive_timeout = \"4s\"") != std::string::npos);
    }
    f.env["OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT"] = "6s";
    f.env["OUTBOXD_DATABASE_STATEMENT_TIMEOUT"] = "750ms";
    f.flags["database-connect-timeout"] = {"2s"};
    f.flags["database-statement-timeout"] = {"1s"};
    {
        const auto c = resolve(f);
        CHECK(c.db_connect_timeout == 2s);
        CHECK(c.db_keepalive_timeout == 6s);
        CHECK(c.db_statement_timeout == 1s);
    }
    fake bad = f;
    bad.file = "[database]\nconnect_timeout = \"1s\"\n";
    bad.flags.erase("database-connect-timeout");
    CHECK(error_of(bad) ==
          "t.toml:2:1: database.connect_timeout: expected a duration of at least 2s, got \"1s\"");
    bad.file = "[database]\nkeepalive_timeout = 10\n";
    bad.env.erase("OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT");
    CHECK(error_of(bad) ==
          "t.toml:2:1: database.keepalive_timeout: expected a duration like \"5s\" or \"250ms\", got 10");
    bad.file.clear();
    bad.flags["database-keepalive-timeout"] = {"500ms"};
    CHECK(error_of(bad) == "--database-keepalive-timeout: expected a duration of at least 1s, got \"500ms\"");
}

TEST_CASE("config: log_format from the file, environment and flags, next to log_level") {
    fake f;
    f.env["DATABASE_URL"] = "postgresql://db/app";
    f.flags["url"] = {"stdout"};
    CHECK(resolve(f).log_format == "logfmt");
    f.file = "[relay]\nlog_format = \"json\"\n";
    CHECK(resolve(f).log_format == "json");
    CHECK(render_config(resolve(f)).find("log_level = \"info\"\nlog_format = \"json\"\n") != std::string::npos);
    f.file = "[relay]\nlog_format = \"logfmt\"\n";
    f.env["OUTBOXD_LOG_FORMAT"] = "json";
    CHECK(resolve(f).log_format == "json");
    f.flags["log-format"] = {"logfmt"};
    CHECK(resolve(f).log_format == "logfmt");

    fake bad = file_only("[relay]\nlog_format = \"xml\"\n");
    bad.flags["url"] = {"stdout"};
    CHECK(error_of(bad) == "t.toml:2:1: relay.log_format: expected logfmt or json, got \"xml\"");
    bad.file = "[relay]\nlog_format = 1\n";
    CHECK(error_of(bad) == "t.toml:2:1: relay.log_format: expected logfmt or json, got 1");
    bad.file = "[defaults]\nlog_format = \"json\"\n";
    CHECK(error_of(bad) == "t.toml:2:1: unknown key defaults.log_format; did you mean relay.log_format?");
    bad.file.clear();
    bad.env["OUTBOXD_LOG_FORMAT"] = "JSON";
    CHECK(error_of(bad) == "OUTBOXD_LOG_FORMAT: expected logfmt or json, got \"JSON\"");
    bad.env.erase("OUTBOXD_LOG_FORMAT");
    bad.flags["log-format"] = {"text"};
    CHECK(error_of(bad) == "--log-format: expected logfmt or json, got \"text\"");
}

namespace {

// The rows of one "### <heading>" table of README.md's Configuration
// section, by file key: the flag, environment and default cells.
struct readme_row {
    std::string flag, env, default_value;
};

std::string fmt_heading(std::string_view heading) { return "### " + std::string(heading) + "\n"; }

std::map<std::string, readme_row, std::less<>> readme_table(const std::string& readme, std::string_view heading) {
    std::map<std::string, readme_row, std::less<>> out;
    const auto start = readme.find(fmt_heading(heading));
    REQUIRE_MESSAGE(start != std::string::npos, heading);
    const auto end = readme.find("\n#", start + 1);
    std::istringstream lines(readme.substr(start, end - start));
    for (std::string line; std::getline(lines, line);) {
        if (!line.starts_with("| `")) continue;
        std::vector<std::string> cells;
        std::size_t pos = 1;
        while (cells.size() < 4) {
            const auto bar = line.find(" |", pos);
            REQUIRE_MESSAGE(bar != std::string::npos, line);
            auto cell = line.substr(pos, bar - pos);
            while (!cell.empty() && cell.front() == ' ') cell.erase(0, 1);
            cells.push_back(cell);
            pos = bar + 2;
        }
        REQUIRE_MESSAGE(cells[0].size() > 2, line);
        const auto key = cells[0].substr(1, cells[0].size() - 2);
        CHECK_MESSAGE(!out.contains(key), "documented twice: " << key);
        out[key] = {cells[1], cells[2], cells[3]};
    }
    return out;
}

// A cell that names `name` starts with it in backticks ("`--ca-file`", or
// "`--signing-secret` (repeatable ...)"); no name, an empty cell.
bool names(const std::string& cell, std::string_view name) {
    if (name.empty()) return cell.empty();
    const auto ticked = "`" + std::string(name) + "`";
    return cell.starts_with(ticked);
}

}  // namespace

TEST_CASE("config: README.md documents every setting of the table, and nothing else, with its spellings and default") {
    const auto readme = read_file(OUTBOXD_README);
    auto relay = readme_table(readme, "Settings of the relay");
    auto destination = readme_table(readme, "Settings of each destination");
    for (const auto& s : setting_spellings()) {
        auto& documented = s.per_destination ? destination : relay;
        CAPTURE(s.key);
        const auto row = documented.find(s.key);
        if (row == documented.end()) {
            FAIL_CHECK("not in README.md's configuration tables: " << s.key);
            continue;
        }
        const auto flag = s.flag.empty() ? std::string() : "--" + std::string(s.flag);
        CHECK_MESSAGE(names(row->second.flag, flag), "flag cell: " << row->second.flag << ", expected " << flag);
        CHECK_MESSAGE(names(row->second.env, s.env), "environment cell: " << row->second.env << ", expected " << s.env);
        CHECK_MESSAGE(row->second.default_value.starts_with(s.default_text),
                      "default cell: " << row->second.default_value << ", expected " << s.default_text);
        documented.erase(row);
    }
    for (const auto& [key, _] : relay) FAIL_CHECK("README.md documents a relay setting the table lacks: " << key);
    for (const auto& [key, _] : destination) {
        FAIL_CHECK("README.md documents a destination setting the table lacks: " << key);
    }
}

TEST_CASE("config: a nats destination: servers, subject template, credentials, and what does not apply") {
    auto f = file_only(R"(
[defaults]
request_timeout = "2s"
[destinations.stream]
type = "nats"
url = "nats://app:s3cretpw@n1:4222, nats://n2:4222"
max_concurrency = 256
nats = { subject = "outbox.{topic}.v1", creds_file = "/etc/outboxd/app.creds" }
tls = { ca_file = "/etc/ca.pem" }
retry = { base = "1s" }
[destinations.hook]
url = "http://h/"
[[routes]]
topics = [">"]
destinations = ["stream", "hook"]
)");
    const auto c = resolve(f);
    const auto& d = c.destinations[0];
    CHECK(d.kind == transport::nats);
    CHECK(d.nats.servers == "nats://app:s3cretpw@n1:4222, nats://n2:4222");
    CHECK(d.nats.subject == "outbox.{topic}.v1");
    CHECK(d.nats.creds_file == "/etc/outboxd/app.creds");
    CHECK(d.max_concurrency == 256);
    CHECK(d.request_timeout == std::chrono::seconds(2));
    CHECK(d.retry.base == std::chrono::seconds(1));
    CHECK(d.tls.ca_file == "/etc/ca.pem");
    CHECK(c.destinations[1].nats.subject == "events.{topic}");  // the default, unused by a webhook

    const auto text = render_config(c);
    CAPTURE(text);
    CHECK(text.find("s3cretpw") == std::string::npos);
    CHECK(text.find("type = \"nats\"\nurl = \"nats://<redacted>@n1:4222,nats://n2:4222\"") != std::string::npos);
    CHECK(text.find("[destinations.stream.nats]\nsubject = \"outbox.{topic}.v1\"") != std::string::npos);
    CHECK(text.find("signing_secrets") == text.rfind("signing_secrets"));  // the webhook's only
    // The rendered file (credentials put back) reads as the same destination.
    auto again_text = text;
    replace_all(again_text, "nats://<redacted>@n1", "nats://app:s3cretpw@n1");
    const auto again = resolve(file_only(again_text));
    CHECK(again.destinations[0].nats.subject == d.nats.subject);
    CHECK(again.destinations[0].nats.servers == "nats://app:s3cretpw@n1:4222,nats://n2:4222");

    struct error_case {
        std::string_view toml;
        std::string_view message;
    };
    const error_case cases[] = {
        {"[destinations.d]\ntype = \"nats\"\n", "t.toml:1:15: destinations.d: missing url (a nats destination needs"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"http://u:pw@h:4222\"\n",
         "t.toml:3:1: destinations.d.url: expected nats://host:port or tls://host:port"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"nats://u:pw@h:4222/x\"\n",
         "t.toml:3:1: destinations.d.url: expected nats://host:port (no path)"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"nats://h:4222\"\nsigning_secrets = []\n",
         "t.toml:4:1: destinations.d.signing_secrets: does not apply to a nats destination"},
        {"[destinations.d]\nurl = \"http://h/\"\nnats = { subject = \"a.{topic}\" }\n",
         "t.toml:3:1: destinations.d.nats: applies to a nats destination only"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"nats://h:4222\"\nnats = { subject = \"a.*.{topic}\" }\n",
         "t.toml:4:10: destinations.d.nats.subject: expected a NATS subject: '.'-separated non-empty tokens"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"nats://h:4222\"\nnats = { subject = \"a.{topik}\" }\n",
         "t.toml:4:10: destinations.d.nats.subject: expected a NATS subject where {topic} is the only placeholder"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"nats://h:4222\"\nnats = { subject = \"a..{topic}\" }\n",
         "t.toml:4:10: destinations.d.nats.subject: expected a NATS subject"},
        {"[destinations.d]\ntype = \"nats\"\nurl = \"nats://h:4222\"\nnats = { subjekt = \"a\" }\n",
         "t.toml:4:10: unknown key destinations.d.nats.subjekt"},
    };
    for (const auto& e : cases) {
        CAPTURE(e.toml);
        const auto message = error_of(file_only(std::string(e.toml) + "[[routes]]\ntopics = [\">\"]\ndestinations = [\"d\"]\n"));
        CHECK_MESSAGE(message.starts_with(e.message), message);
        CHECK(message.find("pw") == std::string::npos);
    }
}
