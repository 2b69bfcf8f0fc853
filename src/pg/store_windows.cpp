// Commit-ordered windows (sql/0009, docs/commit-ordered-windows.md): reading
// a window, fetching its events, the fenced cursor, parking window events in
// `deliveries` and deleting delivered ones. Unprepared for now:
// the relay that will run them decides which ones its session prepares.
#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <string_view>

#include <pqxx/pqxx>

#include "core/text.hpp"
#include "pg/params.hpp"
#include "pg/sql_arrays.hpp"
#include "pg/event_columns.hpp"
#include "pg/store.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {
namespace {

template <typename Number>
Number parse_number(const std::string& text) {
    Number n{};
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc() || ptr != text.data() + text.size()) {
        throw std::runtime_error("not a number in a window read: " + text);
    }
    return n;
}

// The elements of a one-dimensional array field, nullopt for NULL.
template <typename Each>
void for_each_element(const pqxx::field& f, Each each) {
    auto parser = f.as_array();
    for (auto [kind, value] = parser.get_next(); kind != pqxx::array_parser::done; std::tie(kind, value) = parser.get_next()) {
        if (kind == pqxx::array_parser::string_value) {
            each(std::optional<std::string>(std::move(value)));
        } else if (kind == pqxx::array_parser::null_value) {
            each(std::optional<std::string>());
        }
    }
}

}  // namespace

store::window_read store::read_window(const std::string& snap_a, const std::optional<std::string>& snap_b,
                                      std::int64_t done_below, const std::optional<std::vector<int>>& slots,
                                      std::size_t max_events, std::span<const std::string> destinations) {
    const std::optional<std::string> slot_list =
        slots ? std::optional<std::string>(number_array(*slots, [](int s) { return s; })) : std::nullopt;
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        if (window_cluster_ && window_safety_due_) {
            // The first read on a new connection (a reconnect, maybe to
            // another server): the cursor read with must belong to it.
            require_window_safe(origin_of(snap_a, snap_b, *window_cluster_), window_safety_now(tx));
            window_safety_due_ = false;
        }
        using col = q::read_window::col;
        const q::read_window::args args{.snap_a = snap_a,
                                        .snap_b = nullable(snap_b),
                                        .done_below = done_below,
                                        .slots = nullable(slot_list),
                                        .max_events = static_cast<long long>(max_events),
                                        .destinations = text_array(destinations)};
        // Prepared (store.cpp's list): a relay reads many small windows, and
        // parsing and planning this statement cost more than running one.
        const auto row =
            (transaction_pooling_ ? exec_params(tx, queries_, args) : exec_prepared(tx, args)).one();
        window_read out;
        out.snap_b = row[col::snap_b].as<std::string>();
        out.a_xmax = parse_number<std::uint64_t>(row[col::a_xmax].as<std::string>());
        out.b_xmax = parse_number<std::uint64_t>(row[col::b_xmax].as<std::string>());
        out.now_us = row[col::now_us].as<std::int64_t>();
        out.deliveries_due = row[col::deliveries_due].as<bool>();
        if (const auto next = row[col::next_due_ms]; !next.is_null()) out.next_due_ms = next.as<std::int64_t>();
        for_each_element(row[col::ids], [&](std::optional<std::string> v) {
            out.events.emplace_back().id = parse_number<std::int64_t>(v.value());
        });
        // The other arrays, one element per id, in the same order.
        const auto each = [&](col column, const char* what, auto set) {
            std::size_t i = 0;
            for_each_element(row[column], [&](std::optional<std::string> v) {
                if (i >= out.events.size()) throw std::runtime_error(std::string("read_window: more ") + what + " than ids");
                set(out.events[i++], std::move(v));
            });
            if (i != out.events.size()) throw std::runtime_error(std::string("read_window: fewer ") + what + " than ids");
        };
        each(col::ordering_keys, "ordering keys", [](window_event& e, std::optional<std::string> v) {
            e.ordering_key = std::move(v);
        });
        each(col::slots, "slots", [](window_event& e, std::optional<std::string> v) {
            e.slot = parse_number<int>(v.value());
        });
        each(col::available_at_us, "available_at", [](window_event& e, std::optional<std::string> v) {
            e.available_at_us = parse_number<std::int64_t>(v.value());
        });
        each(col::key_pending, "key_pending", [](window_event& e, std::optional<std::string> v) {
            e.key_pending = v.value() == "t";
        });
        each(col::topics, "topics", [](window_event& e, std::optional<std::string> v) { e.topic = std::move(v.value()); });
        each(col::payloads, "payloads", [](window_event& e, std::optional<std::string> v) {
            e.payload = std::move(v.value());
        });
        each(col::headers, "headers", [](window_event& e, std::optional<std::string> v) {
            e.headers = std::move(v.value());
        });
        each(col::created_at_us, "created_at", [](window_event& e, std::optional<std::string> v) {
            e.created_at_us = parse_number<std::int64_t>(v.value());
        });
        each(col::destinations, "destinations", [](window_event& e, std::optional<std::string> v) {
            if (v) e.destinations = destination_names(*v);
        });
        each(col::age_us, "ages", [](window_event& e, std::optional<std::string> v) {
            e.age_us = parse_number<std::int64_t>(v.value());
        });
        // The arrays are aggregated from the id-ordered page in one pass;
        // SQL does not promise that order, so it is checked (and restored).
        const auto by_id = [](const window_event& x, const window_event& y) { return x.id < y.id; };
        if (!std::is_sorted(out.events.begin(), out.events.end(), by_id)) {
            std::sort(out.events.begin(), out.events.end(), by_id);
        }
        return out;
    });
}

std::vector<store::window_event_body> store::fetch_events(std::span<const std::int64_t> ids) {
    if (ids.empty()) return {};
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::fetch_events::col;
        std::vector<window_event_body> out;
        out.reserve(ids.size());
        const auto same = [](std::int64_t id) { return id; };
        for (const auto& row : exec_params(tx, queries_, q::fetch_events::args{.ids = number_array(ids, same)})) {
            out.push_back({.id = row[col::id].as<std::int64_t>(),
                           .topic = row[col::topic].as<std::string>(),
                           .ordering_key = row[col::ordering_key].is_null()
                                               ? std::nullopt
                                               : std::optional<std::string>(row[col::ordering_key].as<std::string>()),
                           .payload = row[col::payload].as<std::string>(),
                           .headers = row[col::headers].as<std::string>(),
                           .created_at_us = row[col::created_at_us].as<std::int64_t>()});
        }
        return out;
    });
}

std::optional<store::cursor_lease> store::take_cursor(const std::string& destination, int slot) {
    return session_.run([&](pqxx::connection& c) -> std::optional<cursor_lease> {
        pqxx::nontransaction tx(c);
        using col = q::take_cursor::col;
        const auto r = exec_params(tx, queries_,
                                   q::take_cursor::args{.destination = destination, .slot = slot, .owner = owner_});
        if (r.empty()) return std::nullopt;
        const auto row = r.one();
        return cursor_lease{.snap_a = row[col::snap_a].as<std::string>(),
                            .snap_b = row[col::snap_b].is_null()
                                          ? std::nullopt
                                          : std::optional<std::string>(row[col::snap_b].as<std::string>()),
                            .done_below = row[col::done_below].as<std::int64_t>(),
                            .epoch = row[col::epoch].as<std::int64_t>(),
                            .system_identifier = row[col::system_identifier].as<std::int64_t>(),
                            .slot = slot};
    });
}

bool store::checkpoint_cursor(const std::string& destination, int slot, std::int64_t epoch, const std::string& snap_a,
                              const std::optional<std::string>& snap_b, std::int64_t done_below) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return !exec_params(tx, queries_,
                            q::checkpoint_cursor::args{.destination = destination,
                                                       .slot = slot,
                                                       .owner = owner_,
                                                       .epoch = epoch,
                                                       .snap_a = snap_a,
                                                       .snap_b = nullable(snap_b),
                                                       .done_below = done_below})
                    .empty();
    });
}

bool store::release_cursor(const std::string& destination, int slot, std::int64_t epoch) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return !exec_params(tx, queries_,
                            q::release_cursor::args{
                                .destination = destination, .slot = slot, .owner = owner_, .epoch = epoch})
                    .empty();
    });
}

std::vector<store::cursor_lease> store::take_cursors(std::span<const int> slots) {
    if (slots.empty()) return {};
    const auto same = [](auto n) { return n; };
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::take_cursors::col;
        std::vector<cursor_lease> out;
        for (const auto& row :
             exec_params(tx, queries_, q::take_cursors::args{.slots = number_array(slots, same), .owner = owner_})) {
            out.push_back({.snap_a = row[col::snap_a].as<std::string>(),
                           .snap_b = row[col::snap_b].is_null()
                                         ? std::nullopt
                                         : std::optional<std::string>(row[col::snap_b].as<std::string>()),
                           .done_below = row[col::done_below].as<std::int64_t>(),
                           .epoch = row[col::epoch].as<std::int64_t>(),
                           .system_identifier = row[col::system_identifier].as<std::int64_t>(),
                           .slot = row[col::slot].as<int>()});
        }
        std::sort(out.begin(), out.end(), [](const cursor_lease& x, const cursor_lease& y) { return x.slot < y.slot; });
        return out;
    });
}

namespace {

void check_pairs(std::span<const int> slots, std::span<const std::int64_t> epochs, const char* call) {
    if (slots.size() != epochs.size()) {
        throw std::invalid_argument(std::string(call) + ": one epoch per slot expected");
    }
}

}  // namespace

std::size_t store::checkpoint_cursors(std::span<const int> slots, std::span<const std::int64_t> epochs,
                                      const std::string& snap_a, const std::optional<std::string>& snap_b,
                                      std::int64_t done_below) {
    check_pairs(slots, epochs, "checkpoint_cursors");
    if (slots.empty()) return 0;
    const auto same = [](auto n) { return n; };
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_,
                           q::checkpoint_cursors::args{.slots = number_array(slots, same),
                                                       .epochs = number_array(epochs, same),
                                                       .snap_a = snap_a,
                                                       .snap_b = nullable(snap_b),
                                                       .done_below = done_below,
                                                       .owner = owner_})
            .one()[q::checkpoint_cursors::col::written]
            .as<std::size_t>();
    });
}

std::size_t store::release_cursors(std::span<const int> slots, std::span<const std::int64_t> epochs) {
    check_pairs(slots, epochs, "release_cursors");
    if (slots.empty()) return 0;
    const auto same = [](auto n) { return n; };
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec_params(tx, queries_,
                           q::release_cursors::args{.slots = number_array(slots, same),
                                                    .epochs = number_array(epochs, same),
                                                    .owner = owner_})
            .one()[q::release_cursors::col::released]
            .as<std::size_t>();
    });
}

server_position store::window_safety() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return window_safety_now(tx);
    });
}

server_position read_server_position(pqxx::transaction_base& tx, const query_book& queries) {
    using col = q::window_safety::col;
    const auto row = exec<q::window_safety>(tx, queries).one();
    return server_position{.in_recovery = row[col::in_recovery].as<bool>(),
                           .next_xid = parse_number<std::uint64_t>(row[col::next_xid].as<std::string>()),
                           .system_identifier = row[col::system_identifier].as<std::int64_t>()};
}

server_position store::window_safety_now(pqxx::transaction_base& tx) { return read_server_position(tx, queries_); }

void store::check_window_server() {
    const auto server = window_safety();
    if (server.in_recovery) {
        throw window_unsafe(window_verdict::standby, describe(window_verdict::standby, {}, server));
    }
    window_cluster_ = server.system_identifier;
    window_safety_due_ = false;
}

namespace {

// The parks of a batch as the park statements' parallel arrays (both
// variants of park_window_events take the same parameters), run as one
// statement; returns the ids the statement wrote.
template <typename Query>
std::vector<std::int64_t> write_park_rows(session& db, const query_book& queries, const std::string& owner,
                                          std::span<const store::window_park> parks) {
    if (parks.empty()) return {};
    struct owed_row {
        std::int64_t id;
        const owed_delivery* o;
    };
    struct dead_row {
        std::int64_t id;
        const dead_delivery* d;
    };
    std::vector<owed_row> owed;
    std::vector<dead_row> dead;
    for (const auto& p : parks) {
        for (const auto& o : p.owed) owed.push_back({p.id, &o});
        for (const auto& d : p.dead) dead.push_back({p.id, &d});
    }
    const auto error_text = [](const std::optional<std::string>& e) {
        return e ? std::optional(sanitize_text(*e, max_error_bytes)) : std::nullopt;
    };
    using park = store::window_park;
    const auto args = typename Query::args{
        .owner = owner,
        .ids = number_array(parks, [](const park& p) { return p.id; }),
        .epochs = number_array(parks, [](const park& p) { return p.epoch; }),
        .owed_ids = number_array(owed, [](const owed_row& r) { return r.id; }),
        .owed_destinations = text_array(owed, [](const owed_row& r) { return std::optional(r.o->destination); }),
        .owed_due_ms = number_array(owed, [](const owed_row& r) { return r.o->due_in.count(); }),
        .owed_attempts = number_array(owed, [](const owed_row& r) { return r.o->attempts; }),
        .owed_errors = text_array(owed, [&](const owed_row& r) { return error_text(r.o->error); }),
        .dead_ids = number_array(dead, [](const dead_row& r) { return r.id; }),
        .dead_destinations = text_array(dead,
                                        [](const dead_row& r) {
                                            return r.d->destination.empty() ? std::nullopt
                                                                            : std::optional(r.d->destination);
                                        }),
        .dead_attempts = number_array(dead, [](const dead_row& r) { return r.d->attempts; }),
        .dead_errors = text_array(dead, [](const dead_row& r) { return std::optional(sanitize_text(r.d->error, max_error_bytes)); }),
        .dead_statuses = text_array(dead,
                                    [](const dead_row& r) {
                                        return r.d->status ? std::optional(std::to_string(*r.d->status)) : std::nullopt;
                                    }),
        .dead_excerpts = text_array(dead, [](const dead_row& r) {
            return std::optional(sanitize_text(r.d->response_excerpt, max_error_bytes));
        })};
    return db.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);  // one statement: atomic by itself
        std::vector<std::int64_t> written;
        for (const auto& row : exec_params(tx, queries, args)) {
            written.push_back(row[Query::col::id].template as<std::int64_t>());
        }
        return written;
    });
}

}  // namespace

std::vector<std::int64_t> store::park_window_events(std::span<const window_park> parks) {
    return write_park_rows<q::park_window_events>(session_, queries_, owner_, parks);
}

std::vector<std::int64_t> store::park_pre_window_events(std::span<const window_park> parks) {
    return write_park_rows<q::park_pre_window_events>(session_, queries_, owner_, parks);
}

std::vector<pre_window_event> store::pre_window_page(std::int64_t after_id, std::size_t max_events) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::pre_window_page::col;
        std::vector<pre_window_event> out;
        const auto args = q::pre_window_page::args{.after_id = after_id,
                                                   .max_events = static_cast<std::int64_t>(max_events)};
        for (const auto& row : exec_params(tx, queries_, args)) {
            pre_window_event e;
            e.id = row[col::id].as<std::int64_t>();
            e.topic = row[col::topic].as<std::string>();
            if (!row[col::destinations].is_null()) e.only_to = destination_names(row[col::destinations].c_str());
            e.attempts = row[col::attempts].as<std::int32_t>();
            if (!row[col::last_error].is_null()) e.last_error = row[col::last_error].as<std::string>();
            out.push_back(std::move(e));
        }
        return out;
    });
}

std::size_t store::cleanup_window_events(std::size_t batch) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::cleanup_window_events::col;
        const auto row = exec_params(tx, queries_,
                                     q::cleanup_window_events::args{.batch = static_cast<long long>(batch),
                                                                    .done = nullable(window_cleanup_done_)})
                             .one();
        if (!row[col::done].is_null()) window_cleanup_done_ = row[col::done].as<std::string>();
        return row[col::deleted].as<std::size_t>();
    });
}

}  // namespace outboxd::pg
