// The relay's windows (relay.consume = "windows"): the window statements of
// store_windows.cpp in the engine's terms (core/window_reader.hpp).
#include <algorithm>
#include <numeric>

#include <pqxx/pqxx>

#include "pg/event_columns.hpp"
#include "pg/params.hpp"
#include "pg/sql_arrays.hpp"
#include "pg/status.hpp"
#include "pg/store.hpp"
#include "pg/typed_query.hpp"

namespace outboxd::pg {

window_read_result store::read_window_page(const window_read_request& request) {
    auto read = read_window(request.snap_a, request.snap_b, request.done_below, request.slots, request.limit,
                            known_destinations_);
    window_read_result out;
    out.page.snap_b = std::move(read.snap_b);
    out.page.full = read.events.size() == request.limit;
    out.deliveries_due = read.deliveries_due;
    if (read.next_due_ms) out.next_due = std::chrono::milliseconds(std::max<std::int64_t>(0, *read.next_due_ms));
    out.page.events.reserve(read.events.size());
    for (auto& w : read.events) {
        window_event_read r;
        r.slot = w.slot;
        r.key_pending = w.key_pending;
        r.due = w.available_at_us <= read.now_us;
        auto& e = r.e;
        e.id = w.id;
        e.topic = std::move(w.topic);
        e.ordering_key = std::move(w.ordering_key);
        e.payload = std::move(w.payload);
        try {
            e.headers = parse_headers(w.headers.c_str());
        } catch (const std::exception&) {
            e.undecodable = undecodable_headers;
        }
        e.only_to = std::move(w.destinations);
        e.age_at_claim = std::chrono::microseconds(std::max<std::int64_t>(0, w.age_us));
        out.page.events.push_back(std::move(r));
    }
    return out;
}

store::cursors_share store::take_free_cursors(const std::vector<int>& held) {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        using col = q::take_free_cursors::col;
        cursors_share out;
        std::vector<cursor_origin> origins;
        for (const auto& row : exec_params(tx, queries_,
                                           q::take_free_cursors::args{.owner = owner_,
                                                                      .held = number_array(held, [](int s) { return s; })})) {
            out.share = row[col::share].as<std::size_t>();
            out.taken.push_back({row[col::slot].as<int>(), row[col::snap_a].as<std::string>(),
                                 row[col::snap_b].is_null()
                                     ? std::nullopt
                                     : std::optional<std::string>(row[col::snap_b].as<std::string>()),
                                 row[col::done_below].as<std::int64_t>(), row[col::epoch].as<std::int64_t>()});
            origins.push_back(origin_of(out.taken.back().snap_a, out.taken.back().snap_b,
                                        row[col::system_identifier].as<std::int64_t>()));
        }
        // Before any window is read with them: refused (window_unsafe) when
        // one does not belong to this server (core/window_safety.hpp).
        if (!origins.empty()) {
            const auto server = window_safety_now(tx);
            for (const auto& origin : origins) require_window_safe(origin, server);
        }
        if (out.taken.empty()) {
            out.share = exec_params(tx, queries_, q::cursor_share::args{.owner = owner_})
                            .one()[q::cursor_share::col::share]
                            .as<std::size_t>();
        }
        return out;
    });
}

std::size_t store::checkpoint_cursors(const cursor_checkpoint& p) {
    return checkpoint_cursors(p.slots, p.epochs, p.snap_a, p.snap_b, p.done_below);
}

std::size_t store::release_cursors(const cursor_checkpoint& p) { return release_cursors(p.slots, p.epochs); }

std::int64_t store::pre_window_events() {
    return session_.run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return exec<q::pre_window_events>(tx, queries_).one()[q::pre_window_events::col::events].as<std::int64_t>();
    });
}

bool store::windows_set_up() {
    return session_.run([&](pqxx::connection& c) { return outbox_windows_set_up(c, schema_); });
}

namespace {

std::vector<store::window_park> park_rows(const std::vector<outboxd::window_park>& parks) {
    std::vector<store::window_park> rows;
    rows.reserve(parks.size());
    for (const auto& p : parks) rows.push_back({p.id, p.epoch, p.owed, p.dead});
    return rows;
}

}  // namespace

std::size_t store::write_parks(const std::vector<outboxd::window_park>& parks) {
    return park_window_events(park_rows(parks)).size();
}

std::size_t store::write_pre_window_parks(const std::vector<outboxd::window_park>& parks) {
    return park_pre_window_events(park_rows(parks)).size();
}

}  // namespace outboxd::pg
