#include "pg/conninfo.hpp"

#include <libpq-fe.h>

#include "core/dsn.hpp"

namespace outboxd::pg {

std::optional<std::string> conninfo_error(const std::string& dsn) {
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(dsn.c_str(), &error);
    if (options != nullptr) {
        PQconninfoFree(options);
        return std::nullopt;
    }
    std::string message = error != nullptr ? error : "out of memory";
    if (error != nullptr) PQfreemem(error);
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
    return scrub_secrets(message, dsn);
}

}  // namespace outboxd::pg
