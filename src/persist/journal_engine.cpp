// The group-commit engine (journal_engine.hpp) and the Journal face both SQL
// journals share (detail/group_commit_journal.hpp): lanes, reader pool,
// the recoveries that wait for a reader, and the counters.

#include "journal_engine.hpp"

#include <algorithm>
#include <atomic>

#include "troupe/persist/detail/group_commit_journal.hpp"

namespace troupe::detail {

GroupCommit::GroupCommit(std::vector<std::unique_ptr<JournalLane>> lanes, std::size_t max_weight,
                         std::function<Error()> closed_error, AppendListeners* appended)
    : max_weight_(max_weight), closed_error_(std::move(closed_error)), appended_(appended) {
  for (auto& w : lanes) {
    auto lane = std::make_unique<Lane>();
    lane->writer = std::move(w);
    lanes_.push_back(std::move(lane));
  }
}

GroupCommit::~GroupCommit() {
  close();
  join();
}

std::size_t GroupCommit::lane_of(const std::string& key) const noexcept {
  if (lanes_.size() == 1) return 0;
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a: stable and cheap
  for (char c : key) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h % lanes_.size());
}

void GroupCommit::start(const std::shared_ptr<void>& keep_alive) {
  for (auto& l : lanes_) {
    Lane* lane = l.get();
    lane->thread = std::thread([this, keep_alive, lane] { run(*lane); });
  }
}

void GroupCommit::submit(JournalWrite&& op) {
  Lane& lane = *lanes_[lane_of(op.key())];
  bool queued = false, wake = false;
  {
    std::lock_guard lk(lane.mu);
    if (!lane.closed) {
      lane.queue.push_back(std::move(op));
      queued = true;
      // Only an idle lane needs a signal; a busy one swaps its queue when
      // its transaction ends. This keeps notify off the append path.
      wake = lane.idle;
      lane.idle = false;
    }
  }
  if (!queued) {
    if (op.done) op.done(closed_error_());
    return;
  }
  if (wake) lane.cv.notify_one();
}

void GroupCommit::close() {
  for (auto& l : lanes_) {
    {
      std::lock_guard lk(l->mu);
      l->closed = true;
    }
    l->cv.notify_one();
  }
}

void GroupCommit::join() {
  const auto me = std::this_thread::get_id();
  for (auto& l : lanes_) {
    if (l->thread.get_id() == me)
      l->thread.detach();  // closed from our own callback: this thread finishes and frees the state
    else if (l->thread.joinable())
      l->thread.join();
  }
}

void GroupCommit::run(Lane& lane) {
  std::vector<JournalWrite> ops;
  std::vector<Result<void>> results;
  for (;;) {
    {
      std::unique_lock lk(lane.mu);
      while (lane.queue.empty() && !lane.closed) {
        lane.idle = true;
        lane.cv.wait(lk);
      }
      lane.idle = false;
      if (lane.queue.empty()) return;  // closed and drained
      // The whole queue in one swap: one lock round trip per transaction,
      // not per append. `ops` is empty and keeps its capacity.
      ops.swap(lane.queue);
    }
    std::size_t begin = 0;
    while (begin < ops.size()) {
      std::size_t end = begin;
      std::size_t weight = ops[end++].weight();
      while (end < ops.size() && weight + ops[end].weight() <= max_weight_) weight += ops[end++].weight();
      results.assign(end - begin, Result<void>());
      const Committed c = lane.writer->commit(std::span<JournalWrite>(ops.data() + begin, end - begin), results);
      // Callbacks after the commit, on this thread, outside every lock, in
      // queue order: that keeps one id's completions in order.
      // Counted before the callbacks, so a caller that reads a counter
      // after its callback ran sees its own operation in it.
      if (c.transactions > 0) transactions_.fetch_add(c.transactions, std::memory_order_relaxed);
      if (c.events > 0) events_written_.fetch_add(c.events, std::memory_order_relaxed);
      std::uint64_t failed = 0;
      for (std::size_t i = begin; i < end; ++i)
        if (ops[i].kind == JournalWrite::Kind::append && !results[i - begin].ok()) ++failed;
      if (failed > 0) append_failures_.fetch_add(failed, std::memory_order_relaxed);
      if (c.events > 0 && appended_ != nullptr) appended_->notify();
      for (std::size_t i = begin; i < end; ++i) {
        auto done = std::move(ops[i].done);
        if (done) done(std::move(results[i - begin]));
      }
      begin = end;
    }
    ops.clear();
  }
}

Result<void> check_continues(const std::string& shown_id, std::uint64_t first, std::uint64_t highest) {
  if (first <= highest)
    return Error(ErrorCode::journal_conflict, shown_id + " already holds sequence number " + std::to_string(first) +
                                                  ": another writer appended it");
  if (first != highest + 1)
    return Error(ErrorCode::journal_conflict, "append to " + shown_id + " at " + std::to_string(first) +
                                                  " would leave a gap after " + std::to_string(highest));
  return {};
}

namespace {
Error no_queries() { return Error(ErrorCode::invalid_argument, "this journal keeps no global order to query"); }
}  // namespace

Result<EventPage> JournalReader::query_events(const EventQuery&) { return no_queries(); }

std::vector<Result<Recovery>> JournalReader::recover_many(const std::vector<std::string>& ids) {
  std::vector<Result<Recovery>> out;
  out.reserve(ids.size());
  for (const auto& id : ids) out.push_back(recover(id));
  return out;
}

// --- JournalEngine ------------------------------------------------------------------

JournalEngine::~JournalEngine() {
  // The readers and lanes go here, before the rest of the back end's state
  // (its lock file, its options), which is declared before the engine.
  reads_.reset();
  writes_.reset();
}

void JournalEngine::open(std::vector<std::unique_ptr<JournalLane>> lanes,
                         std::vector<std::unique_ptr<JournalReader>> readers) {
  writes_ = std::make_unique<GroupCommit>(std::move(lanes), options_.max_batch_events, options_.closed_error,
                                         &listeners_);
  reads_ = std::make_unique<ReaderPool<JournalReader>>(std::move(readers));
}

void JournalEngine::start(const std::shared_ptr<void>& keep_alive) {
  writes_->start(keep_alive);
  reads_->start(keep_alive);
}

void JournalEngine::shutdown() {
  writes_->close();
  reads_->close();
  writes_->join();
  reads_->join();
}

void JournalEngine::delete_up_to(std::string id, std::uint64_t to_seq, Journal::Callback<void> done) {
  writes_->submit({JournalWrite::Kind::delete_to, AppendBatch{std::move(id), {}, {}}, to_seq, {}, std::move(done)});
}

void JournalEngine::save_snapshot(std::string id, SnapshotRecord snapshot, Journal::Callback<void> done) {
  writes_->submit(
      {JournalWrite::Kind::snapshot, AppendBatch{std::move(id), {}, {}}, 0, std::move(snapshot), std::move(done)});
}

void JournalEngine::raise_fence(std::string key, std::uint64_t value, Journal::Callback<void> done) {
  writes_->submit({JournalWrite::Kind::fence, AppendBatch{std::move(key), {}, {}}, value, {}, std::move(done)});
}

void JournalEngine::claim_outbox(OutboxClaim claim, Journal::Callback<std::vector<OutboxEntry>> done) {
  if (auto v = validate_claim(claim); !v) return done(std::move(v).error());
  auto op = std::make_shared<OutboxWrite>();
  op->claim = std::move(claim);
  // Claims of every owner go to one lane: they queue behind each other there
  // instead of racing for the same rows on several connections.
  writes_->submit({JournalWrite::Kind::outbox, AppendBatch{"outbox", {}, {}}, 0, {},
                   [op, done = std::move(done)](Result<void> r) {
                     if (!r) return done(std::move(r).error());
                     done(std::move(op->claimed));
                   },
                   op});
}

void JournalEngine::settle_outbox(OutboxSettlement settlement, Journal::Callback<void> done) {
  if (auto v = validate_settlement(settlement); !v) return done(std::move(v).error());
  auto op = std::make_shared<OutboxWrite>();
  std::string key = settlement.key;
  op->settlement = std::move(settlement);
  writes_->submit({JournalWrite::Kind::outbox, AppendBatch{std::move(key), {}, {}}, 0, {}, std::move(done), op});
}

template <class T, class Fn>
void JournalEngine::read(Journal::Callback<T> done, Fn fn, bool first) {
  reads_->submit(
      [this, done = std::move(done), fn = std::move(fn)](JournalReader* r) mutable {
        if (r == nullptr) return done(options_.closed_error());
        done(fn(*r));
      },
      first);
}

void JournalEngine::replay(std::string id, std::uint64_t from, std::uint64_t to,
                           Journal::Callback<std::vector<EventRecord>> done) {
  read(std::move(done), [id = std::move(id), from, to](JournalReader& r) { return r.replay(id, from, to); });
}

void JournalEngine::highest_seq(std::string id, Journal::Callback<std::uint64_t> done) {
  read(std::move(done), [id = std::move(id)](JournalReader& r) { return r.highest_seq(id); });
}

void JournalEngine::load_snapshot(std::string id, Journal::Callback<std::optional<SnapshotRecord>> done) {
  read(std::move(done), [id = std::move(id)](JournalReader& r) { return r.load_snapshot(id); });
}

void JournalEngine::highest_fence(Journal::Callback<std::uint64_t> done) {
  read(std::move(done), [](JournalReader& r) { return r.highest_fence(); });
}

void JournalEngine::read_outbox(OutboxQuery query, Journal::Callback<OutboxView> done) {
  read(std::move(done), [query](JournalReader& r) { return r.read_outbox(query); });
}

void JournalEngine::query_events(EventQuery query, Journal::Callback<EventPage> done) {
  if (!options_.queries) return done(no_queries());
  if (auto v = validate_query(query); !v) return done(std::move(v).error());
  // Ahead of the other reads: a page is short, and a projection's lag must
  // not wait for a burst of recoveries (every new entity is one).
  read(std::move(done), [query = std::move(query)](JournalReader& r) { return r.query_events(query); }, true);
}

void JournalEngine::recover(std::string id, Journal::Callback<Recovery> done) {
  if (options_.recover_batch <= 1)
    return read(std::move(done), [id = std::move(id)](JournalReader& r) { return r.recover(id); });
  // Recoveries that arrive while every reader is busy wait here, then go
  // together, up to recover_batch in one go: a burst of new entities (one
  // recovery each) costs a few round trips, not one each, and a journal
  // with a reader free adds no wait.
  {
    std::lock_guard lk(recover_mu_);
    recoveries_.push_back({std::move(id), std::move(done)});
    if (recover_tasks_ >= reads_->size()) return;
    ++recover_tasks_;
  }
  reads_->submit([this](JournalReader* r) { recover_waiting(r); });
}

// Runs the recoveries waiting (up to recover_batch) on reader `r`, or fails
// them when the journal is closed (r null); then leaves any more to a task
// at the back of the readers' queue, behind the other reads.
void JournalEngine::recover_waiting(JournalReader* r) {
  std::vector<PendingRecovery> batch;
  {
    std::lock_guard lk(recover_mu_);
    const std::size_t n = std::min(recoveries_.size(), options_.recover_batch);
    for (std::size_t i = 0; i < n; ++i) {
      batch.push_back(std::move(recoveries_.front()));
      recoveries_.pop_front();
    }
  }
  if (r == nullptr) {
    for (auto& p : batch) p.done(options_.closed_error());
  } else if (!batch.empty()) {
    std::vector<std::string> ids;
    ids.reserve(batch.size());
    for (const auto& p : batch) ids.push_back(p.id);
    auto results = r->recover_many(ids);
    for (std::size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(results[i]));
  }
  {
    std::lock_guard lk(recover_mu_);
    if (recoveries_.empty()) {
      --recover_tasks_;
      return;
    }
  }
  reads_->submit([this](JournalReader* next) { recover_waiting(next); });
}

// --- GroupCommitJournal ---------------------------------------------------------------

GroupCommitJournal::GroupCommitJournal(std::shared_ptr<JournalEngine> engine) : engine_(std::move(engine)) {}

GroupCommitJournal::~GroupCommitJournal() { engine_->shutdown(); }

void GroupCommitJournal::append(AppendBatch batch, Callback<void> done) {
  engine_->append(std::move(batch), std::move(done));
}

void GroupCommitJournal::delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) {
  engine_->delete_up_to(std::move(persistence_id), to_seq, std::move(done));
}

void GroupCommitJournal::save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) {
  engine_->save_snapshot(std::move(persistence_id), std::move(snapshot), std::move(done));
}

void GroupCommitJournal::raise_fence(std::string key, std::uint64_t value, Callback<void> done) {
  engine_->raise_fence(std::move(key), value, std::move(done));
}

void GroupCommitJournal::replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
                                Callback<std::vector<EventRecord>> done) {
  engine_->replay(std::move(persistence_id), from_seq, to_seq, std::move(done));
}

void GroupCommitJournal::highest_seq(std::string persistence_id, Callback<std::uint64_t> done) {
  engine_->highest_seq(std::move(persistence_id), std::move(done));
}

void GroupCommitJournal::load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) {
  engine_->load_snapshot(std::move(persistence_id), std::move(done));
}

void GroupCommitJournal::recover(std::string persistence_id, Callback<Recovery> done) {
  engine_->recover(std::move(persistence_id), std::move(done));
}

void GroupCommitJournal::highest_fence(Callback<std::uint64_t> done) { engine_->highest_fence(std::move(done)); }

void GroupCommitJournal::claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) {
  engine_->claim_outbox(std::move(claim), std::move(done));
}

void GroupCommitJournal::settle_outbox(OutboxSettlement settlement, Callback<void> done) {
  engine_->settle_outbox(std::move(settlement), std::move(done));
}

void GroupCommitJournal::read_outbox(OutboxQuery query, Callback<OutboxView> done) {
  engine_->read_outbox(query, std::move(done));
}

bool GroupCommitJournal::supports_queries() const noexcept { return engine_->supports_queries(); }

void GroupCommitJournal::query_events(EventQuery query, Callback<EventPage> done) {
  engine_->query_events(std::move(query), std::move(done));
}

std::uint64_t GroupCommitJournal::add_append_listener(std::function<void()> listener) {
  return engine_->add_append_listener(std::move(listener));
}

void GroupCommitJournal::remove_append_listener(std::uint64_t id) { engine_->remove_append_listener(id); }

JournalStats GroupCommitJournal::journal_stats() const { return engine_->stats(); }

GroupCommitJournal::Stats GroupCommitJournal::stats() const {
  return {engine_->transactions(), engine_->events_written(), engine_->append_failures()};
}

}  // namespace troupe::detail
