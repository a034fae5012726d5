#pragma once
// Recovery: an incarnation rebuilds its state from the journal (the latest
// snapshot, then the later events in sequence) before it handles a command;
// the commands that arrive meanwhile wait. A gap, an unknown manifest or an
// undecodable record fails the recovery, and every waiting command is
// answered with recovery_failed. Member definitions of EntityActor; included
// by entity_actor.hpp (include troupe/persist/entity.hpp instead). Not part
// of the public API.

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "troupe/persist/detail/entity_actor.hpp"

namespace troupe::detail {

template <class B>
void EntityActor<B>::start_recovery() {
  auto self = this->self();
  core_->journal->recover(pid(), [self](Result<Recovery> r) {
    self.tell(In{typename In::Recovered{std::make_unique<Result<Recovery>>(std::move(r))}});
  });
}

template <class B>
void EntityActor<B>::on_recovered(Result<Recovery> r) {
  if (phase_ != Phase::recovering) return;
  if (!r.ok()) return fail_recovery(std::move(r).error());
  Recovery& rec = *r;
  try {
    if (rec.snapshot) {
      auto& snap = *rec.snapshot;
      if (!core_->state_codec)
        return fail_recovery(Error(
            ErrorCode::corrupt_record,
            "a snapshot exists at seq " + std::to_string(snap.seq) + " but no state codec is registered"));
      auto& codec = *core_->state_codec;
      if (snap.type != codec.type)
        return fail_recovery(Error(
            ErrorCode::corrupt_record,
            "snapshot at seq " + std::to_string(snap.seq) + " has unknown manifest '" + snap.type + "'"));
      ByteReader rd(snap.payload);
      auto s = codec.decode(snap.version, rd);
      if (!s.ok())
        return fail_recovery(Error(ErrorCode::corrupt_record, "snapshot at seq " + std::to_string(snap.seq) +
                                                                  ": " + s.error().message()));
      state_ = std::move(*s);
      seq_ = snap.seq;
    }
    for (auto& ev : rec.events) {
      if (ev.seq != seq_ + 1)
        return fail_recovery(Error(ErrorCode::corrupt_record, "event " + std::to_string(seq_ + 1) +
                                                                  " is missing (next stored is " +
                                                                  std::to_string(ev.seq) + ")"));
      auto e = core_->codecs.decode(ev.type, ev.version, ev.payload);
      if (!e.ok())
        return fail_recovery(
            Error(ErrorCode::corrupt_record, "event " + std::to_string(ev.seq) + ": " + e.error().message()));
      {
        // Under the trace it was stored with: a processing episode it
        // begins keeps its request's trace across the recovery (SPEC X4).
        TraceRef trace = ev.trace_id.empty() ? TraceRef() : stored_trace(ev.trace_id);
        BorrowedTraceScope scope(trace);
        apply(*e, ev.seq, ev.timestamp_ms);
      }
      seq_ = ev.seq;
    }
  } catch (const std::exception& ex) {
    return fail_recovery(Error(ErrorCode::handler_failed, std::string("event handler threw: ") + ex.what()));
  }
  seq_ = std::max(seq_, rec.highest_seq);
  since_snapshot_ = rec.events.size();
  phase_ = Phase::running;
  bump(core_->counters.recoveries);
  if (in_processing_) arm_deadline();  // E1: from the stored event time
  resume();
}

template <class B>
void EntityActor<B>::fail_recovery(Error cause) {
  phase_ = Phase::failed;
  bump(core_->counters.recovery_failures);
  recovery_error_ = std::make_unique<Error>(ErrorCode::recovery_failed,
                                            "entity '" + pid() + "' cannot recover: " + cause.to_string());
  log(recovery_error_->message());
  fail_all(*recovery_error_);
  try_finish_stop();
}

template <class B>
void EntityActor<B>::fail_all(const Error& e) {
  drop_runs(e);
  for (std::size_t i = pending_head_; i < pending_.size(); ++i) core_->fail_command(pending_[i].cmd, e);
  for (auto& w : stash_) core_->fail_command(w.cmd, e);
  pending_.clear();
  pending_head_ = 0;
  stash_.clear();
}

}  // namespace troupe::detail
