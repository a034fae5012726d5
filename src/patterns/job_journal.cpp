// The job service's journal side (J6): the row format (encode here, decode
// in recovery), the proxy actor that assigns ids and group-commits accepted
// jobs and outcomes, and the recovery that re-queues unfinished jobs at
// start. See include/troupe/patterns/job_service.hpp for the contract and
// doc/jobs.md for the design and the journal format.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "job_internal.hpp"
#include "troupe/persist/codec.hpp"

namespace troupe::detail {
namespace {

// ---------------------------------------------------------------------------
// Journal encoding (doc/jobs.md, "Journal format")

using job_rows::kAcceptedType;
using job_rows::kFinishedType;
using job_rows::kFormatVersion;
// Jobs per journal event: a batch of many jobs is a few rows, not one per job.
constexpr std::size_t kJobsPerEvent = 4096;

using job_rows::kTagFailed;
using job_rows::kTagSucceeded;
using job_rows::kTagTimedOut;

void encode_accepted(ByteWriter& w, const JobRecord& r) {
  w.u64(r.id).i64(r.priority).i64(r.timeout.count()).str(r.job.kind).str(r.job.payload);
}

void encode_finished(ByteWriter& w, JobId id, const JobOutcome& out) {
  w.u64(id);
  match(
      out, [&](const JobSucceeded& s) { w.u8(kTagSucceeded).str(s.output); },
      [&](const JobFailed& f) { w.u8(kTagFailed).str(f.reason); },
      [&](const JobTimedOut&) { w.u8(kTagTimedOut).str(""); });
}

std::int64_t wall_ms_of(WallTime t) noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// ---------------------------------------------------------------------------
// Proxy (J1 intake, J6 group commit)

// Takes requests, assigns ids and hands jobs to the queue in batches. With a
// journal it first journals them: one append in flight at a time, and
// everything that arrives meanwhile (jobs and outcomes) goes into the next
// one. Outcomes of durable jobs come back here and are reported once their
// append has succeeded. Rows whose jobs have all finished are deleted.
class JobProxy final : public Actor<ProxyMsg> {
 public:
  explicit JobProxy(const std::weak_ptr<JobCore>& core)
      : core_(lock_job_core(core)), js_(std::move(core_->journal_state)) {}

  void on_start() { self_ = self(); }

  void on_stop() {
    pending_.clear();
    in_flight_.clear();
    forward_.clear();
    finished_.clear();
    finished_in_flight_.clear();
    core_->note_down(JobCore::kProxyDown);
  }

  void receive(ProxyMsg& m) {
    match(
        m, [&](PSubmit& s) { on_submit(s); },
        [&](PFlush&) {
          flush_scheduled_ = false;
          flush();
        },
        [&](PAppended& a) { on_appended(a.result); },
        [&](PFinished& f) {
          finished_.emplace_back(std::move(f.rec), std::move(f.outcome));
          if (!in_flight_flag_) schedule_flush();
        },
        [&](PDeleted& d) {
          delete_in_flight_ = false;
          if (d.result.ok()) {
            js_.deleted_to = std::max(js_.deleted_to, d.to);
          } else {
            job_bump(core_->journal_failures);
            core_->log("deleting finished jobs from the journal failed: " + d.result.error().to_string());
          }
        },
        [&](PStop&) { on_stop_request(); });
    if (stopping_) maybe_stop();
  }

 private:
  struct Pending {
    JobRecord rec;
    JobAnswer<JobId> ack;
  };

  void on_submit(PSubmit& s) {
    if (stopping_) return;  // answered shutting_down with the message
    s.rec.id = js_.next_id++;
    if (!core_->durable) {
      job_bump(core_->accepted);
      s.ack.value(s.rec.id);
      forward_.push_back(std::move(s.rec));
    } else {
      pending_.push_back(Pending{std::move(s.rec), std::move(s.ack)});
      if (in_flight_flag_) return;
    }
    schedule_flush();
  }

  // Flushing through a message to ourselves: it queues behind everything
  // already in the mailbox, so one flush carries all of that.
  void schedule_flush() {
    if (flush_scheduled_) return;
    flush_scheduled_ = true;
    (void)self_.tell(PFlush{});
  }

  void flush() {
    if (!core_->durable) {
      if (forward_.empty()) return;
      std::vector<JobRecord> batch;
      batch.swap(forward_);
      forward_.reserve(batch.size());
      (void)core_->queue.tell(QAccepted{std::move(batch)});
      return;
    }
    if (!in_flight_flag_) start_append();
  }

  void start_append() {
    if (pending_.empty() && finished_.empty()) return;
    AppendBatch b;
    b.persistence_id = core_->pid;
    std::uint64_t seq = js_.next_seq;
    const std::int64_t ts = wall_ms_of(this->wall_now());
    accept_rows_.clear();
    for (std::size_t i = 0; i < pending_.size(); i += kJobsPerEvent) {
      const std::size_t n = std::min(kJobsPerEvent, pending_.size() - i);
      ByteWriter w;
      w.bytes().reserve(n * 48);
      w.u32(static_cast<std::uint32_t>(n));
      for (std::size_t k = i; k < i + n; ++k) {
        pending_[k].rec.accept_seq = seq;
        encode_accepted(w, pending_[k].rec);
      }
      accept_rows_.push_back(JobRow{seq, n});
      b.events.push_back(EventRecord{seq++, ts, std::string(kAcceptedType), kFormatVersion, w.take()});
    }
    for (std::size_t i = 0; i < finished_.size(); i += kJobsPerEvent) {
      const std::size_t n = std::min(kJobsPerEvent, finished_.size() - i);
      ByteWriter w;
      w.bytes().reserve(n * 24);
      w.u32(static_cast<std::uint32_t>(n));
      for (std::size_t k = i; k < i + n; ++k) encode_finished(w, finished_[k].first.id, finished_[k].second);
      b.events.push_back(EventRecord{seq++, ts, std::string(kFinishedType), kFormatVersion, w.take()});
    }
    in_flight_.swap(pending_);
    finished_in_flight_.swap(finished_);
    in_flight_events_ = seq - js_.next_seq;
    in_flight_flag_ = true;
    job_bump(core_->journal_appends);
    auto self = self_;
    core_->settings.journal->append(std::move(b),
                                    [self](Result<void> r) { (void)self.tell(PAppended{std::move(r)}); });
  }

  void on_appended(Result<void>& r) {
    in_flight_flag_ = false;
    if (r.ok()) {
      js_.next_seq += in_flight_events_;
      for (auto& row : accept_rows_) {
        js_.rows.push_back(row);
        js_.last_accept_seq = row.seq;
      }
      if (!in_flight_.empty()) {
        job_bump(core_->accepted, in_flight_.size());
        std::vector<JobRecord> batch;
        batch.reserve(in_flight_.size());
        for (auto& p : in_flight_) {
          p.ack.value(p.rec.id);
          batch.push_back(std::move(p.rec));
        }
        (void)core_->queue.tell(QAccepted{std::move(batch)});
      }
      for (auto& [rec, out] : finished_in_flight_) {
        note_finished(rec.accept_seq);
        core_->deliver(rec, std::move(out));
      }
      compact();
    } else {
      job_bump(core_->journal_failures);
      core_->log("journal append failed: " + r.error().to_string());
      // Another writer holds this log: every later append would be
      // refused the same way, so nothing this service accepts could ever
      // be stored. Stop, loudly, instead of refusing jobs one by one.
      const bool taken = r.error().code() == ErrorCode::journal_conflict;
      if (!in_flight_.empty()) {
        core_->backlog.fetch_sub(static_cast<std::int64_t>(in_flight_.size()), std::memory_order_relaxed);
        Error e(r.error().code(), "job not accepted: the journal append failed: " + r.error().message());
        for (auto& p : in_flight_) {
          p.rec.reply.error(e);
          p.ack.error(e);
        }
      }
      // The jobs did finish; told so, they may run again after a restart
      // since their outcome is not in the journal.
      for (auto& [rec, out] : finished_in_flight_) core_->deliver(rec, std::move(out));
      if (taken) {
        in_flight_.clear();
        finished_in_flight_.clear();
        core_->fail(Error(ErrorCode::journal_conflict,
                          "another writer appended to its journal log '" + core_->pid + "' (" + r.error().message() +
                              "): nothing it accepts can be stored now. A durable job service needs its log to "
                              "itself; services of one name on one journal shared by several nodes collide like "
                              "this (use troupe::cluster::start_job_service, whose queue shards re-read their log "
                              "after a stale owner's write)"));
        return;
      }
    }
    in_flight_.clear();
    finished_in_flight_.clear();
    if (!pending_.empty() || !finished_.empty()) start_append();
  }

  void note_finished(std::uint64_t accept_seq) {
    if (accept_seq == 0) return;
    auto it = std::lower_bound(js_.rows.begin(), js_.rows.end(), accept_seq,
                               [](const JobRow& row, std::uint64_t s) { return row.seq < s; });
    if (it != js_.rows.end() && it->seq == accept_seq && it->unfinished > 0) --it->unfinished;
  }

  // Deletes the journal's prefix of rows whose jobs have all finished. The
  // newest accepted row is kept: it holds the highest id issued, where the
  // next start continues.
  void compact() {
    while (!js_.rows.empty() && js_.rows.front().unfinished == 0 && js_.rows.front().seq != js_.last_accept_seq)
      js_.rows.pop_front();
    std::uint64_t deletable = js_.next_seq - 1;
    if (!js_.rows.empty()) deletable = js_.rows.front().seq - 1;
    if (js_.last_accept_seq > 0) deletable = std::min(deletable, js_.last_accept_seq - 1);
    if (deletable <= js_.deleted_to || delete_in_flight_ || stopping_) return;
    delete_in_flight_ = true;
    auto self = self_;
    core_->settings.journal->delete_up_to(
        core_->pid, deletable, [self, deletable](Result<void> r) { (void)self.tell(PDeleted{std::move(r), deletable}); });
  }

  void on_stop_request() {
    stopping_ = true;
    pending_.clear();  // answered shutting_down
    forward_.clear();
  }

  // Stopping: outcomes already decided are journaled (and reported) first;
  // the proxy goes once nothing of its own is in flight, so no journal
  // callback or flush of its own ever finds it gone.
  void maybe_stop() {
    if (in_flight_flag_ || delete_in_flight_ || flush_scheduled_) return;
    if (core_->durable && !finished_.empty()) {
      start_append();
      return;
    }
    stop();
  }

  std::shared_ptr<JobCore> core_;
  JobJournalState js_;
  ActorRef<ProxyMsg> self_;
  bool flush_scheduled_ = false;
  bool stopping_ = false;
  bool in_flight_flag_ = false;
  bool delete_in_flight_ = false;
  std::vector<JobRecord> forward_;  // in memory: accepted, not yet handed to the queue
  std::vector<Pending> pending_, in_flight_;
  std::vector<std::pair<JobRecord, JobOutcome>> finished_, finished_in_flight_;
  std::vector<JobRow> accept_rows_;  // rows of the append in flight
  std::uint64_t in_flight_events_ = 0;
};

}  // namespace

ActorRef<ProxyMsg> spawn_job_proxy(ActorSystem& system, std::string name,
                                   const std::weak_ptr<JobCore>& core) {
  return system.spawn<JobProxy>(SpawnOptions{.name = std::move(name)}, core);
}

// ---------------------------------------------------------------------------
// Recovery (J6); the rows themselves are read in job_rows.cpp.

// Reads the journal: jobs accepted without a journaled outcome are re-queued
// in acceptance order. Fills core.journal_state; returns the jobs.
Result<std::vector<JobRecord>> recover_jobs(JobCore& core) {
  auto r = journal_sync::recover(*core.settings.journal, core.pid);
  if (!r.ok()) {
    if (r.error().code() == ErrorCode::corrupt_record) {
      return Error(ErrorCode::corrupt_record,
                   "job journal '" + core.pid + "': " + r.error().message() + "; the service did not start");
    }
    return Error(ErrorCode::recovery_failed, "job journal '" + core.pid +
                                                 "' could not be read: " + r.error().to_string() +
                                                 "; the service did not start");
  }
  return decode_job_rows(r.value(), core.pid, core.settings.default_timeout, core.settings.watchdog_limit,
                         core.journal_state);
}

}  // namespace troupe::detail
