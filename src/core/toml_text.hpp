#pragma once
// How values and keys are spelled in TOML. Also how messages quote a value
// they repeat, so a control character from an environment variable or a
// flag cannot garble a log line.

#include <string>
#include <string_view>

namespace outboxd {

// A TOML basic string: "a \"b\"\n"; invalid UTF-8 becomes U+FFFD.
[[nodiscard]] std::string toml_quoted(std::string_view raw);

// A key as written in a dotted path: bare when it can be (A-Z a-z 0-9 _ -),
// quoted otherwise.
[[nodiscard]] bool is_bare_key(std::string_view key) noexcept;
[[nodiscard]] std::string toml_key(std::string_view key);

}  // namespace outboxd
