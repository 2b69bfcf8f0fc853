#include "core/log.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <limits>
#include <stdexcept>

#include "core/redact.hpp"
#include "core/text.hpp"

namespace outboxd::log {
namespace {

std::atomic<int> current_level{static_cast<int>(level::info)};
std::atomic<int> chosen_format{static_cast<int>(format::logfmt)};
std::mutex write_mutex;
std::mutex secrets_mutex;
std::shared_ptr<const std::vector<std::string>> secrets = std::make_shared<const std::vector<std::string>>();

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

void append_logfmt_value(std::string& out, std::string_view v) {
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

// A JSON string. JSON text must be UTF-8, and error messages from the
// network need not be: invalid bytes become U+FFFD.
void append_json_string(std::string& out, std::string_view raw) {
    std::string repaired;
    if (!is_valid_utf8(raw)) {
        repaired = sanitize_text(raw, std::numeric_limits<std::size_t>::max());
        raw = repaired;
    }
    out.push_back('"');
    for (const char c : raw) {
        switch (c) {
            case '"': out.append("\\\""); break;
            case '\\': out.append("\\\\"); break;
            case '\n': out.append("\\n"); break;
            case '\r': out.append("\\r"); break;
            case '\t': out.append("\\t"); break;
            default:
                if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
                    fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned char>(c));
                } else {
                    out.push_back(c);
                }
        }
    }
    out.push_back('"');
}

void append_timestamp(std::string& out, std::chrono::system_clock::time_point when) {
    const auto secs = std::chrono::system_clock::to_time_t(when);
    const auto since_epoch = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
    const auto millis = ((since_epoch % 1000) + 1000) % 1000;
    std::tm utc{};
    gmtime_r(&secs, &utc);
    fmt::format_to(std::back_inserter(out), "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", utc.tm_year + 1900,
                   utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, millis);
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

format parse_format(std::string_view name) {
    if (name == "logfmt") return format::logfmt;
    if (name == "json") return format::json;
    throw std::invalid_argument(fmt::format("invalid log format '{}': expected logfmt or json", name));
}

void set_format(format f) noexcept { chosen_format.store(static_cast<int>(f), std::memory_order_relaxed); }

format current_format() noexcept { return static_cast<format>(chosen_format.load(std::memory_order_relaxed)); }

std::string render(format f, std::chrono::system_clock::time_point when, level l, std::string_view message,
                   const fields& kv) {
    std::string line;
    line.reserve(128);
    if (f == format::json) {
        line.append(R"({"ts":")");
        append_timestamp(line, when);
        fmt::format_to(std::back_inserter(line), R"(","level":"{}","msg":)", level_name(l));
        append_json_string(line, message);
        for (const auto& [key, value] : kv) {
            line.push_back(',');
            append_json_string(line, key);
            line.push_back(':');
            append_json_string(line, value);
        }
        line.append("}\n");
        return line;
    }
    line.append("ts=");
    append_timestamp(line, when);
    fmt::format_to(std::back_inserter(line), " level={} msg=", level_name(l));
    append_logfmt_value(line, message);
    for (const auto& [key, value] : kv) {
        line.push_back(' ');
        line.append(key);
        line.push_back('=');
        append_logfmt_value(line, value);
    }
    line.push_back('\n');
    return line;
}

void never_show(std::vector<std::string> list) {
    std::erase_if(list, [](const std::string& s) { return s.size() < 4; });
    // Longest first, so a whole value goes before a part of it.
    std::sort(list.begin(), list.end(), [](const std::string& a, const std::string& b) {
        return a.size() != b.size() ? a.size() > b.size() : a < b;
    });
    auto fresh = std::make_shared<const std::vector<std::string>>(std::move(list));
    const std::lock_guard lock(secrets_mutex);
    secrets = std::move(fresh);
}

void write(level l, std::string_view message, const fields& kv) {
    const auto f = current_format();
    const auto now = std::chrono::system_clock::now();
    std::shared_ptr<const std::vector<std::string>> hidden;
    {
        const std::lock_guard lock(secrets_mutex);
        hidden = secrets;
    }
    std::string line;
    if (hidden->empty()) {
        line = render(f, now, l, message, kv);
    } else {
        fields clean;
        clean.reserve(kv.size());
        for (const auto& [key, value] : kv) clean.emplace_back(key, redact(value, *hidden));
        line = render(f, now, l, redact(message, *hidden), clean);
    }
    const std::lock_guard lock(write_mutex);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

}  // namespace outboxd::log
