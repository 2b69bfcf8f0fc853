#include "pg/consume_setup.hpp"

#include <stdexcept>

#include "pg/named_queries.hpp"

namespace outboxd::pg {

std::vector<std::string> consume_setup_statements(std::string_view schema, std::string_view mode) {
    const query_book book(schema);
    if (mode == "windows") {
        return {book.bare_sql<q::consume_setup_txid_default>(), book.bare_sql<q::consume_setup_txid_index>(),
                book.bare_sql<q::consume_setup_pre_window_index>()};
    }
    if (mode == "claims") {
        // The default first: from then on no new event needs the index.
        return {book.bare_sql<q::consume_setup_drop_txid_default>(), book.bare_sql<q::consume_setup_drop_txid_index>(),
                book.bare_sql<q::consume_setup_drop_pre_window_index>()};
    }
    throw std::invalid_argument("consume mode must be windows or claims");
}

}  // namespace outboxd::pg
