#include "core/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <stdexcept>

namespace outboxd::log {
namespace {

std::atomic<int> current_level{static_cast<int>(level::info)};
std::mutex write_mutex;

constexpr std::string_view level_name(level l) {
    switch (l) {
        case level::debug: return "debug";
        case level::info: return "info";
        case level::warn: return "warn";
        case level::error: return "error";
    }
    return "info";
}

bool needs_quotes(std::string_view v) {
    if (v.empty()) return true;
    for (const char c : v) {
        if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return true;
    }
    return false;
}

void append_value(std::string& out, std::string_view v) {
    if (!needs_quotes(v)) {
        out.append(v);
        return;
    }
    out.push_back('"');
    for (const char c : v) {
        switch (c) {
            case '"': out.append("\\\""); break;
            case '\\': out.append("\\\\"); break;
            case '\n': out.append("\\n"); break;
            case '\r': out.append("\\r"); break;
            case '\t': out.append("\\t"); break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
                else out.push_back(c);
        }
    }
    out.push_back('"');
}

}  // namespace

level parse_level(std::string_view name) {
    if (name == "debug") return level::debug;
    if (name == "info") return level::info;
    if (name == "warn") return level::warn;
    if (name == "error") return level::error;
    throw std::invalid_argument(fmt::format("invalid log level '{}': expected debug, info, warn or error", name));
}

void set_level(level l) noexcept { current_level.store(static_cast<int>(l), std::memory_order_relaxed); }

bool enabled(level l) noexcept { return static_cast<int>(l) >= current_level.load(std::memory_order_relaxed); }

void write(level l, std::string_view message, const fields& kv) {
    const auto now = std::chrono::system_clock::now();
    const auto secs = std::chrono::system_clock::to_time_t(now);
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm utc{};
    gmtime_r(&secs, &utc);
    std::string line;
    line.reserve(128);
    fmt::format_to(std::back_inserter(line), "ts={:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z level={} msg=",
                   utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, millis,
                   level_name(l));
    append_value(line, message);
    for (const auto& [key, value] : kv) {
        line.push_back(' ');
        line.append(key);
        line.push_back('=');
        append_value(line, value);
    }
    line.push_back('\n');
    const std::lock_guard lock(write_mutex);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

}  // namespace outboxd::log
