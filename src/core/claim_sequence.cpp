#include "core/claim_sequence.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string_view>
#include <iterator>
#include <utility>

namespace outboxd {

namespace {

void append(std::vector<event>& to, std::vector<event>&& from) {
    std::move(from.begin(), from.end(), std::back_inserter(to));
}

// Up to `wanted` deliveries, none beyond a destination's free connections
// less the deliveries to it this claim took already. Returns whether a
// statement came back full.
bool claim_deliveries(claim_port& db, const claim_request& request, std::size_t wanted, std::vector<event>& got) {
    bool full = false;
    std::vector<open_destination> open;
    for (const auto& d : request.open_destinations) {
        const auto taken = static_cast<std::size_t>(
            std::count_if(got.begin(), got.end(), [&](const event& e) { return e.destination == d.name; }));
        if (d.free > taken) open.push_back({d.name, d.free - taken});
    }
    const auto start = got.size();
    std::vector<std::string> roomy;
    for (const auto& d : open) {
        if (d.free >= wanted) roomy.push_back(d.name);
    }
    if (!roomy.empty()) {
        const auto size = claim_size(wanted);
        auto some = db.claim_deliveries(size, request.lease, roomy);
        full = some.size() == size;
        append(got, std::move(some));
    }
    for (const auto& d : open) {
        const auto left = wanted - (got.size() - start);
        if (d.free >= wanted || left == 0) continue;  // (`open` holds only destinations with room)
        const auto size = claim_size(std::min(d.free, left));
        const std::string name[] = {d.name};
        auto some = db.claim_deliveries(size, request.lease, name);
        full = full || some.size() == size;
        append(got, std::move(some));
    }
    return full;
}

}  // namespace

// relay.consume = "windows": the window page first (it also says whether
// deliveries are due), then due deliveries; window events are not leased,
// so they take slots only once the relay hands them out.
claim_outcome run_window_claim(claim_port& db, const claim_request& request) {
    claim_outcome out;
    if (request.release_all_but) out.released = db.release_untracked(*request.release_all_but);
    out.deliveries_due = request.deliveries_due;
    if (request.window) {
        auto read = db.read_window(*request.window);
        out.window = std::move(read.page);
        out.deliveries_due = read.deliveries_due;
        out.next_due = read.next_due;
    }
    if (out.deliveries_due && !request.open_destinations.empty() && request.wanted > 0) {
        out.full = claim_deliveries(db, request, request.wanted, out.events);
    }
    return out;
}

namespace {

// The low mark's fields: "low mark|checked at|floor[|since]".
std::vector<std::string_view> low_mark_fields(std::string_view low_mark) {
    std::vector<std::string_view> fields;
    for (;;) {
        const auto bar = low_mark.find('|');
        fields.push_back(low_mark.substr(0, bar));
        if (bar == std::string_view::npos) return fields;
        low_mark.remove_prefix(bar + 1);
    }
}

}  // namespace

std::optional<std::string> low_mark_from_start(const std::optional<std::string>& low_mark) {
    if (!low_mark) return std::nullopt;
    const auto f = low_mark_fields(*low_mark);
    if (f.size() < 3 || (f[1].empty() && f[2].empty())) return std::nullopt;
    return std::string("|").append(f[1]).append("|").append(f[2]);
}

std::optional<std::string> low_mark_reaching(const std::optional<std::string>& low_mark, database_time since) {
    if (!low_mark) return std::nullopt;
    auto f = low_mark_fields(*low_mark);
    if (f[0].empty()) return low_mark;
    f.resize(std::max<std::size_t>(f.size(), 3));  // no check: empty fields
    auto us = since.time_since_epoch().count();
    if (f.size() > 3) {
        std::int64_t earlier = 0;
        const auto [end, err] = std::from_chars(f[3].data(), f[3].data() + f[3].size(), earlier);
        if (err == std::errc{} && end == f[3].data() + f[3].size()) us = std::min(us, earlier);
    }
    return std::string(f[0]).append("|").append(f[1]).append("|").append(f[2]).append("|").append(
        std::to_string(us));
}

namespace {

// One event claim of `size` from `after` or `low_mark` (see unkeyed_first
// in claim_sequence.hpp). The full claim after the one without keys takes
// the rest, rounded down to a claim size; the two together count as full
// when the second one is.
claim_result claim_events(claim_port& db, const claim_request& request, std::size_t size,
                          const std::optional<claim_watermark>& after, const std::optional<std::string>& low_mark,
                          bool& picked_keyed) {
    if (!request.unkeyed_first) {
        auto full = db.claim_events(size, request.lease, after, low_mark, false);
        picked_keyed = picked_keyed || full.picked_keyed;
        return full;
    }
    auto unkeyed = db.claim_events(size, request.lease, after, low_mark, true);
    if (!unkeyed.picked_keyed) return unkeyed;
    picked_keyed = true;
    // It picked at least one keyed event and leased none of them: rest >= 1.
    const auto rest = claim_size(size - unkeyed.events.size());
    auto full = db.claim_events(rest, request.lease, after, low_mark, false);
    full.picked = full.picked >= rest ? size : unkeyed.events.size() + full.picked;
    append(unkeyed.events, std::move(full.events));
    full.events = std::move(unkeyed.events);
    return full;
}

}  // namespace

claim_outcome run_claim(claim_port& db, const claim_request& request) {
    if (request.windows) return run_window_claim(db, request);
    claim_outcome out;
    if (request.release_all_but) out.released = db.release_untracked(*request.release_all_but);
    out.drain_watermark = request.drain_watermark;
    out.low_mark = request.low_mark;
    const auto& open = request.open_destinations;

    // Deliveries go first only while a backlog drains: each event claim then
    // fills every slot it may, and retries at a failed destination (older
    // than the new events) would wait for the drain's end. Otherwise after
    // the events: what the event statement's next_due leaves out (what is
    // due at its now()) the delivery statement, later, sees due.
    const bool deliveries_first = request.deliveries_due && request.drain_watermark && !open.empty();
    if (deliveries_first) out.full = claim_deliveries(db, request, request.wanted, out.events);
    // Events come in prepared sizes (powers of two), at most what is left.
    const auto size = claim_size(request.wanted - out.events.size());
    auto claimed = claim_events(db, request, size, out.drain_watermark, out.low_mark, out.picked_keyed);
    // Whether the statement that started at or before the low mark took
    // everything due: then its own low mark holds for the next claim.
    bool took_all = claimed.picked < size;
    // Whether the last event statement came back full (judged on the rows
    // it picked, leased or not, or examined), and the last row it examined.
    bool events_full = size > 0 && claimed.picked >= size;
    auto last_picked = claimed.last;
    // The drain a full claim begins or continues: where it began, and the
    // low mark its first claim returned.
    auto began_at = out.low_mark;
    std::optional<std::string> drain_low_mark = claimed.low_mark;
    if (out.drain_watermark) {
        began_at = out.drain_watermark->drain_began_at;
        drain_low_mark = out.drain_watermark->drain_low_mark;
    }
    if (out.drain_watermark && !events_full) {
        // The drain reached its end: once more from the low mark, for what
        // committed late behind the watermark. From the low mark the drain's
        // first claim returned if the low mark has not moved back since (a
        // sweep): the drain examined everything due before that, and what it
        // skipped there (rows of blocked keys, rows another claim held) is
        // found as it would be behind any low mark; from an older one, the
        // look would meet the rows of blocked keys again and again.
        const auto from = out.low_mark == began_at && out.drain_watermark->drain_low_mark
                              ? out.drain_watermark->drain_low_mark
                              : out.low_mark;
        out.drain_watermark.reset();
        const auto rest = claim_size(size - claimed.events.size());
        auto behind = claim_events(db, request, rest, std::nullopt, from, out.picked_keyed);
        took_all = behind.picked < rest;
        events_full = rest > 0 && behind.picked >= rest;
        last_picked = behind.last;
        // A drain begun here: compared with the relay's low mark at its end.
        began_at = out.low_mark;
        drain_low_mark = behind.low_mark;
        append(claimed.events, std::move(behind.events));
        claimed.next_due = behind.next_due;
        claimed.deliveries_due = behind.deliveries_due;
        claimed.low_mark = std::move(behind.low_mark);
    }
    // A full claim means a backlog: the next one starts behind this one.
    // Anything less ends the drain.
    if (events_full) {
        out.drain_watermark = last_picked;
        if (out.drain_watermark) {
            out.drain_watermark->drain_began_at = std::move(began_at);
            out.drain_watermark->drain_low_mark = std::move(drain_low_mark);
        }
    } else if (size > 0) {
        out.drain_watermark.reset();
    }
    if (size > 0 && took_all) out.low_mark = std::move(claimed.low_mark);
    out.full = out.full || events_full;
    append(out.events, std::move(claimed.events));
    // Deliveries after the events when their statement saw some due: those
    // it saw, and (after deliveries went first) those that fell due between
    // the two statements. Its next_due counts only what is not due yet at
    // its own now(): a retry due in that gap would be in neither, and wait
    // for the sweep (or until some other wake-up).
    if (claimed.deliveries_due && !open.empty() && out.events.size() < request.wanted) {
        const bool more_full = claim_deliveries(db, request, request.wanted - out.events.size(), out.events);
        out.full = out.full || more_full;
    }
    out.deliveries_due = claimed.deliveries_due;
    out.next_due = claimed.next_due;
    return out;
}

}  // namespace outboxd
