#include "core/dsn.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>

using outboxd::is_uri_dsn;
using outboxd::redact_dsn;
using outboxd::scrub_secrets;
using outboxd::with_default;

namespace {

constexpr auto npos = std::string::npos;

}  // namespace

// ---- is_uri_dsn -------------------------------------------------------------

TEST_CASE("dsn: both URI schemes are URIs, key=value lists are not") {
    CHECK(is_uri_dsn("postgresql://localhost/app"));
    CHECK(is_uri_dsn("postgres://localhost/app"));
    CHECK(is_uri_dsn("PostgreSQL://localhost/app"));
    CHECK(is_uri_dsn("postgresql://"));
    CHECK_FALSE(is_uri_dsn("host=localhost dbname=app"));
    CHECK_FALSE(is_uri_dsn(""));
    CHECK_FALSE(is_uri_dsn("postgresql:/localhost"));
    CHECK_FALSE(is_uri_dsn("mysql://localhost/app"));
    CHECK_FALSE(is_uri_dsn("postgresq"));
}

// ---- redact_dsn: URIs -------------------------------------------------------

TEST_CASE("dsn: redact a URI with user:password@") {
    const std::string out = redact_dsn("postgresql://alice:s3cret@db.example.com:5432/app?sslmode=require");
    CHECK(out == "postgresql://alice:***@db.example.com:5432/app?sslmode=require");
    CHECK(out.find("s3cret") == npos);
}

TEST_CASE("dsn: redact a URI with the postgres:// scheme") {
    const std::string out = redact_dsn("postgres://bob:s3cret@localhost/x");
    CHECK(out == "postgres://bob:***@localhost/x");
    CHECK(out.find("s3cret") == npos);
}

TEST_CASE("dsn: a URI without a password is unchanged") {
    CHECK(redact_dsn("postgresql://alice@db:5432/app") == "postgresql://alice@db:5432/app");
    CHECK(redact_dsn("postgresql://db:5432/app") == "postgresql://db:5432/app");
    CHECK(redact_dsn("postgresql:///app?host=/run/postgresql") == "postgresql:///app?host=/run/postgresql");
    CHECK(redact_dsn("postgresql://") == "postgresql://");
    CHECK(redact_dsn("postgresql://[::1]:5432/app") == "postgresql://[::1]:5432/app");
}

TEST_CASE("dsn: redact a password in the URI query string") {
    const std::string a = redact_dsn("postgresql://db/app?user=alice&password=s3cret&sslmode=require");
    CHECK(a == "postgresql://db/app?user=alice&password=***&sslmode=require");
    CHECK(a.find("s3cret") == npos);

    const std::string b = redact_dsn("postgresql://db/app?password=s3cret");
    CHECK(b == "postgresql://db/app?password=***");
    CHECK(b.find("s3cret") == npos);

    const std::string c = redact_dsn("postgresql://db/app?sslmode=require&password=s3cret");
    CHECK(c == "postgresql://db/app?sslmode=require&password=***");
    CHECK(c.find("s3cret") == npos);

    // given twice (libpq keeps the last): both go
    const std::string d = redact_dsn("postgresql://db/app?password=s3cret&password=s3cret2");
    CHECK(d == "postgresql://db/app?password=***&password=***");
    CHECK(d.find("s3cret") == npos);

    // a longer key that ends in "password" is not the password
    CHECK(redact_dsn("postgresql://db/app?xpassword=1") == "postgresql://db/app?xpassword=1");
}

TEST_CASE("dsn: redact both the userinfo and the query password") {
    const std::string out = redact_dsn("postgresql://alice:s3cret@db/app?password=s3cret");
    CHECK(out == "postgresql://alice:***@db/app?password=***");
    CHECK(out.find("s3cret") == npos);
}

TEST_CASE("dsn: URI passwords with awkward characters") {
    // '@' in the password: the last '@' of the authority ends the userinfo
    const std::string at = redact_dsn("postgresql://alice:s3cr@t@db/app");
    CHECK(at == "postgresql://alice:***@db/app");
    CHECK(at.find("s3cr") == npos);

    // percent-encoded
    const std::string pct = redact_dsn("postgresql://alice:s3cret%2Fx%40y@db/app");
    CHECK(pct == "postgresql://alice:***@db/app");
    CHECK(pct.find("s3cret") == npos);

    // ':' in the password: the first ':' ends the user name
    const std::string colon = redact_dsn("postgresql://alice:s3c:ret@db:5432/app");
    CHECK(colon == "postgresql://alice:***@db:5432/app");
    CHECK(colon.find("s3c") == npos);

    // several hosts
    const std::string multi = redact_dsn("postgresql://alice:s3cret@h1:5432,h2:5433/app");
    CHECK(multi == "postgresql://alice:***@h1:5432,h2:5433/app");
    CHECK(multi.find("s3cret") == npos);

    // an empty password is still marked as given
    CHECK(redact_dsn("postgresql://alice:@db/app") == "postgresql://alice:***@db/app");

    // no path at all
    const std::string bare = redact_dsn("postgresql://alice:s3cret@db");
    CHECK(bare == "postgresql://alice:***@db");
    CHECK(bare.find("s3cret") == npos);
}

TEST_CASE("dsn: a '?' or '&' in a URI password does not leak it") {
    // libpq reads the userinfo up to the '@' (it stops early only at '/'), so
    // an unencoded '?' is part of the password: "s3cret?x" here.
    const std::string q = redact_dsn("postgresql://alice:s3cret?x@db/app");
    CHECK(q.find("s3cret") == npos);
    CHECK(q == "postgresql://alice:***@db/app");

    const std::string amp = redact_dsn("postgresql://alice:s3cret&x@db/app?sslmode=require");
    CHECK(amp.find("s3cret") == npos);
    CHECK(amp == "postgresql://alice:***@db/app?sslmode=require");
}

// ---- redact_dsn: key=value --------------------------------------------------

TEST_CASE("dsn: redact password= in a key=value list") {
    const std::string out = redact_dsn("host=db user=alice password=s3cret dbname=app");
    CHECK(out == "host=db user=alice password=*** dbname=app");
    CHECK(out.find("s3cret") == npos);

    const std::string first = redact_dsn("password=s3cret host=db");
    CHECK(first == "password=*** host=db");
    CHECK(first.find("s3cret") == npos);

    const std::string last = redact_dsn("host=db password=s3cret");
    CHECK(last == "host=db password=***");
    CHECK(last.find("s3cret") == npos);

    // spaces around '=' are allowed by libpq
    // (how the spaces around '=' come out is not specified)
    const std::string spaced = redact_dsn("host=db password = s3cret port=5432");
    CHECK(spaced.find("s3cret") == npos);
    CHECK(spaced.starts_with("host=db password"));
    CHECK((spaced.ends_with("=*** port=5432") || spaced.ends_with("= *** port=5432")));

    // '=' inside an unquoted value
    const std::string eq = redact_dsn("password=s3=cret host=db");
    CHECK(eq == "password=*** host=db");
    CHECK(eq.find("cret") == npos);

    // an empty value
    CHECK(redact_dsn("host=db password=") == "host=db password=***");
}

TEST_CASE("dsn: quoted password values with spaces and escapes") {
    const std::string spaces = redact_dsn("password='my s3cret value' host=db");
    CHECK(spaces == "password=*** host=db");
    CHECK(spaces.find("s3cret") == npos);
    CHECK(spaces.find("value") == npos);

    // password='it\'s s3cret'
    const std::string quote = redact_dsn("host=db password='it\\'s s3cret' dbname=app");
    CHECK(quote == "host=db password=*** dbname=app");
    CHECK(quote.find("s3cret") == npos);

    // password='s3cret\\' (ends in an escaped backslash)
    const std::string backslash = redact_dsn("password='s3cret\\\\' host=db");
    CHECK(backslash == "password=*** host=db");
    CHECK(backslash.find("s3cret") == npos);

    // password='a\' s3cret' user=x : the escaped quote does not end the value
    const std::string tricky = redact_dsn("password='a\\' s3cret' user=x");
    CHECK(tricky == "password=*** user=x");
    CHECK(tricky.find("s3cret") == npos);

    // unterminated quote: everything after password= is hidden
    const std::string open = redact_dsn("host=db password='s3cret user=x");
    CHECK(open.find("s3cret") == npos);
    CHECK(open.find("user=x") == npos);
}

TEST_CASE("dsn: other keys' quoted values are kept as written") {
    CHECK(redact_dsn("application_name='my app' password=s3cret host=db") ==
          "application_name='my app' password=*** host=db");
    CHECK(redact_dsn("options='-c search_path=x' host=db") == "options='-c search_path=x' host=db");
}

TEST_CASE("dsn: key=value without a password is unchanged") {
    CHECK(redact_dsn("host=db user=alice dbname=app") == "host=db user=alice dbname=app");
    CHECK(redact_dsn("") == "");
    // a key named like password but not it
    CHECK(redact_dsn("passwordx=1 host=db") == "passwordx=1 host=db");
}

TEST_CASE("dsn: an unquoted password with an escaped space does not leak its tail") {
    // libpq reads backslash escapes in unquoted values too: the password is "my s3cret".
    const std::string out = redact_dsn("host=db password=my\\ s3cret dbname=app");
    CHECK(out.find("s3cret") == npos);
}

TEST_CASE("dsn: unparseable key=value input is not echoed") {
    // A password with spaces that its owner forgot to quote: libpq refuses the
    // string, and redact_dsn promises not to echo what it cannot parse.
    const std::string out = redact_dsn("host=db password=correct s3cret");
    CHECK(out.find("s3cret") == npos);
}

// ---- scrub_secrets ----------------------------------------------------------

TEST_CASE("dsn: scrub_secrets replaces the quoted connection string with its redaction") {
    const std::string dsn = "host=db user=alice password=s3cret";
    const std::string out = scrub_secrets("could not connect using 'host=db user=alice password=s3cret': timeout", dsn);
    CHECK(out == "could not connect using 'host=db user=alice password=***': timeout");
    CHECK(out.find("s3cret") == npos);

    const std::string uri = "postgresql://alice:s3cret@db/app";
    const std::string twice = scrub_secrets(uri + " and again " + uri, uri);
    CHECK(twice == "postgresql://alice:***@db/app and again postgresql://alice:***@db/app");
    CHECK(twice.find("s3cret") == npos);

    // the redaction is longer than the original: no infinite loop, no re-scan
    const std::string shortpw = "password=s";
    CHECK(scrub_secrets("[password=s][password=s]", shortpw) == "[password=***][password=***]");
}

TEST_CASE("dsn: scrub_secrets leaves other messages alone") {
    CHECK(scrub_secrets("connection refused", "host=db password=s3cret") == "connection refused");
    CHECK(scrub_secrets("connection refused", "") == "connection refused");
    CHECK(scrub_secrets("", "host=db password=s3cret") == "");
    CHECK(scrub_secrets("host=db", "host=db") == "host=db");
}

TEST_CASE("dsn: scrub_secrets removes a password= fragment quoted without the rest of the string") {
    // libpq quotes single options in some errors, e.g. for a value it refuses.
    const std::string dsn = "host=db password=s3cret sslmode=bogus";
    const std::string out = scrub_secrets("invalid connection option near \"password=s3cret\"", dsn);
    CHECK(out.find("s3cret") == npos);
}

TEST_CASE("dsn: scrub_secrets hides the password in libpq's complaint about an unquoted space") {
    // A password with a space its owner forgot to quote. This is libpq's own
    // error for that string, word for word (PQconninfoParse, libpq 15), and it
    // reaches the logs through scrub_secrets(e.what(), dsn).
    const std::string dsn = "host=db password=correct s3cret";
    const std::string out = scrub_secrets("missing \"=\" after \"s3cret\" in connection info string\n", dsn);
    CHECK(out.find("s3cret") == npos);
}

// ---- with_default -----------------------------------------------------------

TEST_CASE("dsn: with_default on a URI without a query adds one") {
    CHECK(with_default("postgresql://db/app", "application_name", "outboxd") ==
          "postgresql://db/app?application_name=outboxd");
    CHECK(with_default("postgres://alice:s3cret@db:5432/app", "connect_timeout", "10") ==
          "postgres://alice:s3cret@db:5432/app?connect_timeout=10");
}

TEST_CASE("dsn: with_default on a URI with a query appends to it") {
    CHECK(with_default("postgresql://db/app?sslmode=require", "application_name", "outboxd") ==
          "postgresql://db/app?sslmode=require&application_name=outboxd");
    // a longer key that ends in the same name is a different key
    CHECK(with_default("postgresql://db/app?fallback_application_name=x", "application_name", "outboxd") ==
          "postgresql://db/app?fallback_application_name=x&application_name=outboxd");
}

TEST_CASE("dsn: with_default keeps a URI's own setting") {
    for (const std::string_view dsn : {"postgresql://db/app?application_name=mine",
                                       "postgresql://db/app?sslmode=require&application_name=mine",
                                       "postgresql://db/app?application_name=mine&sslmode=require"}) {
        CAPTURE(dsn);
        CHECK(with_default(dsn, "application_name", "outboxd") == dsn);
    }
}

TEST_CASE("dsn: with_default on key=value") {
    CHECK(with_default("host=db dbname=app", "application_name", "outboxd") ==
          "host=db dbname=app application_name=outboxd");
    CHECK(with_default("host=db fallback_application_name=x", "application_name", "outboxd") ==
          "host=db fallback_application_name=x application_name=outboxd");
    // chained, as the app does it
    CHECK(with_default(with_default("host=db", "application_name", "outboxd"), "connect_timeout", "10") ==
          "host=db application_name=outboxd connect_timeout=10");
}

TEST_CASE("dsn: with_default keeps a key=value list's own setting") {
    for (const std::string_view dsn : {"application_name=mine host=db", "host=db application_name=mine",
                                       "host=db\tapplication_name=mine", "host=db application_name='my app'"}) {
        CAPTURE(dsn);
        CHECK(with_default(dsn, "application_name", "outboxd") == dsn);
    }
}

TEST_CASE("dsn: with_default on an empty connection string") {
    // libpq takes "" as all defaults (environment variables, local socket)
    CHECK(with_default("", "application_name", "outboxd") == "application_name=outboxd");
    CHECK(with_default(with_default("", "application_name", "outboxd"), "connect_timeout", "10") ==
          "application_name=outboxd connect_timeout=10");
}

TEST_CASE("dsn: with_default sees a setting written with spaces around '='") {
    // libpq accepts "key = value" and keeps the LAST value given for a key, so
    // appending a default here would silently override the user's own setting.
    const std::string_view dsn = "host=db connect_timeout = 30";
    CHECK(with_default(dsn, "connect_timeout", "10") == dsn);
}

TEST_CASE("dsn: with_default keeps an empty or '&'-terminated URI query valid") {
    // libpq accepts an empty query and a trailing '&', but refuses an empty
    // parameter ("missing key/value separator") such as the one "?&" makes.
    CHECK(with_default("postgresql://db/app?", "application_name", "outboxd") ==
          "postgresql://db/app?application_name=outboxd");
    CHECK(with_default("postgresql://db/app?sslmode=require&", "application_name", "outboxd") ==
          "postgresql://db/app?sslmode=require&application_name=outboxd");
}

// ---- with_connection_defaults ----------------------------------------------

TEST_CASE("dsn: connection defaults are added to a URI and to key=value, the user's own kept") {
    using namespace std::chrono_literals;
    CHECK(outboxd::with_connection_defaults("postgresql://alice:s3cret@db/app", 10s, 10s) ==
          "postgresql://alice:s3cret@db/app?application_name=outboxd&connect_timeout=10&keepalives=1"
          "&keepalives_idle=5&keepalives_interval=1&keepalives_count=3&tcp_user_timeout=10000");
    CHECK(outboxd::with_connection_defaults("postgresql://db/app?keepalives_idle=60&sslmode=require", 3s, 2500ms) ==
          "postgresql://db/app?keepalives_idle=60&sslmode=require&application_name=outboxd&connect_timeout=3"
          "&keepalives=1&keepalives_interval=1&keepalives_count=3&tcp_user_timeout=2500");
    CHECK(outboxd::with_connection_defaults("host=db password='a b' tcp_user_timeout=0", 2s, 30s) ==
          "host=db password='a b' tcp_user_timeout=0 application_name=outboxd connect_timeout=2 keepalives=1 "
          "keepalives_idle=15 keepalives_interval=5 keepalives_count=3");
}

TEST_CASE("dsn: connection defaults libpq accepts and a short keepalive timeout in whole seconds") {
    using namespace std::chrono_literals;
    // 1.5 s rounds up to 2: idle 1, interval 1.
    const auto dsn = outboxd::with_connection_defaults("dbname=app", 2s, 1500ms);
    CHECK(dsn == "dbname=app application_name=outboxd connect_timeout=2 keepalives=1 keepalives_idle=1 "
                 "keepalives_interval=1 keepalives_count=3 tcp_user_timeout=1500");
}
