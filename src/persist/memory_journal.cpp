#include "troupe/persist/memory_journal.hpp"

#include "append_listeners.hpp"

namespace troupe {

MemoryJournal::MemoryJournal() : listeners_(std::make_unique<detail::AppendListeners>()) {}

MemoryJournal::~MemoryJournal() {
  // Appends still held are failed, not dropped: their callers get an answer.
  std::deque<std::pair<AppendBatch, Callback<void>>> held;
  {
    std::lock_guard lk(mu_);
    held.swap(held_);
  }
  for (auto& [b, cb] : held) cb(Error(ErrorCode::journal_failed, "journal closed with the append pending"));
}

Result<void> MemoryJournal::apply_append(AppendBatch& batch) {
  if (auto v = validate_batch(batch); !v.ok()) return v;
  if (fail_next_ > 0) {
    --fail_next_;
    return fail_with_;
  }
  if (batch.fence.value != 0)
    if (auto f = fences_.find(batch.fence.key); f != fences_.end() && f->second > batch.fence.value)
      return fence_refused(batch, f->second);
  auto it = logs_.find(batch.persistence_id);
  if (it == logs_.end()) it = logs_.emplace(batch.persistence_id, Log{}).first;
  Log& log = it->second;
  std::uint64_t first = batch.events.front().seq;
  if (first <= log.highest)
    return Error(ErrorCode::journal_conflict, "'" + batch.persistence_id + "' already holds sequence number " +
                                                  std::to_string(first) + ": another writer appended it");
  if (first != log.highest + 1)
    return Error(ErrorCode::journal_conflict, "append to '" + batch.persistence_id + "' at " +
                                                  std::to_string(first) + " would leave a gap after " +
                                                  std::to_string(log.highest));
  if (!batch.outbox.empty()) {
    if (auto o = check_outbox(batch); !o) return o;
    store_outbox(batch);
  }
  for (auto& e : batch.events) {
    log.highest = e.seq;
    ordered_.emplace(next_ordering_++, Placed{batch.persistence_id, e.seq});
    log.events.emplace(e.seq, std::move(e));
  }
  return {};
}

void MemoryJournal::append(AppendBatch batch, Callback<void> done) {
  Result<void> r;
  {
    std::lock_guard lk(mu_);
    if (holding_) {
      held_.emplace_back(std::move(batch), std::move(done));
      return;
    }
    r = apply_append(batch);
  }
  if (r) listeners_->notify();
  done(std::move(r));
}

void MemoryJournal::hold() {
  std::lock_guard lk(mu_);
  holding_ = true;
}

void MemoryJournal::release_held() {
  std::deque<std::pair<AppendBatch, Callback<void>>> held;
  std::vector<Result<void>> results;
  {
    std::lock_guard lk(mu_);
    holding_ = false;
    held.swap(held_);
    for (auto& [b, cb] : held) results.push_back(apply_append(b));
  }
  if (!held.empty()) listeners_->notify();
  for (std::size_t i = 0; i < held.size(); ++i) held[i].second(std::move(results[i]));
}

std::size_t MemoryJournal::held() const {
  std::lock_guard lk(mu_);
  return held_.size();
}

void MemoryJournal::fail_next_appends(std::size_t n, Error e) {
  std::lock_guard lk(mu_);
  fail_next_ = n;
  fail_with_ = std::move(e);
}

bool MemoryJournal::tamper(const std::string& persistence_id, std::uint64_t seq, EventRecord replacement) {
  std::lock_guard lk(mu_);
  auto it = logs_.find(persistence_id);
  if (it == logs_.end()) return false;
  auto ev = it->second.events.find(seq);
  if (ev == it->second.events.end()) return false;
  replacement.seq = seq;
  ev->second = std::move(replacement);
  return true;
}

std::size_t MemoryJournal::size() const {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (auto& [id, log] : logs_) n += log.events.size();
  return n;
}

void MemoryJournal::replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
                           Callback<std::vector<EventRecord>> done) {
  std::vector<EventRecord> out;
  {
    std::lock_guard lk(mu_);
    auto it = logs_.find(persistence_id);
    if (it != logs_.end() && from_seq <= to_seq) {
      auto& evs = it->second.events;
      for (auto e = evs.lower_bound(from_seq); e != evs.end() && e->first <= to_seq; ++e) out.push_back(e->second);
    }
  }
  done(std::move(out));
}

void MemoryJournal::highest_seq(std::string persistence_id, Callback<std::uint64_t> done) {
  std::uint64_t h = 0;
  {
    std::lock_guard lk(mu_);
    if (auto it = logs_.find(persistence_id); it != logs_.end()) h = it->second.highest;
  }
  done(h);
}

void MemoryJournal::delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) {
  {
    std::lock_guard lk(mu_);
    if (auto it = logs_.find(persistence_id); it != logs_.end()) {
      auto& evs = it->second.events;
      evs.erase(evs.begin(), evs.upper_bound(to_seq));
    }
  }
  done(Result<void>{});
}

void MemoryJournal::save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) {
  if (persistence_id.empty()) return done(Error(ErrorCode::invalid_argument, "snapshot with an empty persistence id"));
  {
    std::lock_guard lk(mu_);
    auto& log = logs_[persistence_id];
    if (!log.snapshot || log.snapshot->seq <= snapshot.seq) log.snapshot = std::move(snapshot);
  }
  done(Result<void>{});
}

void MemoryJournal::raise_fence(std::string key, std::uint64_t value, Callback<void> done) {
  Result<void> r = validate_fence(key, value);
  if (r) {
    std::lock_guard lk(mu_);
    std::uint64_t& stored = fences_[key];
    if (stored > value)
      r = fence_lowered(key, value, stored);
    else
      stored = value;
  }
  done(std::move(r));
}

void MemoryJournal::highest_fence(Callback<std::uint64_t> done) {
  std::uint64_t h = 0;
  {
    std::lock_guard lk(mu_);
    for (auto& [key, value] : fences_) h = std::max(h, value);
  }
  done(h);
}

void MemoryJournal::load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) {
  std::optional<SnapshotRecord> s;
  {
    std::lock_guard lk(mu_);
    if (auto it = logs_.find(persistence_id); it != logs_.end()) s = it->second.snapshot;
  }
  done(std::move(s));
}

}  // namespace troupe
