#include "core/log.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <unistd.h>

namespace lg = outboxd::log;

namespace {

// 2026-11-29T22:18:12.345Z
const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(1'795'990'692'345));

std::string_view without_newline(const std::string& line) {
    REQUIRE(!line.empty());
    REQUIRE(line.back() == '\n');
    return std::string_view(line).substr(0, line.size() - 1);
}

// What `write` puts on stderr while `f` runs.
template <typename F>
std::string stderr_of(F&& f) {
    std::FILE* capture = std::tmpfile();
    REQUIRE(capture != nullptr);
    std::fflush(stderr);
    const int saved = ::dup(2);
    ::dup2(::fileno(capture), 2);
    f();
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::rewind(capture);
    std::string out;
    for (int c = std::fgetc(capture); c != EOF; c = std::fgetc(capture)) out.push_back(static_cast<char>(c));
    std::fclose(capture);
    return out;
}

}  // namespace

TEST_CASE("log: formats are parsed by name") {
    CHECK(lg::parse_format("logfmt") == lg::format::logfmt);
    CHECK(lg::parse_format("json") == lg::format::json);
    CHECK_THROWS_WITH_AS((void)lg::parse_format("JSON"), "invalid log format 'JSON': expected logfmt or json",
                         std::invalid_argument);
    CHECK_THROWS_AS((void)lg::parse_format(""), std::invalid_argument);
}

TEST_CASE("log: a logfmt record, exact bytes") {
    CHECK(lg::render(lg::format::logfmt, at, lg::level::info, "relay started",
                      {{"schema", "outbox"}, {"error", "HTTP 500: \"no\"\n"}, {"empty", ""}}) ==
          "ts=2026-11-29T22:18:12.345Z level=info msg=\"relay started\" schema=outbox "
          "error=\"HTTP 500: \\\"no\\\"\\n\" empty=\"\"\n");
}

TEST_CASE("log: a json record, exact bytes: the same keys in the same order, every value a string") {
    CHECK(lg::render(lg::format::json, at, lg::level::warn, "delivery failed; will retry",
                      {{"event_id", "42"}, {"destination", "orders"}, {"error", "HTTP 500: \"no\"\n"}, {"empty", ""}}) ==
          R"({"ts":"2026-11-29T22:18:12.345Z","level":"warn","msg":"delivery failed; will retry",)"
          R"("event_id":"42","destination":"orders","error":"HTTP 500: \"no\"\n","empty":""})"
          "\n");
    CHECK(lg::render(lg::format::json, at, lg::level::debug, "x", {}) ==
          "{\"ts\":\"2026-11-29T22:18:12.345Z\",\"level\":\"debug\",\"msg\":\"x\"}\n");
}

TEST_CASE("log: every json record is one line a JSON parser reads back to the values given") {
    const std::string nasty_ascii = std::string("q\"b\\s/n\nr\rt\tnul") + '\0' + "\x01\x1f\x7f end";
    const std::string utf8 = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";  // café € 😀
    const std::string invalid = "bad \xFF\xFE byte \xC3";                  // not UTF-8: repaired, not dropped
    const auto line = lg::render(lg::format::json, at, lg::level::error, nasty_ascii,
                                  {{"a", nasty_ascii}, {"b", utf8}, {"c", invalid}});
    const auto text = without_newline(line);
    CHECK(text.find('\n') == std::string_view::npos);
    CHECK(text.find('\r') == std::string_view::npos);
    const auto j = nlohmann::json::parse(text);  // throws on invalid JSON or invalid UTF-8
    REQUIRE(j.is_object());
    CHECK(j.size() == 6);
    CHECK(j["ts"] == "2026-11-29T22:18:12.345Z");
    CHECK(j["level"] == "error");
    CHECK(j["msg"] == nasty_ascii);
    CHECK(j["a"] == nasty_ascii);
    CHECK(j["b"] == utf8);
    CHECK(j["c"] == "bad \xEF\xBF\xBD\xEF\xBF\xBD byte \xEF\xBF\xBD");
    // Key order as given (a log reader scans left to right).
    CHECK(text.find("\"ts\"") < text.find("\"level\""));
    CHECK(text.find("\"msg\"") < text.find("\"a\""));
    CHECK(text.find("\"a\"") < text.find("\"b\""));
}

TEST_CASE("log: a logfmt record stays on one line whatever its values hold") {
    const auto line = lg::render(lg::format::logfmt, at, lg::level::info, "m", {{"k", "a\nb\rc\x01"}});
    const auto text = without_newline(line);
    CHECK(text.find('\n') == std::string_view::npos);
    CHECK(text.find('\r') == std::string_view::npos);
    CHECK(text.ends_with(R"(k="a\nb\rc\x01")"));
}

TEST_CASE("log: text given to never_show is cut out of every record, in both formats") {
    lg::never_show({"pw-s3cr3t", "Bearer tok-0123456789", "ab"});
    for (const auto f : {lg::format::logfmt, lg::format::json}) {
        lg::set_format(f);
        const auto out = stderr_of([] {
            lg::error("connect as relay:pw-s3cr3t failed",
                      {{"error", "HTTP 401: Bearer tok-0123456789 refused"}, {"short", "ab"}});
        });
        CAPTURE(out);
        CHECK(out.find("pw-s3cr3t") == std::string::npos);
        CHECK(out.find("tok-0123456789") == std::string::npos);
        CHECK(out.find("relay:<redacted> failed") != std::string::npos);
        CHECK(out.find("HTTP 401: <redacted> refused") != std::string::npos);
        CHECK(out.find("ab") != std::string::npos);  // under 4 bytes: left alone
    }
    lg::never_show({});
    lg::set_format(lg::format::logfmt);
    CHECK(stderr_of([] { lg::error("pw-s3cr3t"); }).find("pw-s3cr3t") != std::string::npos);
}
