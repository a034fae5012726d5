#pragma once
// How an entity stores what its handlers decide: one atomic append per
// effect (while it is in flight no other command runs), the append's
// outcome (fold the events and run the effect's steps; on a failure, or a
// conflict with another writer (E7), answer the steps and stop), and
// snapshots. Member definitions of EntityActor; included by
// entity_actor.hpp (include troupe/persist/entity.hpp instead). Not part of
// the public API.

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "troupe/persist/detail/entity_actor.hpp"
#include "troupe/persist/detail/entity_outbox.hpp"

namespace troupe::detail {

template <class B>
void EntityActor<B>::start_persist(Eff&& eff, bool is_timeout) {
  AppendBatch batch;
  batch.persistence_id = pid();
  std::int64_t ts = wall_ms(ctx_.wall_now());
  std::uint64_t seq = seq_;
  batch.events.reserve(eff.events().size());
  for (auto& e : eff.events()) {
    Result<Encoded> enc = [&]() -> Result<Encoded> {
      try {
        return core_->codecs.encode(e);
      } catch (const std::exception& ex) {
        return Error(ErrorCode::invalid_argument, std::string("event encoder threw: ") + ex.what());
      }
    }();
    if constexpr (HasSideEffects<B>) {
      if (enc.ok())
        if (auto se = add_side_effects(behavior_, e, pid(), seq + 1, batch.outbox); !se) enc = std::move(se).error();
    }
    std::vector<std::string> tags;
    if constexpr (HasTags<B>) {
      if (enc.ok()) {
        if (auto t = tags_of(behavior_, e); t) tags = std::move(*t);
        else enc = std::move(t).error();
      }
    }
    if (!enc.ok()) {
      // Nothing was stored: the command fails, the entity carries on.
      Error err(enc.error().code(),
                "entity '" + pid() + "' cannot encode an event: " + enc.error().message());
      log(err.message());
      for (auto& s : eff.steps()) s->fail(err);
      return;
    }
    batch.events.push_back(
        EventRecord{++seq, ts, std::move(enc->type), enc->version, std::move(enc->payload), {}, std::move(tags)});
  }
  // Stored with the trace of the command (or the episode) that decided them.
  inflight_trace_ = TraceRef::current();
  if (const TraceContext* t = inflight_trace_.get()) [[unlikely]] {
    std::string id = t->trace_id.hex();
    for (auto& r : batch.events) r.trace_id = id;
  }
  inflight_ = std::make_unique<Eff>(std::move(eff));
  inflight_ts_ = ts;
  inflight_timeout_ = is_timeout;
  persisting_ = true;
  auto self = this->self();
  core_->journal->append(std::move(batch),
                         [self](Result<void> r) { self.tell(In{typename In::Appended{std::move(r)}}); });
}

template <class B>
void EntityActor<B>::on_appended(Result<void> r) {
  if (!persisting_) return;
  persisting_ = false;
  std::unique_ptr<Eff> eff = std::move(inflight_);
  // What follows the append (folding, replies, the next steps) runs under
  // the trace of the command that made it, as if it had not waited.
  TraceRef trace = std::move(inflight_trace_);
  BorrowedTraceScope scope(trace);
  if (!r.ok()) {
    on_append_failed(std::move(r).error(), *eff);
    return;
  }
  auto n = eff->events().size();
  try {
    for (auto& e : eff->events()) apply(e, ++seq_, inflight_ts_);
  } catch (const std::exception& ex) {
    return event_handler_threw(*eff, ex.what());
  } catch (...) {
    return event_handler_threw(*eff, "unknown exception");
  }
  bump(core_->counters.events_persisted, n);
  since_snapshot_ += n;
  TROUPE_LOG(log::Component::persist, log::Level::debug, "events stored",
             {{"entity", pid()}, {"events", n}, {"last_seq", seq_}});
  if (inflight_timeout_ && in_processing_) {
    // The timeout event must leave processing (E3). A state that stays
    // would be stuck; count a fresh deadline from now instead.
    log("the processing timeout event did not leave the processing state; re-arming the deadline");
    episode_start_ms_ = wall_ms(ctx_.wall_now());
    arm_deadline();
  }
  finish_effect(*eff);
  if (inflight_timeout_) timeout_hook();
  maybe_snapshot();
  resume();
}

// The events are stored but folding them threw, so the state in memory is
// unknown: rebuild it from the journal in place. The mailbox and the
// waiting commands are kept; they run after the recovery.
template <class B>
void EntityActor<B>::event_handler_threw(Eff& eff, std::string_view what) {
  bump(core_->counters.handler_failures);
  std::string msg = "the event handler threw (" + std::string(what) + "); recovering from the journal";
  log(msg);
  Error err(ErrorCode::handler_failed, "entity '" + pid() + "': " + msg);
  for (auto& s : eff.steps()) s->fail(err);
  drop_runs(err);
  this->cancel_timer(kDeadlineKey);
  if (in_processing_) core_->processing.leave(id_);
  in_processing_ = false;
  due_episode_ = 0;
  seq_ = 0;
  state_ = initial_state();
  phase_ = Phase::recovering;
  start_recovery();
}

template <class B>
void EntityActor<B>::on_append_failed(Error e, Eff& eff) {
  bool conflict = e.code() == ErrorCode::journal_conflict;
  bump(conflict ? core_->counters.journal_conflicts : core_->counters.journal_failures);
  Error err(e.code(), "entity '" + pid() + "': " + e.message());
  log(conflict ? "append rejected, another incarnation writes this entity (E7); stopping: " + e.message()
               : "append failed; stopping: " + e.message());
  for (auto& s : eff.steps()) s->fail(err);
  // This incarnation's state may be behind the journal: it must not go on.
  // Waiting commands get the error; the next command recovers afresh.
  fail_all(err);
  stop_now();
}

template <class B>
void EntityActor<B>::maybe_snapshot() {
  auto& st = core_->settings;
  if (!st.snapshot_every || !core_->state_codec || since_snapshot_ < st.snapshot_every || in_processing_)
    return;
  since_snapshot_ = 0;
  auto& codec = *core_->state_codec;
  ByteWriter w;
  try {
    codec.encode(state_, w);
  } catch (const std::exception& ex) {
    log(std::string("snapshot encoder threw: ") + ex.what());
    return;
  }
  SnapshotRecord rec{seq_, wall_ms(ctx_.wall_now()), codec.type, codec.version, w.take()};
  auto core = core_;
  std::string id = id_;
  core_->journal->save_snapshot(pid(), std::move(rec), [core, id](Result<void> r) {
    if (r.ok()) {
      bump(core->counters.snapshots_saved);
    } else if (core->settings.log) {
      // A lost snapshot only makes the next recovery longer.
      entity_log(core->settings.type_name, id, "snapshot not saved: " + r.error().to_string());
    }
  });
}

}  // namespace troupe::detail
