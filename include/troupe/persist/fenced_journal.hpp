#pragma once
// FencedJournal: the journal as one fenced owner writes it (SPEC E9).
//
// An owner that holds something at an epoch (a cluster shard's owner at its
// placement epoch, a queue shard's owner, a node at its incarnation) opens
// a FencedJournal over the shared journal with its fence. The view first
// raises the fence on the journal; every operation made meanwhile waits, in
// order, until that raise is stored. Then each append carries the fence, so
// the journal refuses it, atomically with the insert, once a newer owner has
// raised the fence above it. If the raise itself is refused (a newer owner
// already holds a higher fence) or fails, every operation through the view
// fails with that error: a stale owner never recovers, reads or writes
// anything through it.
//
//   auto view = FencedJournal::open(journal, Fence{"payment/17", epoch});
//   auto registry = EntityRegistry<...>::start(system, view, ...);
//
// Ownership: the view shares the inner journal, which must outlive the
// operations in flight as usual. Thread safety: like every Journal, any
// thread may call any operation; callbacks run where the inner journal runs
// them, or on the thread that completes the raise for operations that
// waited for it.

#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe {

class FencedJournal final : public Journal {
 public:
  // Starts raising `fence` on `inner`. A fence with an empty key or a value
  // of 0 is refused like raise_fence refuses it: every operation then fails
  // with invalid_argument.
  static std::shared_ptr<FencedJournal> open(std::shared_ptr<Journal> inner, Fence fence);

  ~FencedJournal() override;
  FencedJournal(const FencedJournal&) = delete;
  FencedJournal& operator=(const FencedJournal&) = delete;

  void append(AppendBatch batch, Callback<void> done) override;
  void replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
              Callback<std::vector<EventRecord>> done) override;
  void highest_seq(std::string persistence_id, Callback<std::uint64_t> done) override;
  void delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) override;
  void save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) override;
  void load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) override;
  void recover(std::string persistence_id, Callback<Recovery> done) override;
  // Raises another fence on the inner journal, once this view's is stored.
  void raise_fence(std::string key, std::uint64_t value, Callback<void> done) override;
  void highest_fence(Callback<std::uint64_t> done) override;
  std::string_view name() const noexcept override;
  // The inner journal's counters.
  JournalStats journal_stats() const override;
  // The inner journal's outbox. Appends carry their records to it, under
  // this view's fence; claims, settlements and reads are not gated (any
  // dispatcher runs the records, whoever owns the entities).
  bool stores_outbox() const noexcept override;
  void claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) override;
  void settle_outbox(OutboxSettlement settlement, Callback<void> done) override;
  void read_outbox(OutboxQuery query, Callback<OutboxView> done) override;
  // The inner journal's queries and listeners, not gated (reads).
  bool supports_queries() const noexcept override;
  void query_events(EventQuery query, Callback<EventPage> done) override;
  std::uint64_t add_append_listener(std::function<void()> listener) override;
  void remove_append_listener(std::uint64_t id) override;

  const Fence& fence() const noexcept;
  // The raise's outcome once known; nullopt while it is in flight.
  std::optional<Result<void>> raised() const;

  class State;

 private:
  explicit FencedJournal(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace troupe
