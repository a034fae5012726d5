#pragma once
// Processing episodes (SPEC E1-E4): an episode begins with the stored event
// whose state declares processing and ends with the one whose state does
// not; its deadline is armed from the stored event time (so it means the
// same after a crash and a recovery elsewhere), a stale deadline is ignored,
// and a due one stores the timeout event and then calls the behaviour's
// on_processing_timeout. Member definitions of EntityActor; included by
// entity_actor.hpp (include troupe/persist/entity.hpp instead). Not part of
// the public API.

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "troupe/persist/detail/entity_actor.hpp"

namespace troupe::detail {

// Folds a stored event and tracks processing episodes (E1, E4).
template <class B>
void EntityActor<B>::apply(const Event& e, std::uint64_t seq, std::int64_t ts_ms) {
  fold(e);
  auto p = processing_of(state_);
  if (p && !in_processing_) {
    in_processing_ = true;
    episode_trace_ = TraceRef::current();
    episode_ = seq;
    episode_start_ms_ = ts_ms;
    timeout_ = p->timeout;
    core_->counters.note_processing_timeout(p->timeout);
    core_->processing.enter(id_, ts_ms,
                            ts_ms + std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count());
    if (phase_ == Phase::running) arm_deadline();
  } else if (!p && in_processing_) {
    in_processing_ = false;
    episode_trace_ = TraceRef();
    if (run_) end_of_episode(episode_);  // E2: a handler awaiting in it never resumes
    core_->processing.leave(id_);
    if (phase_ == Phase::running) this->cancel_timer(kDeadlineKey);
    unstash_all();
  }
}

template <class B>
void EntityActor<B>::arm_deadline() {
  // delay = max(0, event_time + timeout - now), on wall time so that it
  // means the same after a crash and a recovery elsewhere (E1).
  WallTime start{std::chrono::milliseconds(episode_start_ms_)};
  Duration left = (start + timeout_) - ctx_.wall_now();
  if (left < Duration::zero()) left = Duration::zero();
  this->start_timer(std::string(kDeadlineKey), left, In{typename In::Deadline{episode_}});
}

template <class B>
void EntityActor<B>::on_deadline(std::uint64_t episode) {
  if (!in_processing_ || episode != episode_) {
    bump(core_->counters.stale_deadlines);  // E2: an ended episode's deadline
    return;
  }
  if (persisting_ || phase_ != Phase::running) {
    due_episode_ = episode;  // handled once the append in flight is done
    return;
  }
  auto p = processing_of(state_);
  if (!p) return;
  bump(core_->counters.processing_timeouts);
  // The timeout is part of the request that began the episode: its line
  // and its stored event carry that trace (SPEC X4).
  TraceRef trace = episode_trace_;
  BorrowedTraceScope scope(trace);
  if (core_->settings.log)
    entity_note(core_->settings.type_name, id_, "processing timed out",
                std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count());
  start_persist(Eff::persist(std::move(p->timeout_event)), true);
}

template <class B>
void EntityActor<B>::timeout_hook() {
  if constexpr (HasProcessingTimeout<B>) {
    try {
      behavior_.on_processing_timeout(std::as_const(state_), ctx_);
    } catch (const std::exception& ex) {
      bump(core_->counters.handler_failures);
      log(std::string("on_processing_timeout threw: ") + ex.what());
    }
  }
}

}  // namespace troupe::detail
