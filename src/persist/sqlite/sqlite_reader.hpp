#pragma once
// A reader of the SQLite journal: one read-only connection and its
// statements, used by one reader thread of the engine at a time
// (journal_engine.hpp). Every read that needs more than one statement runs
// in one read transaction, so it sees one committed state. Internal to
// src/persist/sqlite.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../journal_engine.hpp"
#include "sqlite_support.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace troupe::sqlite {

class Reader final : public detail::JournalReader {
 public:
  // `options` outlives the reader (the journal's state owns both).
  explicit Reader(const SqliteJournalOptions& options) : options_(options) {}
  Result<void> open();

  Result<std::vector<EventRecord>> replay(const std::string& id, std::uint64_t from, std::uint64_t to) override;
  Result<std::uint64_t> highest_seq(const std::string& id) override;
  Result<std::optional<SnapshotRecord>> load_snapshot(const std::string& id) override;
  Result<Recovery> recover(const std::string& id) override;
  Result<std::uint64_t> highest_fence() override;
  // sqlite_outbox.cpp.
  Result<OutboxView> read_outbox(const OutboxQuery& query) override;
  // One statement, so one committed state without a transaction.
  Result<EventPage> query_events(const EventQuery& query) override;

 private:
  Result<detail::StoredHighest> read_highest(const std::string& id);
  Result<void> read_events(const std::string& id, std::uint64_t from, std::uint64_t to, std::uint64_t deleted_to,
                           std::vector<EventRecord>& out);
  Result<std::optional<SnapshotRecord>> read_snapshot(const std::string& id);
  Result<void> begin();
  Result<void> end();
  void abort();

  const SqliteJournalOptions& options_;
  Connection db_;
  Stmt begin_, commit_, rollback_, events_, snapshot_, highest_, highest_fence_;
  Stmt outbox_counts_, outbox_entries_, by_type_, by_tag_;  // prepared on first use
};

}  // namespace troupe::sqlite
