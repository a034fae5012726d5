// MemoryJournal's outbox (outbox.hpp): records kept beside the logs, under
// the journal's one mutex, so an append stores its records atomically with
// its events.

#include <string>
#include <utility>
#include <vector>

#include "outbox_support.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe {

Result<void> MemoryJournal::check_outbox(const AppendBatch& batch) const {
  for (const OutboxRecord& r : batch.outbox)
    if (outbox_keys_.contains(r.key)) return detail::outbox_key_taken(batch.persistence_id, r.key);
  return {};
}

void MemoryJournal::store_outbox(AppendBatch& batch) {
  const EventRecord& last = batch.events.back();
  for (OutboxRecord& r : batch.outbox) {
    const std::uint64_t arrival = ++outbox_arrivals_;
    outbox_keys_.emplace(r.key, arrival);
    StoredEffect& s = outbox_[arrival];
    s.entry.record = std::move(r);
    s.entry.persistence_id = batch.persistence_id;
    s.entry.seq = last.seq;
    s.entry.created_ms = last.timestamp_ms;
  }
}

void MemoryJournal::claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) {
  if (auto v = validate_claim(claim); !v) return done(std::move(v).error());
  std::vector<OutboxEntry> out;
  {
    std::lock_guard lk(mu_);
    for (auto& [arrival, s] : outbox_) {
      if (out.size() >= claim.limit) break;
      OutboxEntry& e = s.entry;
      if (e.status != OutboxStatus::pending || e.next_attempt_ms > claim.now_ms) continue;
      const bool earlier_run = s.lease_owner == claim.owner && s.lease_incarnation != claim.incarnation;
      if (s.lease_until_ms > claim.now_ms && !earlier_run) continue;
      s.lease_owner = claim.owner;
      s.lease_incarnation = claim.incarnation;
      s.lease_until_ms = claim.now_ms + claim.lease_ms;
      ++e.attempts;
      out.push_back(e);
    }
  }
  done(std::move(out));
}

void MemoryJournal::settle_outbox(OutboxSettlement st, Callback<void> done) {
  if (auto v = validate_settlement(st); !v) return done(std::move(v).error());
  {
    std::lock_guard lk(mu_);
    auto k = outbox_keys_.find(st.key);
    if (k == outbox_keys_.end()) return done(Result<void>{});
    auto it = outbox_.find(k->second);
    StoredEffect& s = it->second;
    if (s.lease_owner != st.owner || s.lease_incarnation != st.incarnation) return done(Result<void>{});
    switch (st.outcome) {
      case OutboxSettlement::Outcome::done:
        outbox_.erase(it);
        outbox_keys_.erase(k);
        break;
      case OutboxSettlement::Outcome::retry:
      case OutboxSettlement::Outcome::failed:
        s.entry.status = st.outcome == OutboxSettlement::Outcome::retry ? OutboxStatus::pending : OutboxStatus::failed;
        s.entry.next_attempt_ms = st.outcome == OutboxSettlement::Outcome::retry ? st.next_attempt_ms : 0;
        s.entry.last_error = std::move(st.error);
        s.lease_owner.clear();
        s.lease_incarnation = 0;
        s.lease_until_ms = 0;
        break;
    }
  }
  done(Result<void>{});
}

void MemoryJournal::read_outbox(OutboxQuery q, Callback<OutboxView> done) {
  OutboxView v;
  {
    std::lock_guard lk(mu_);
    for (const auto& [arrival, s] : outbox_) {
      if (s.entry.status == OutboxStatus::pending)
        ++v.pending;
      else
        ++v.failed;
      if (s.entry.status == q.status && v.entries.size() < q.limit) v.entries.push_back(s.entry);
    }
  }
  done(std::move(v));
}

}  // namespace troupe
