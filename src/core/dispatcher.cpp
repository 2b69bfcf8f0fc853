#include "core/dispatcher.hpp"

namespace outboxd {

void dispatcher::resize(std::size_t slots, std::size_t batch) noexcept {
    slots_ = slots == 0 ? 1 : slots;
    batch_ = batch == 0 ? 1 : batch > slots_ ? slots_ : batch;
}

std::size_t dispatcher::maybe_claim() noexcept {
    if (stopping_ || claiming_ || backing_off_ || !wanted_ || in_flight_ >= slots_) return 0;
    if (draining_ && slots_ - in_flight_ < batch_) return 0;
    claiming_ = true;
    wanted_ = false;
    return slots_ - in_flight_;
}

std::size_t dispatcher::on_wake() noexcept {
    wanted_ = true;
    backing_off_ = false;
    return maybe_claim();
}

std::size_t dispatcher::on_claimed(std::size_t got, std::size_t asked) noexcept {
    claiming_ = false;
    in_flight_ += got;
    draining_ = got >= asked;
    if (draining_) wanted_ = true;
    return maybe_claim();
}

std::size_t dispatcher::on_claim_failed() noexcept {
    claiming_ = false;
    wanted_ = true;
    backing_off_ = true;
    return 0;
}

std::size_t dispatcher::on_delivery_finished() noexcept {
    if (in_flight_ > 0) --in_flight_;
    return maybe_claim();
}

std::size_t dispatcher::on_outcomes_recorded(bool more_due) noexcept {
    if (more_due) wanted_ = true;
    return maybe_claim();
}

}  // namespace outboxd
