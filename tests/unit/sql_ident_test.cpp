#include "core/sql_ident.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <string_view>

using outboxd::max_schema_name_bytes;
using outboxd::notify_channel;
using outboxd::quote_ident;
using outboxd::quote_literal;
using outboxd::render_sql;
using outboxd::validate_schema_name;

namespace {

// The message of the std::invalid_argument thrown for `name` ("" if none).
std::string error_of(std::string_view name) {
    try {
        validate_schema_name(name);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return {};
}

bool contains(std::string_view haystack, std::string_view needle) {
    return haystack.find(needle) != std::string_view::npos;
}

}  // namespace

TEST_CASE("sql_ident: ordinary names are valid") {
    CHECK_NOTHROW(validate_schema_name("outbox"));
    CHECK_NOTHROW(validate_schema_name("a"));
    CHECK_NOTHROW(validate_schema_name("Outbox_2"));
    CHECK_NOTHROW(validate_schema_name("public"));
    CHECK_NOTHROW(validate_schema_name("pg"));       // only the pg_ prefix is reserved
    CHECK_NOTHROW(validate_schema_name("xpg_foo"));  // ... and only as a prefix
    CHECK_NOTHROW(validate_schema_name("PG_foo"));   // ... and only in lower case
}

TEST_CASE("sql_ident: hostile but legal names are accepted (they are always quoted)") {
    for (const std::string_view name : {"my schema", "a\"b", "\"", "\"\"", "x\"; DROP TABLE t; --", "a;b",
                                        "o'brien", "semi;colon", "-- comment", "$$", ":\"schema\"", "\\",
                                        "a.b", "DROP"}) {
        CAPTURE(name);
        CHECK_NOTHROW(validate_schema_name(name));
    }
    CHECK_NOTHROW(validate_schema_name("\xC3\xA9v\xC3\xA9nements"));  // "événements"
    CHECK_NOTHROW(validate_schema_name("\xE2\x82\xAC"));              // "€"
    CHECK_NOTHROW(validate_schema_name("\xF0\x9F\x93\xA6"));          // U+1F4E6
}

TEST_CASE("sql_ident: empty name is refused") {
    CHECK(contains(error_of(""), "empty"));
}

TEST_CASE("sql_ident: 55 bytes is the limit, 56 is refused") {
    REQUIRE(max_schema_name_bytes == 55);
    CHECK_NOTHROW(validate_schema_name(std::string(55, 'a')));
    const std::string message = error_of(std::string(56, 'a'));
    CHECK(contains(message, "56"));
    CHECK(contains(message, "55"));
    CHECK_THROWS_AS(validate_schema_name(std::string(1000, 'a')), std::invalid_argument);

    // bytes, not characters: 27 two-byte characters = 54 bytes fit, 28 = 56 do not
    std::string e27;
    for (int i = 0; i < 27; ++i) e27 += "\xC3\xA9";
    CHECK_NOTHROW(validate_schema_name(e27));
    CHECK_NOTHROW(validate_schema_name(e27 + "a"));
    CHECK_THROWS_AS(validate_schema_name(e27 + "\xC3\xA9"), std::invalid_argument);

    // the channel of the longest name still fits PostgreSQL's 63-byte identifiers
    CHECK(notify_channel(std::string(55, 'a')).size() == 63);
}

TEST_CASE("sql_ident: control characters and NUL are refused") {
    for (const std::string_view name :
         {std::string_view("a\0b", 3), std::string_view("\0", 1), std::string_view("a\nb"),
          std::string_view("a\rb"), std::string_view("a\tb"), std::string_view("\x1f"),
          std::string_view("a\x7f"), std::string_view("\x01schema")}) {
        CAPTURE(name.size());
        CHECK(contains(error_of(name), "control character"));
    }
}

TEST_CASE("sql_ident: invalid UTF-8 is refused") {
    for (const std::string_view name : {"\xff", "abc\xC3", "\xC3\x28", "\xC0\xAF", "\xED\xA0\x80",
                                        "\xF4\x90\x80\x80", "\x80", "a\xE2\x82"}) {
        CAPTURE(name);
        CHECK(contains(error_of(name), "UTF-8"));
    }
}

TEST_CASE("sql_ident: the pg_ prefix is reserved") {
    CHECK(contains(error_of("pg_outbox"), "pg_"));
    CHECK_THROWS_AS(validate_schema_name("pg_"), std::invalid_argument);
    CHECK_THROWS_AS(validate_schema_name("pg_catalog"), std::invalid_argument);
    CHECK_THROWS_AS(validate_schema_name("pg_temp"), std::invalid_argument);
}

TEST_CASE("sql_ident: quote_ident doubles double quotes and nothing else") {
    CHECK(quote_ident("outbox") == "\"outbox\"");
    CHECK(quote_ident("") == "\"\"");
    CHECK(quote_ident("a\"b") == "\"a\"\"b\"");
    CHECK(quote_ident("\"") == "\"\"\"\"");
    CHECK(quote_ident("\"\"") == "\"\"\"\"\"\"");
    CHECK(quote_ident("it's") == "\"it's\"");
    CHECK(quote_ident("my schema") == "\"my schema\"");
    CHECK(quote_ident("x\"; DROP TABLE t; --") == "\"x\"\"; DROP TABLE t; --\"");
    CHECK(quote_ident("\xC3\xA9") == "\"\xC3\xA9\"");
    CHECK(quote_ident("Upper") == "\"Upper\"");  // case is kept, quoting is what keeps it
}

TEST_CASE("sql_ident: quote_literal doubles single quotes and nothing else") {
    CHECK(quote_literal("outbox") == "'outbox'");
    CHECK(quote_literal("") == "''");
    CHECK(quote_literal("o'brien") == "'o''brien'");
    CHECK(quote_literal("'") == "''''");
    CHECK(quote_literal("''") == "''''''");
    CHECK(quote_literal("a\"b") == "'a\"b'");
    // standard_conforming_strings: a backslash is an ordinary character
    CHECK(quote_literal("a\\b") == "'a\\b'");
    CHECK(quote_literal("'); DROP TABLE t; --") == "'''); DROP TABLE t; --'");
}

TEST_CASE("sql_ident: render_sql replaces every :\"schema\" placeholder") {
    CHECK(render_sql(":\"schema\"", "outbox") == "\"outbox\"");
    CHECK(render_sql("CREATE TABLE :\"schema\".events (id int);", "outbox") ==
          "CREATE TABLE \"outbox\".events (id int);");
    CHECK(render_sql("SELECT 1 FROM :\"schema\".a JOIN :\"schema\".b USING (id)", "s") ==
          "SELECT 1 FROM \"s\".a JOIN \"s\".b USING (id)");
    // adjacent placeholders
    CHECK(render_sql(":\"schema\":\"schema\"", "s") == "\"s\"\"s\"");
    // the name is quoted with quote_ident
    CHECK(render_sql("SET search_path = :\"schema\", pg_temp", "a\"b; DROP") ==
          "SET search_path = \"a\"\"b; DROP\", pg_temp");
    // a schema name that looks like the placeholder is not expanded again
    CHECK(render_sql("x :\"schema\" y", ":\"schema\"") == "x \":\"\"schema\"\"\" y");
}

TEST_CASE("sql_ident: render_sql leaves everything else alone") {
    CHECK(render_sql("", "outbox").empty());
    CHECK(render_sql("SELECT 1", "outbox") == "SELECT 1");
    // psql's other variable forms and near misses are not ours
    for (const std::string_view text : {":'x'", ":x", ":\"x\"", "\":schema\"", ":schema", ":'schema'",
                                        ":\"Schema\"", ":\"schema", "\"schema\"", ": \"schema\"",
                                        "::\"text\"", "$1", "x::text"}) {
        CAPTURE(text);
        CHECK(render_sql(text, "outbox") == text);
    }
    CHECK(render_sql("SELECT :'x', :\"schema\".t, \":schema\"", "o") == "SELECT :'x', \"o\".t, \":schema\"");
    // a cast right before a placeholder: "::" then the placeholder
    CHECK(render_sql("::\"schema\"", "o") == ":\"o\"");
}

TEST_CASE("sql_ident: notify_channel matches the trigger's 'outboxd.' || schema") {
    CHECK(notify_channel("outbox") == "outboxd.outbox");
    CHECK(notify_channel("my schema") == "outboxd.my schema");
    CHECK(notify_channel("a\"b") == "outboxd.a\"b");  // the raw name: quoting is the caller's business
}
