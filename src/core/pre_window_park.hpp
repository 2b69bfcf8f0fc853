#pragma once
// What an event written before `outboxd consume-setup windows` owes, when a
// windows relay takes it over. Pure.
//
// Such an event (txid NULL) is in no window, and a windows relay claims no
// event. So instead of refusing to start while any is left, the relay parks
// each one into `deliveries`, as a window event that must wait is parked: one
// delivery row per destination it owes, due on its own schedule, with the
// attempts made so far and the last error. From then on it drains through
// the deliveries path in id order, and the window events of its key queue
// behind it (read_window's key_pending), so nothing is lost or reordered.
//
// Which destinations: decided as the engine decides for a claimed event
// (relay_engine::deliver): a replayed event's own list (`only_to`) if it has
// one, else every destination its topic routes to. An event that can never be
// delivered becomes a dead letter now, as a window event does: a name no
// destination can have, or no route for its topic (a windows relay has no
// row to leave it waiting in; replay it once a route matches).

#include <vector>

#include "core/config.hpp"
#include "core/outbox_rows.hpp"
#include "core/outcome_batch.hpp"
#include "core/routing.hpp"

namespace outboxd {

// The park to write for `e` (epoch unused: no cursor fences it). Either owed
// deliveries or one dead letter for the whole event, never both, never none.
[[nodiscard]] window_park park_pre_window(const pre_window_event& e, const route_table& routes,
                                          const std::vector<destination_config>& destinations);

}  // namespace outboxd
