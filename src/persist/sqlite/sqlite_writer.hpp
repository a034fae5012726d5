#pragma once
// The SQLite journal's writer: the only write connection, its statements and
// its caches, as the group-commit engine's one lane (journal_engine.hpp).
// Used by the lane's thread only (and by open() before that thread starts).
// Internal to src/persist/sqlite.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "../journal_engine.hpp"
#include "sqlite_support.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace troupe::sqlite {

// Opens `conn` on options.path for writing: WAL mode, options.durability,
// and the schema checked, created or migrated (sqlite_schema.cpp).
Result<void> open_for_writing(Connection& conn, const SqliteJournalOptions& options);
// Creates the outbox table where it is missing (sqlite_outbox.cpp): a file
// written before the outbox existed gets it on its first open for writing.
Result<void> ensure_outbox(sqlite3* db, const std::string& path);

class Writer final : public detail::JournalLane {
 public:
  // `options` outlives the writer (the journal's state owns both).
  explicit Writer(const SqliteJournalOptions& options) : options_(options) {}
  // Opens the connection and prepares the statements.
  Result<void> open();
  detail::Committed commit(std::span<detail::JournalWrite> ops, std::span<Result<void>> results) override;

 private:
  Result<void> do_append(AppendBatch& batch, std::uint64_t& written);
  Result<void> do_delete(const std::string& id, std::uint64_t to_seq);
  Result<void> do_snapshot(const std::string& id, const SnapshotRecord& snapshot);
  Result<void> do_fence(const std::string& key, std::uint64_t value);
  // The outbox (sqlite_outbox.cpp): its statements, an append's records (in
  // the append's savepoint), and claims and settlements.
  Result<void> prepare_outbox();
  Result<void> insert_outbox(const AppendBatch& batch);
  Result<void> do_outbox(detail::OutboxWrite& op);
  // The global order: the next ordering read at open
  // (and again should a row this writer did not write hold it), an event's
  // tags inserted after it, deleted events' tags removed with them.
  Result<void> load_next_ordering();
  Result<void> insert_tags(const EventRecord& e, std::uint64_t ordering);
  Result<void> delete_tags(const std::string& id, std::uint64_t to_seq);
  Result<void> keep_ordering_high();
  Result<std::uint64_t*> cached_highest(const std::string& id);
  Result<std::uint64_t*> cached_fence(const std::string& key);
  Result<void> savepoint();
  Result<void> release();
  void rollback_savepoint();
  void forget();
  Error fail(std::string_view doing) const;

  const SqliteJournalOptions& options_;
  std::shared_ptr<WriteTurns> turns_;  // this process's writers of the file take turns
  Connection db_;
  Stmt begin_, commit_, rollback_, savepoint_, release_, rollback_to_;
  Stmt insert_event_, select_highest_, delete_events_, upsert_deletion_, insert_snapshot_, prune_snapshots_;
  Stmt select_fence_, upsert_fence_;
  Stmt insert_tag_, select_deleted_tags_, delete_tag_, select_ordering_high_, raise_ordering_high_;
  Stmt insert_outbox_, claim_outbox_, settle_done_, settle_update_;
  // Highest seq per id and the stored fence per key, as of the current
  // transaction. Valid because this thread is the only writer of the file
  // (the lock file keeps other processes out); cleared whenever a
  // transaction is lost.
  std::unordered_map<std::string, std::uint64_t> highest_;
  std::unordered_map<std::string, std::uint64_t> fences_;
  // The ordering (rowid) the next event gets. Assigned here, not by SQLite,
  // whose max(rowid) + 1 would give the numbers of the last events again
  // once delete_up_to removed them: readers resume after those numbers.
  // Kept across lost transactions (a gap in the order is harmless; a number
  // given twice is not). doc/journal.md "Global order".
  std::uint64_t next_ordering_ = 1;
  std::string tags_text_;  // the current event's tags, joined, bound to the insert
};

}  // namespace troupe::sqlite
