#include "core/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace outboxd::metrics {
namespace {

bool valid_name(std::string_view n, bool colon_ok) {
    if (n.empty()) return false;
    const auto head = [&](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
    };
    if (!head(n[0])) return false;
    return std::all_of(n.begin() + 1, n.end(), [&](char c) { return head(c) || (c >= '0' && c <= '9'); });
}

std::string label_text(const std::vector<std::string>& names, const std::vector<std::string>& values,
                       std::string_view extra_name = {}, std::string_view extra_value = {}) {
    if (names.empty() && extra_name.empty()) return {};
    std::string out = "{";
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i > 0) out += ',';
        out += fmt::format("{}=\"{}\"", names[i], escape_label_value(values[i]));
    }
    if (!extra_name.empty()) {
        if (!names.empty()) out += ',';
        out += fmt::format("{}=\"{}\"", extra_name, extra_value);
    }
    return out + "}";
}

std::string_view type_name(metric_type t) {
    switch (t) {
        case metric_type::counter: return "counter";
        case metric_type::gauge: return "gauge";
        case metric_type::histogram: return "histogram";
    }
    return "untyped";
}

}  // namespace

std::string format_value(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    // Whole numbers as integers (counts), anything else as the shortest text
    // that reads back as the same double.
    if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<long long>(v));
    return fmt::format("{}", v);
}

std::string escape_label_value(std::string_view v) {
    std::string out;
    out.reserve(v.size());
    for (const char c : v) {
        switch (c) {
            case '\\': out += "\\\\"; break;
            case '"': out += "\\\""; break;
            case '\n': out += "\\n"; break;
            default: out += c;
        }
    }
    return out;
}

std::string escape_help(std::string_view v) {
    std::string out;
    out.reserve(v.size());
    for (const char c : v) {
        switch (c) {
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            default: out += c;
        }
    }
    return out;
}

// ---- histogram -----------------------------------------------------------------

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
    if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
        std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end()) {
        throw std::invalid_argument("histogram bounds must be strictly ascending");
    }
}

void histogram::observe(double v) {
    // The first bucket whose upper bound is >= v (bounds are inclusive: le).
    const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
    std::lock_guard lock(mu_);
    ++counts_[i];
    sum_ += v;
    ++count_;
}

histogram::snapshot histogram::read() const {
    std::lock_guard lock(mu_);
    snapshot s{bounds_, {}, sum_, count_};
    std::uint64_t running = 0;
    for (const auto c : counts_) s.cumulative.push_back(running += c);
    return s;
}

// ---- families ----------------------------------------------------------------

family_base::family_base(std::string name, std::string help, std::vector<std::string> label_names, metric_type type)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)), type_(type) {}

void family_base::check_arity(const std::vector<std::string>& values) const {
    if (values.size() != label_names_.size()) {
        throw std::invalid_argument(fmt::format("{}: {} label values for {} labels", name_, values.size(),
                                                label_names_.size()));
    }
}

void family_base::write(std::string& out) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name_, escape_help(help_), name_, type_name(type_));
    write_children(out);
}

template <>
void family<counter>::write_children(std::string& out) const {
    std::lock_guard lock(mu_);
    for (const auto& [values, c] : children_) {
        out += fmt::format("{}{} {}\n", name_, label_text(label_names_, values), format_value(c->value()));
    }
}

template <>
void family<gauge>::write_children(std::string& out) const {
    std::lock_guard lock(mu_);
    for (const auto& [values, g] : children_) {
        out += fmt::format("{}{} {}\n", name_, label_text(label_names_, values), format_value(g->value()));
    }
}

template <>
void family<histogram>::write_children(std::string& out) const {
    std::lock_guard lock(mu_);
    for (const auto& [values, h] : children_) {
        const auto s = h->read();
        for (std::size_t i = 0; i <= s.bounds.size(); ++i) {
            const auto le = i < s.bounds.size() ? format_value(s.bounds[i]) : std::string("+Inf");
            out += fmt::format("{}_bucket{} {}\n", name_, label_text(label_names_, values, "le", le),
                               s.cumulative[i]);
        }
        const auto labels = label_text(label_names_, values);
        out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name_, labels, format_value(s.sum), name_, labels, s.count);
    }
}

// ---- registry ----------------------------------------------------------------

void registry::check_new(const std::string& name, const std::vector<std::string>& label_names) const {
    if (!valid_name(name, true)) throw std::invalid_argument(fmt::format("invalid metric name '{}'", name));
    for (const auto& l : label_names) {
        if (!valid_name(l, false) || l.starts_with("__") || l == "le") {
            throw std::invalid_argument(fmt::format("{}: invalid label name '{}'", name, l));
        }
    }
    for (const auto& f : families_) {
        if (f->name_ == name) throw std::invalid_argument(fmt::format("metric '{}' registered twice", name));
    }
}

family<counter>& registry::add_counter(std::string name, std::string help, std::vector<std::string> label_names) {
    std::lock_guard lock(mu_);
    check_new(name, label_names);
    if (!name.ends_with("_total")) throw std::invalid_argument(fmt::format("counter '{}' must end in _total", name));
    auto f = std::make_unique<family<counter>>(std::move(name), std::move(help), std::move(label_names),
                                               metric_type::counter);
    auto& ref = *f;
    families_.push_back(std::move(f));
    return ref;
}

family<gauge>& registry::add_gauge(std::string name, std::string help, std::vector<std::string> label_names) {
    std::lock_guard lock(mu_);
    check_new(name, label_names);
    auto f = std::make_unique<family<gauge>>(std::move(name), std::move(help), std::move(label_names),
                                             metric_type::gauge);
    auto& ref = *f;
    families_.push_back(std::move(f));
    return ref;
}

family<histogram>& registry::add_histogram(std::string name, std::string help, std::vector<std::string> label_names,
                                           std::vector<double> bounds) {
    std::lock_guard lock(mu_);
    check_new(name, label_names);
    (void)histogram(bounds);  // checks the bounds now, not at the first observation
    auto f = std::make_unique<family<histogram>>(std::move(name), std::move(help), std::move(label_names),
                                                 metric_type::histogram, std::move(bounds));
    auto& ref = *f;
    families_.push_back(std::move(f));
    return ref;
}

std::string registry::expose() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& f : families_) f->write(out);
    return out;
}

}  // namespace outboxd::metrics
