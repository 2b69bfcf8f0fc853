#include "nats/publish_ack.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace outboxd::nats {

namespace {

publish_result transport_failure(std::string why) {
    publish_result r;
    r.transport_error = true;
    r.error = std::move(why);
    return r;
}

std::string excerpt(std::string_view text) {
    constexpr std::size_t longest = 200;
    return std::string(text.substr(0, longest)) + (text.size() > longest ? "..." : "");
}

}  // namespace

publish_result judge_publish_ack(std::string_view reply, bool no_responders, std::string_view subject) {
    if (no_responders) {
        return transport_failure(
            fmt::format("no JetStream stream captures subject {} (no responders)", subject));
    }
    const auto json = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) return transport_failure(fmt::format("not a JetStream publish acknowledgement: {}", excerpt(reply)));
    if (const auto error = json.find("error"); error != json.end() && error->is_object()) {
        publish_result r;
        const auto code = error->value("code", 0);
        r.status = code >= 100 && code <= 599 ? static_cast<unsigned>(code) : 500;
        r.error = fmt::format("JetStream refused the message: {} (code {}, err_code {})",
                              error->value("description", std::string("no description")), code,
                              error->value("err_code", 0));
        return r;
    }
    const auto seq = json.find("seq");
    if (!json.contains("stream") || seq == json.end() || !seq->is_number_unsigned()) {
        return transport_failure(fmt::format("not a JetStream publish acknowledgement: {}", excerpt(reply)));
    }
    publish_result r;
    r.status = 200;
    r.seq = seq->get<std::uint64_t>();
    r.duplicate = json.value("duplicate", false);
    return r;
}

}  // namespace outboxd::nats
