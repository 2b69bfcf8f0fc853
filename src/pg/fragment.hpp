#pragma once
// SQL text filled into a query's placeholder when it is rendered (a claim's
// size, its destination list). Not default-constructible, so a `fills`
// aggregate (pg/queries.hpp) that leaves a placeholder out does not compile.

#include <concepts>
#include <string_view>

namespace outboxd::pg {

struct fragment {
    template <typename T>
        requires std::convertible_to<const T&, std::string_view>
    fragment(const T& sql) : text(sql) {}  // NOLINT: implicit on purpose, for designated initializers

    std::string_view text;
};

}  // namespace outboxd::pg
