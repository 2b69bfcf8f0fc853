#pragma once
// Statement parameters for libpqxx 6.4, which has no std::optional support:
// a null C string is sent as SQL NULL.

#include <optional>
#include <string>

namespace outboxd::pg {

[[nodiscard]] inline const char* nullable(const std::optional<std::string>& s) noexcept {
    return s ? s->c_str() : nullptr;
}

}  // namespace outboxd::pg
