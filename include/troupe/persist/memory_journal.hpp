#pragma once
// A journal kept in memory: for tests and for entities whose history may be
// lost with the process.
//
// Operations complete on the caller's thread before they return, unless the
// journal is put on hold (`hold()`), in which case appends wait until
// `release_held()`: tests use that to observe an entity while its events are
// in flight. `fail_next_appends` injects journal errors. Thread-safe; owned
// by whoever creates it (usually a shared_ptr shared with the registries).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe {
namespace detail {
class AppendListeners;
}  // namespace detail

class MemoryJournal final : public Journal {
 public:
  MemoryJournal();
  ~MemoryJournal() override;

  void append(AppendBatch batch, Callback<void> done) override;
  void replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
              Callback<std::vector<EventRecord>> done) override;
  void highest_seq(std::string persistence_id, Callback<std::uint64_t> done) override;
  void delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) override;
  void save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) override;
  void load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) override;
  void raise_fence(std::string key, std::uint64_t value, Callback<void> done) override;
  void highest_fence(Callback<std::uint64_t> done) override;
  std::string_view name() const noexcept override { return "memory"; }
  // Nothing: the journal stores each operation at once, in no transaction.
  JournalStats journal_stats() const override { return {}; }
  // The outbox, in memory like the rest (memory_outbox.cpp).
  bool stores_outbox() const noexcept override { return true; }
  void claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) override;
  void settle_outbox(OutboxSettlement settlement, Callback<void> done) override;
  void read_outbox(OutboxQuery query, Callback<OutboxView> done) override;
  // The global order is the arrival order; listeners run on the appending
  // thread after its append (memory_query.cpp).
  bool supports_queries() const noexcept override { return true; }
  void query_events(EventQuery query, Callback<EventPage> done) override;
  std::uint64_t add_append_listener(std::function<void()> listener) override;
  void remove_append_listener(std::uint64_t id) override;

  // Test controls.
  // From now on appends wait (in order) until release_held().
  void hold();
  // Completes every held append, in order, on the calling thread, and stops holding.
  void release_held();
  std::size_t held() const;
  // The next `n` appends fail with `e` and store nothing.
  void fail_next_appends(std::size_t n, Error e);
  // Overwrites a stored event's bytes or manifest (corruption tests).
  bool tamper(const std::string& persistence_id, std::uint64_t seq, EventRecord replacement);
  // Events stored in total, over all ids.
  std::size_t size() const;

 private:
  struct Log {
    std::map<std::uint64_t, EventRecord> events;
    std::uint64_t highest = 0;
    std::optional<SnapshotRecord> snapshot;
  };
  // A stored outbox record and its lease.
  struct StoredEffect {
    OutboxEntry entry;
    std::string lease_owner;
    std::uint64_t lease_incarnation = 0;
    std::int64_t lease_until_ms = 0;
  };
  // Where an event sits in the global order.
  struct Placed {
    std::string persistence_id;
    std::uint64_t seq = 0;
  };
  Result<void> apply_append(AppendBatch& batch);
  // Checks the batch's outbox keys, then stores its records (mu_ held).
  Result<void> check_outbox(const AppendBatch& batch) const;
  void store_outbox(AppendBatch& batch);

  mutable std::mutex mu_;
  std::map<std::string, Log, std::less<>> logs_;
  std::map<std::string, std::uint64_t, std::less<>> fences_;
  std::map<std::uint64_t, Placed> ordered_;  // the global order: ordering -> event
  std::uint64_t next_ordering_ = 1;
  std::unique_ptr<detail::AppendListeners> listeners_;
  std::map<std::uint64_t, StoredEffect> outbox_;  // by arrival: oldest first
  std::map<std::string, std::uint64_t, std::less<>> outbox_keys_;  // key -> arrival
  std::uint64_t outbox_arrivals_ = 0;
  bool holding_ = false;
  std::deque<std::pair<AppendBatch, Callback<void>>> held_;
  std::size_t fail_next_ = 0;
  Error fail_with_;
};

}  // namespace troupe
