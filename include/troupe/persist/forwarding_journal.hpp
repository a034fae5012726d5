#pragma once
// ForwardingJournal: a Journal that passes every operation to another one,
// for decorators that change or observe a few of them (metering, tracing,
// tests that record the order of commits):
//
//   class CountingJournal final : public troupe::ForwardingJournal {
//    public:
//     using ForwardingJournal::ForwardingJournal;
//     void append(troupe::AppendBatch b, Callback<void> done) override {
//       ++appends;
//       inner().append(std::move(b), std::move(done));
//     }
//     std::atomic<std::uint64_t> appends{0};
//   };
//
// Ownership: holds a share of the inner journal. Thread safety: as the
// inner journal's (every call is passed on as it came; callbacks run where
// the inner journal runs them).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe {

class ForwardingJournal : public Journal {
 public:
  explicit ForwardingJournal(std::shared_ptr<Journal> inner) : inner_(std::move(inner)) {}

  void append(AppendBatch batch, Callback<void> done) override { inner_->append(std::move(batch), std::move(done)); }
  void replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
              Callback<std::vector<EventRecord>> done) override {
    inner_->replay(std::move(persistence_id), from_seq, to_seq, std::move(done));
  }
  void highest_seq(std::string persistence_id, Callback<std::uint64_t> done) override {
    inner_->highest_seq(std::move(persistence_id), std::move(done));
  }
  void delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) override {
    inner_->delete_up_to(std::move(persistence_id), to_seq, std::move(done));
  }
  void save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) override {
    inner_->save_snapshot(std::move(persistence_id), std::move(snapshot), std::move(done));
  }
  void load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) override {
    inner_->load_snapshot(std::move(persistence_id), std::move(done));
  }
  void recover(std::string persistence_id, Callback<Recovery> done) override {
    inner_->recover(std::move(persistence_id), std::move(done));
  }
  void raise_fence(std::string key, std::uint64_t value, Callback<void> done) override {
    inner_->raise_fence(std::move(key), value, std::move(done));
  }
  void highest_fence(Callback<std::uint64_t> done) override { inner_->highest_fence(std::move(done)); }
  std::string_view name() const noexcept override { return inner_->name(); }
  JournalStats journal_stats() const override { return inner_->journal_stats(); }
  bool stores_outbox() const noexcept override { return inner_->stores_outbox(); }
  void claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done) override {
    inner_->claim_outbox(std::move(claim), std::move(done));
  }
  void settle_outbox(OutboxSettlement settlement, Callback<void> done) override {
    inner_->settle_outbox(std::move(settlement), std::move(done));
  }
  void read_outbox(OutboxQuery query, Callback<OutboxView> done) override {
    inner_->read_outbox(query, std::move(done));
  }
  bool supports_queries() const noexcept override { return inner_->supports_queries(); }
  void query_events(EventQuery query, Callback<EventPage> done) override {
    inner_->query_events(std::move(query), std::move(done));
  }
  std::uint64_t add_append_listener(std::function<void()> listener) override {
    return inner_->add_append_listener(std::move(listener));
  }
  void remove_append_listener(std::uint64_t id) override { inner_->remove_append_listener(id); }

 protected:
  Journal& inner() const noexcept { return *inner_; }

 private:
  std::shared_ptr<Journal> inner_;
};

}  // namespace troupe
