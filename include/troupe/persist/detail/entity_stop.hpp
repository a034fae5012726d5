#pragma once
// How an incarnation ends (SPEC E5, E6): passivation and stop both go
// through the shard, which stops forwarding and buffers for the next
// incarnation first; a graceful stop waits for the processing episode, an
// immediate one does not; whatever still waits goes back to the shard.
// Member definitions of EntityActor; included by entity_actor.hpp (include
// troupe/persist/entity.hpp instead). Not part of the public API.

#include <utility>
#include <vector>

#include "troupe/persist/detail/entity_actor.hpp"

namespace troupe::detail {

// Stop and passivate both go through the shard, which first stops
// forwarding (buffering for the next incarnation), then sends StopRequest.
template <class B>
void EntityActor<B>::ask_to_stop() {
  if (stop_asked_) return;
  stop_asked_ = true;
  if (shard_.tell(Shard{typename Shard::Passivate{id_, AnyRef(this->self())}}) != Delivery::delivered)
    stop_now();
}

// The shard saw no command for this entity for the idle timeout (E5); the
// entity itself also saw nothing (replies to its asks, its own timers) and
// is not busy, so it may go.
template <class B>
void EntityActor<B>::on_idle() {
  Duration quiet = this->now() - last_activity_;
  bool busy = in_processing_ || persisting_ || !stash_.empty() || pending_size() || run_ || !waiting_runs_.empty();
  if (quiet >= core_->settings.idle_timeout && !busy) ask_to_stop();
}

template <class B>
void EntityActor<B>::on_stop_request(bool shutdown, bool immediate) {
  if (stop_requested_ && (!immediate || immediate_stop_)) return;
  if (immediate) {
    immediate_stop_ = true;
    // The episode is left as stored: its deadline re-arms wherever the
    // entity recovers next (E1).
    (void)this->cancel_timer(kDeadlineKey);
  }
  if (stop_requested_) return try_finish_stop();
  stop_requested_ = true;
  (void)shutdown;
  if (in_processing_ || persisting_) {
    bump(core_->counters.stops_deferred);
    if (core_->settings.log && !immediate) {
      // Logged under the trace of what holds it: the episode, or the append.
      TraceRef trace = in_processing_ ? episode_trace_ : inflight_trace_;
      BorrowedTraceScope scope(trace);
      entity_note(core_->settings.type_name, id_, "stop deferred while processing");
    }
  }
  resume();
}

template <class B>
void EntityActor<B>::try_finish_stop() {
  if (!stop_requested_ || persisting_) return;
  if (!immediate_stop_) {
    if (in_processing_) return;
    if (phase_ == Phase::recovering) return;  // recovery decides whether this is a processing state
    if (phase_ == Phase::running && pending_size()) return;
  }
  // A coroutine handler waiting outside an episode ends here.
  if (run_ || !waiting_runs_.empty())
    drop_runs(Error(ErrorCode::shutting_down, "entity '" + pid() + "' stopped while its handler awaited"));
  // Whatever is left goes back to the shard, for the next incarnation.
  std::vector<Command> left;
  left.reserve(stash_.size() + pending_size());
  for (auto& w : stash_) left.push_back(std::move(w.cmd));
  for (std::size_t i = pending_head_; i < pending_.size(); ++i) left.push_back(std::move(pending_[i].cmd));
  stash_.clear();
  pending_.clear();
  pending_head_ = 0;
  if (!left.empty()) (void)shard_.tell(Shard{typename Shard::Returned{id_, std::move(left)}});
  stop_now();
}

}  // namespace troupe::detail
