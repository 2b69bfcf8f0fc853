// The NATS destination's pure parts: subjects from topics, server lists,
// and what a JetStream publish acknowledgement means for the relay.

#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "nats/publish_ack.hpp"
#include "nats/subject.hpp"

using namespace outboxd::nats;

TEST_CASE("nats: the subject of a topic, and topics that make no valid subject") {
    CHECK(subject_for("events.{topic}", "orders.created") == "events.orders.created");
    CHECK(subject_for("{topic}", "orders") == "orders");
    CHECK(subject_for("a.{topic}.{topic}", "x") == "a.x.x");
    CHECK(subject_for("fixed.subject", "anything") == "fixed.subject");
    CHECK_FALSE(subject_for("events.{topic}", "has space"));
    CHECK_FALSE(subject_for("events.{topic}", "a..b"));
    CHECK_FALSE(subject_for("events.{topic}", "orders."));
    CHECK_FALSE(subject_for("events.{topic}", "orders.*"));
    CHECK_FALSE(subject_for("events.{topic}", "orders.>"));
    CHECK_FALSE(subject_for("events.{topic}", "tab\tbed"));
    CHECK_FALSE(subject_for("events.{topic}", ""));
}

TEST_CASE("nats: subject templates") {
    CHECK_FALSE(subject_template_error("events.{topic}"));
    CHECK_FALSE(subject_template_error("{topic}"));
    CHECK_FALSE(subject_template_error("all.in.one"));
    CHECK(subject_template_error(""));
    CHECK(subject_template_error("events."));
    CHECK(subject_template_error("events.>"));
    CHECK(subject_template_error("events.*.{topic}"));
    CHECK(subject_template_error("events {topic}"));
    CHECK(subject_template_error("events.{Topic}"));
    CHECK(subject_template_error("events.{topic"));
}

TEST_CASE("nats: server lists, and credentials kept out of logs") {
    CHECK(parse_servers("nats://h:4222") == std::vector<std::string>{"nats://h:4222"});
    CHECK(parse_servers("nats://a:1, tls://u:p@b:2") == std::vector<std::string>{"nats://a:1", "tls://u:p@b:2"});
    CHECK_THROWS_AS((void)parse_servers("http://h:4222"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_servers("h:4222"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_servers("nats://h:4222,"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_servers("nats://h:4222/path"), std::invalid_argument);
    CHECK_THROWS_AS((void)parse_servers("nats://user:pw@"), std::invalid_argument);
    try {
        (void)parse_servers("nats://user:hunter2@h/x");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("hunter2") == std::string::npos);
    }
    CHECK(loggable_servers("nats://u:hunter2@a:1,nats://b:2") == "nats://<redacted>@a:1,nats://b:2");
    CHECK(loggable_servers("tls://t0ken@a:1") == "tls://<redacted>@a:1");
    CHECK(loggable_servers("nats://a:1") == "nats://a:1");
}

TEST_CASE("nats: a publish acknowledgement, judged like a webhook response") {
    struct ack_case {
        std::string_view reply;
        bool no_responders;
        bool transport_error;
        unsigned status;
        std::string_view error_part;
    };
    const ack_case cases[] = {
        {R"({"stream":"EVENTS","seq":42})", false, false, 200, ""},
        {R"({"stream":"EVENTS","seq":42,"duplicate":true})", false, false, 200, ""},
        {R"({"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}})", false, false, 503,
         "maximum messages exceeded (code 503, err_code 10077)"},
        {R"({"error":{"code":400,"description":"bad"}})", false, false, 400, "bad"},
        {R"({"error":{"code":7}})", false, false, 500, "code 7"},
        {"", true, true, 0, "no JetStream stream captures subject events.x (no responders)"},
        {"not json", false, true, 0, "not a JetStream publish acknowledgement: not json"},
        {R"({"stream":"EVENTS"})", false, true, 0, "not a JetStream publish acknowledgement"},
        {R"([1,2])", false, true, 0, "not a JetStream publish acknowledgement"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.reply);
        const auto r = judge_publish_ack(c.reply, c.no_responders, "events.x");
        CHECK(r.transport_error == c.transport_error);
        CHECK(r.status == c.status);
        CHECK_MESSAGE(r.error.find(c.error_part) != std::string::npos, r.error);
    }
    const auto dup = judge_publish_ack(R"({"stream":"EVENTS","seq":42,"duplicate":true})", false, "s");
    CHECK(dup.duplicate);
    CHECK(dup.seq == 42);
}
