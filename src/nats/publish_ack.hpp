#pragma once
// What a JetStream publish acknowledgement means for the relay. Pure: the
// publisher hands over the reply's bytes, this says delivered or why not, in
// the terms the relay engine judges every transport by (status 200 =
// delivered; a status = the destination answered no; transport_error = no
// answer that counts). The mapping, documented in README "NATS JetStream":
//   {"stream":..,"seq":..}                      200 (also with "duplicate":true:
//                                               the stream already holds it)
//   {"error":{"code":C,"err_code":E,...}}       status C (JetStream's own, e.g.
//                                               503 no leader, 400, 404)
//   no responders (no stream on the subject)    transport error
//   anything else (not JSON, no seq)            transport error
// Timeouts, a lost connection and publish calls the client refuses are the
// publisher's to report (transport errors; payload too large: 413).

#include <cstdint>
#include <string>
#include <string_view>

namespace outboxd::nats {

struct publish_result {
    bool transport_error = false;
    unsigned status = 0;
    std::string error;      // human readable; never holds the payload
    std::uint64_t seq = 0;  // the stream sequence, when stored
    bool duplicate = false; // the stream already held this Nats-Msg-Id
};

[[nodiscard]] publish_result judge_publish_ack(std::string_view reply, bool no_responders, std::string_view subject);

}  // namespace outboxd::nats
