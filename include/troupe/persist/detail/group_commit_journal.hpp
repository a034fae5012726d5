#pragma once
// detail::GroupCommitJournal: the Journal operations of SqliteJournal and
// PostgresJournal, written once. Writes queue on writer lanes and go to the
// database in group commits; reads run on reader threads with connections of
// their own (src/persist/journal_engine.hpp holds the machinery). A back end
// derives from it and supplies the engine: its lanes and readers, that is,
// its SQL. Not meant for other journals to derive from.
//
// Ownership: shares the back end's state with the engine's threads, so the
// journal may be destroyed from one of its own callbacks; the destructor
// commits what is queued, runs every callback, fails later calls with
// journal_failed and joins the threads (or, called from one of them, lets
// that thread finish the queue). Thread-safe: any thread may call any
// operation.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe::detail {

class JournalEngine;  // src/persist/journal_engine.hpp

class GroupCommitJournal : public Journal {
 public:
  ~GroupCommitJournal() override;
  GroupCommitJournal(const GroupCommitJournal&) = delete;
  GroupCommitJournal& operator=(const GroupCommitJournal&) = delete;

  void append(AppendBatch batch, Callback<void> done) override;
  void replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
              Callback<std::vector<EventRecord>> done) override;
  void highest_seq(std::string persistence_id, Callback<std::uint64_t> done) override;
  void delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) override;
  void save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) override;
  void load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) override;
  void recover(std::string persistence_id, Callback<Recovery> done) override;
  void raise_fence(std::string key, std::uint64_t value, Callback<void> done) override;
  void highest_fence(Callback<std::uint64_t> done) override;
  // Write transactions committed and the events they stored.
  JournalStats journal_stats() const override;
  // The outbox, in the same database: records are inserted in the append's
  // transaction; claims and settlements are writes on the lanes.
  bool stores_outbox() const noexcept override { return true; }
  void claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) override;
  void settle_outbox(OutboxSettlement settlement, Callback<void> done) override;
  void read_outbox(OutboxQuery query, Callback<OutboxView> done) override;
  // Queries across entities, when the back end answers them; listeners
  // hear of every local commit that stored events.
  bool supports_queries() const noexcept override;
  void query_events(EventQuery query, Callback<EventPage> done) override;
  std::uint64_t add_append_listener(std::function<void()> listener) override;
  void remove_append_listener(std::uint64_t id) override;

  // Counters for metrics and benchmarks (monotonic, thread-safe).
  struct Stats {
    std::uint64_t transactions = 0;  // write transactions committed
    std::uint64_t events_written = 0;
    std::uint64_t append_failures = 0;
  };
  Stats stats() const;

 protected:
  // `engine` is open and started; it points into the back end's state and
  // keeps that state alive.
  explicit GroupCommitJournal(std::shared_ptr<JournalEngine> engine);

 private:
  std::shared_ptr<JournalEngine> engine_;
};

}  // namespace troupe::detail
