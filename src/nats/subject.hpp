#pragma once
// A NATS destination's pure parts: the subject an event is published on
// (a template over its topic) and the server list it connects to. No I/O:
// the configuration checks them and the sink uses them.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outboxd::nats {

// The placeholder a subject template replaces with the event's topic.
inline constexpr std::string_view topic_placeholder = "{topic}";

// What is wrong with a subject template ("events.{topic}"), or nullopt. The
// template with `{topic}` replaced by a one-token topic must be a valid
// publish subject: `.`-separated non-empty tokens, no whitespace or control
// characters, no wildcards (`*`, `>`), no other `{` `}`.
[[nodiscard]] std::optional<std::string> subject_template_error(std::string_view tmpl);

// The subject of an event of `topic`: every `{topic}` replaced. nullopt when
// the result is not a valid publish subject (a topic with spaces, empty
// tokens or wildcards): such an event can never be published.
[[nodiscard]] std::optional<std::string> subject_for(std::string_view tmpl, std::string_view topic);

// Whether `subject` is a valid subject to publish on.
[[nodiscard]] bool valid_publish_subject(std::string_view subject) noexcept;

// A destination's `url`: one or more comma-separated server URLs,
// nats://host:port or tls://host:port (user:password@ or token@ allowed).
// Returns the servers, or throws std::invalid_argument saying what is wrong
// (without the credentials).
[[nodiscard]] std::vector<std::string> parse_servers(std::string_view url);

// The server list with any user:password@ or token@ replaced by
// "<redacted>@": for logs and `check-config`.
[[nodiscard]] std::string loggable_servers(std::string_view url);

}  // namespace outboxd::nats
