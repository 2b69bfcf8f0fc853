#include "core/metrics.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

// The registry and its Prometheus text exposition (format 0.0.4): exact bytes.

using namespace outboxd::metrics;

TEST_CASE("metrics: a counter without labels is exposed with HELP, TYPE and its value from the start") {
    registry r;
    auto& c = r.add_counter("outboxd_sweeps_total", "Sweeps run.").with({});
    CHECK(r.expose() == "# HELP outboxd_sweeps_total Sweeps run.\n"
                        "# TYPE outboxd_sweeps_total counter\n"
                        "outboxd_sweeps_total 0\n");
    c.inc();
    c.inc(2);
    CHECK(r.expose().ends_with("outboxd_sweeps_total 3\n"));
}

TEST_CASE("metrics: labelled children in label order, values escaped") {
    registry r;
    auto& f = r.add_counter("x_total", "Things.", {"destination", "outcome"});
    f.with({"b", "delivered"}).inc(5);
    f.with({"a", "dead"}).inc();
    f.with({"we\"ird\\na\nme", "retry"}).inc();
    CHECK(r.expose() == "# HELP x_total Things.\n"
                        "# TYPE x_total counter\n"
                        "x_total{destination=\"a\",outcome=\"dead\"} 1\n"
                        "x_total{destination=\"b\",outcome=\"delivered\"} 5\n"
                        "x_total{destination=\"we\\\"ird\\\\na\\nme\",outcome=\"retry\"} 1\n");
    CHECK_THROWS_AS(f.with({"only one"}), std::invalid_argument);
}

TEST_CASE("metrics: the same child is returned for the same label values") {
    registry r;
    auto& f = r.add_gauge("g", "A gauge.", {"destination"});
    f.with({"a"}).set(2);
    f.with({"a"}).inc(-0.5);
    CHECK(f.with({"a"}).value() == 1.5);
    CHECK(r.expose() == "# HELP g A gauge.\n# TYPE g gauge\ng{destination=\"a\"} 1.5\n");
}

TEST_CASE("metrics: a histogram has cumulative buckets with le, +Inf equal to the count, sum and count") {
    registry r;
    auto& h = r.add_histogram("lat_seconds", "Latency.", {"destination"}, {0.01, 0.1, 1}).with({"a"});
    h.observe(0.005);
    h.observe(0.01);  // an upper bound is inclusive
    h.observe(0.5);
    h.observe(7);
    CHECK(r.expose() == "# HELP lat_seconds Latency.\n"
                        "# TYPE lat_seconds histogram\n"
                        "lat_seconds_bucket{destination=\"a\",le=\"0.01\"} 2\n"
                        "lat_seconds_bucket{destination=\"a\",le=\"0.1\"} 2\n"
                        "lat_seconds_bucket{destination=\"a\",le=\"1\"} 3\n"
                        "lat_seconds_bucket{destination=\"a\",le=\"+Inf\"} 4\n"
                        "lat_seconds_sum{destination=\"a\"} 7.515\n"
                        "lat_seconds_count{destination=\"a\"} 4\n");
}

TEST_CASE("metrics: a histogram without labels puts le alone in the braces") {
    registry r;
    r.add_histogram("size", "Sizes.", {}, {1}).with({}).observe(1);
    CHECK(r.expose() == "# HELP size Sizes.\n# TYPE size histogram\n"
                        "size_bucket{le=\"1\"} 1\nsize_bucket{le=\"+Inf\"} 1\nsize_sum 1\nsize_count 1\n");
}

TEST_CASE("metrics: values: integers plain, fractions shortest, infinities and NaN spelled as the format says") {
    CHECK(format_value(0) == "0");
    CHECK(format_value(42) == "42");
    CHECK(format_value(-3) == "-3");
    CHECK(format_value(0.25) == "0.25");
    CHECK(format_value(1e-6) == "1e-06");
    CHECK(format_value(1e20) == "1e+20");
    CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
    CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
    CHECK(format_value(std::nan("")) == "NaN");
}

TEST_CASE("metrics: HELP escapes backslash and newline only; label values also the double quote") {
    CHECK(escape_help("a \"b\" \\ c\nd") == "a \"b\" \\\\ c\\nd");
    CHECK(escape_label_value("a \"b\" \\ c\nd") == "a \\\"b\\\" \\\\ c\\nd");
    registry r;
    r.add_gauge("h", "line one\nline two").with({}).set(1);
    CHECK(r.expose() == "# HELP h line one\\nline two\n# TYPE h gauge\nh 1\n");
}

TEST_CASE("metrics: families are exposed in the order they were added") {
    registry r;
    r.add_gauge("b", "B.").with({});
    r.add_gauge("a", "A.").with({});
    const auto text = r.expose();
    CHECK(text.find("# HELP b") < text.find("# HELP a"));
}

TEST_CASE("metrics: invalid names, reserved labels, duplicates and bad bounds are refused") {
    registry r;
    CHECK_THROWS_AS(r.add_counter("sweeps", "no _total suffix"), std::invalid_argument);
    CHECK_THROWS_AS(r.add_gauge("1abc", "starts with a digit"), std::invalid_argument);
    CHECK_THROWS_AS(r.add_gauge("a-b", "dash"), std::invalid_argument);
    CHECK_THROWS_AS(r.add_gauge("g", "label", {"__reserved"}), std::invalid_argument);
    CHECK_THROWS_AS(r.add_gauge("g2", "label", {"a:b"}), std::invalid_argument);
    CHECK_THROWS_AS(r.add_histogram("h", "le is the histogram's own", {"le"}, {1}), std::invalid_argument);
    CHECK_THROWS_AS(r.add_histogram("h2", "not ascending", {}, {1, 0.5}), std::invalid_argument);
    CHECK_THROWS_AS(r.add_histogram("h3", "repeated bound", {}, {1, 1}), std::invalid_argument);
    r.add_gauge("ns:name_ok", "colons are allowed in metric names");
    CHECK_THROWS_AS(r.add_gauge("ns:name_ok", "twice"), std::invalid_argument);
}
