// The effective configuration as TOML in the file's own format, every
// destination fully expanded, secrets redacted: what `outboxd check-config`
// prints. The settings come from the rows of config_table.cpp, in their order.

#include <fmt/format.h>

#include "core/config.hpp"
#include "core/config_table.hpp"
#include "core/toml_text.hpp"
#include "core/url.hpp"
#include "nats/subject.hpp"

namespace outboxd {
namespace {

// The lines of the settings of `rows` that `include` takes, each sub-table's
// header ("[destinations.orders.retry]") before its first setting; keys
// without a dot belong to `table`, whose header is already out.
template <typename Owner, typename Filter>
void render_rows(std::string& out, std::span<const settings::row<Owner>> rows, const Owner& values,
                 std::string_view prefix, std::string table, Filter&& include) {
    for (const auto& r : rows) {
        if (!include(r.key)) continue;
        const auto dot = r.key.rfind('.');
        const auto name = dot == std::string_view::npos ? r.key : r.key.substr(dot + 1);
        if (dot != std::string_view::npos) {
            if (auto own = fmt::format("{}{}", prefix, r.key.substr(0, dot)); own != table) {
                table = std::move(own);
                out += fmt::format("\n[{}]\n", table);
            }
        }
        const auto v = r.at.get(values);
        if ((r.value.k == settings::kind::file_name && !std::get<std::optional<std::string>>(v)) ||
            (r.value.k == settings::kind::listen_address && std::get<std::string>(v).empty())) {
            out += fmt::format("# {}: not set, {}\n", name, r.default_words);
        } else {
            out += fmt::format("{} = {}\n", name, settings::toml_value(r.value.k, v));
        }
    }
}

}  // namespace

std::string render_config(const config& c) {
    std::string out = "# The effective configuration of outboxd; secrets are shown as \"<redacted>\".\n";
    render_rows(out, settings::relay_rows(), c, "", "", [](std::string_view) { return true; });
    for (const auto& d : c.destinations) {
        const auto table = fmt::format("destinations.{}", toml_key(d.name));
        out += fmt::format("\n[{}]\n", table);
        const auto type = d.kind == transport::webhook ? "webhook" : d.kind == transport::nats ? "nats" : "stdout";
        out += fmt::format("type = {}\n", toml_quoted(type));
        if (d.kind == transport::webhook) out += fmt::format("url = {}\n", toml_quoted(loggable_url(d.url)));
        if (d.kind == transport::nats) out += fmt::format("url = {}\n", toml_quoted(nats::loggable_servers(d.nats.servers)));
        render_rows(out, settings::destination_rows(), d, table + ".", table,
                    [&](std::string_view key) { return settings::applies_to(d.kind, key); });
    }
    const auto strings = [](const std::vector<std::string>& items) {
        std::string text = "[";
        for (const auto& i : items) text += fmt::format("{}{}", text.size() > 1 ? ", " : "", toml_quoted(i));
        return text + "]";
    };
    for (const auto& r : c.routes) {
        out += "\n[[routes]]\n";
        out += fmt::format("topics = {}\n", strings(r.topics));
        out += fmt::format("destinations = {}\n", strings(r.destinations));
    }
    return out;
}

}  // namespace outboxd
