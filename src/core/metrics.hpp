#pragma once
// A registry of metrics (counters, gauges, histograms, each a family of
// label sets) and their Prometheus text exposition (format 0.0.4), with no
// I/O: the admin listener (src/http/admin_server.hpp) serves expose().
//
// Hand-written rather than prometheus-cpp: Debian ships that library only as
// one -dev package that also pulls in civetweb, libcurl and the push and pull
// libraries (a second HTTP server and an HTTP client) for what is here a
// page of code; the format is small and stable, and metrics_test checks it
// line by line (the e2e test also parses /metrics with the Python client's
// parser).
//
// Thread-safe: values are atomics, a histogram and each family's set of
// children have a mutex. A child, once made, lives as long as the registry,
// so callers keep references to the ones they update often.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace outboxd::metrics {

class counter {
public:
    void inc(double by = 1) noexcept { value_.fetch_add(by, std::memory_order_relaxed); }
    [[nodiscard]] double value() const noexcept { return value_.load(std::memory_order_relaxed); }

private:
    std::atomic<double> value_{0};
};

class gauge {
public:
    void set(double v) noexcept { value_.store(v, std::memory_order_relaxed); }
    void inc(double by = 1) noexcept { value_.fetch_add(by, std::memory_order_relaxed); }
    [[nodiscard]] double value() const noexcept { return value_.load(std::memory_order_relaxed); }

private:
    std::atomic<double> value_{0};
};

class histogram {
public:
    // bounds: the buckets' upper bounds, ascending; +Inf is implied.
    explicit histogram(std::vector<double> bounds);
    void observe(double v);
    struct snapshot {
        std::vector<double> bounds;
        std::vector<std::uint64_t> cumulative;  // one per bound, then +Inf (= count)
        double sum = 0;
        std::uint64_t count = 0;
    };
    [[nodiscard]] snapshot read() const;

private:
    mutable std::mutex mu_;
    std::vector<double> bounds_;
    std::vector<std::uint64_t> counts_;  // per bucket (not cumulative), then +Inf
    double sum_ = 0;
    std::uint64_t count_ = 0;
};

enum class metric_type { counter, gauge, histogram };

class family_base {
public:
    family_base(std::string name, std::string help, std::vector<std::string> label_names, metric_type type);
    virtual ~family_base() = default;
    family_base(const family_base&) = delete;
    family_base& operator=(const family_base&) = delete;
    // Appends HELP, TYPE and one line per sample.
    void write(std::string& out) const;

protected:
    void check_arity(const std::vector<std::string>& values) const;
    virtual void write_children(std::string& out) const = 0;
    std::string name_;
    std::string help_;
    std::vector<std::string> label_names_;
    metric_type type_;
    mutable std::mutex mu_;

    friend class registry;
};

template <typename M>
class family final : public family_base {
public:
    using family_base::family_base;
    family(std::string name, std::string help, std::vector<std::string> label_names, metric_type type,
           std::vector<double> bounds)
        : family_base(std::move(name), std::move(help), std::move(label_names), type), bounds_(std::move(bounds)) {}

    // The child with these label values (in the order of the label names),
    // made at the first call.
    M& with(const std::vector<std::string>& values) {
        check_arity(values);
        std::lock_guard lock(mu_);
        auto& slot = children_[values];
        if (!slot) {
            if constexpr (std::is_same_v<M, histogram>) {
                slot = std::make_unique<M>(bounds_);
            } else {
                slot = std::make_unique<M>();
            }
        }
        return *slot;
    }

private:
    void write_children(std::string& out) const override;
    std::vector<double> bounds_;  // histograms only
    std::map<std::vector<std::string>, std::unique_ptr<M>> children_;
};

template <>
void family<counter>::write_children(std::string& out) const;
template <>
void family<gauge>::write_children(std::string& out) const;
template <>
void family<histogram>::write_children(std::string& out) const;

class registry {
public:
    // Names must be valid Prometheus names and unique; a counter's ends in
    // _total. Throws std::invalid_argument otherwise (a programming error).
    family<counter>& add_counter(std::string name, std::string help, std::vector<std::string> label_names = {});
    family<gauge>& add_gauge(std::string name, std::string help, std::vector<std::string> label_names = {});
    family<histogram>& add_histogram(std::string name, std::string help, std::vector<std::string> label_names,
                                     std::vector<double> bounds);

    // Every family in the order added, in the text format.
    [[nodiscard]] std::string expose() const;

private:
    void check_new(const std::string& name, const std::vector<std::string>& label_names) const;
    mutable std::mutex mu_;
    std::vector<std::unique_ptr<family_base>> families_;
};

// The text format's pieces, public for the tests.
[[nodiscard]] std::string format_value(double v);
[[nodiscard]] std::string escape_label_value(std::string_view v);
[[nodiscard]] std::string escape_help(std::string_view v);
// The content type of expose()'s text.
inline constexpr std::string_view content_type = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace outboxd::metrics
