#pragma once
// A writer lane of the PostgreSQL journal: one connection, one thread (the
// group-commit engine's), everything queued on its lane stored in as few
// round trips as possible. Internal to src/persist/postgres; the rules are
// in doc/journal.md ("PostgreSQL").

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "../journal_engine.hpp"
#include "pg_support.hpp"
#include "troupe/persist/postgres_journal.hpp"

namespace troupe::pg {

using Clock = std::chrono::steady_clock;
class Announcer;

// What the lanes, the readers and the public object share. Fixed once
// open() returned, except `reconnects`.
struct Shared {
  Shared(PostgresJournalOptions o, std::string quoted_schema)
      : options(std::move(o)), sql(quoted_schema) {}

  // A new connection with `statements` prepared on it.
  Result<PgConn> connect(const std::vector<Sql::Prepared>& statements) const;

  const PostgresJournalOptions options;
  const Sql sql;
  // The fence appends without one are stored under (options.owner's
  // incarnation); value 0 when there is no owner.
  Fence owner;
  // Told of every lane commit that stored events (pg_announce.hpp); set
  // before the lanes start.
  Announcer* announcer = nullptr;

  std::atomic<std::uint64_t> reconnects{0};
};

// --- what both of the writer's paths send and read (postgres_writer.cpp) ---

// The six event columns of `rows` batches, as arrays.
struct RowArrays {
  ArrayParam ids{kByteaOid}, seqs{kInt8Oid}, times{kInt8Oid}, types{kByteaOid}, versions{kInt8Oid},
      payloads{kByteaOid};
  void start(std::size_t n) {
    for (ArrayParam* a : {&ids, &seqs, &times, &types, &versions, &payloads}) a->start(n);
  }
  template <class Record>
  void add(const std::string& id, const Record& r) {
    ids.bytes(id);
    seqs.int8(static_cast<std::int64_t>(r.seq));
    times.int8(r.timestamp_ms);
    types.bytes(r.type);
    versions.int8(static_cast<std::int64_t>(r.version));
    payloads.bytes(r.payload);
  }
  Params params() {
    Params p;
    for (ArrayParam* a : {&ids, &seqs, &times, &types, &versions, &payloads}) p.array(a->take(), a->array_type());
    return p;
  }
};

// check_fences' arguments for the fenced appends among `batches`: each
// (key, value) once, and the keys' locks once each, in ascending order (so
// two writers never wait for each other's locks in a cycle).
std::optional<Params> fence_check(const std::string& schema, const std::vector<const AppendBatch*>& batches);
// The kAppend arguments: every event of `batches`.
Params append_rows(const std::vector<const AppendBatch*>& batches);
// The statement that appends `batches`: kAppend with append_rows, or
// kAppendTagged (its rows plus the tags) when any event has tags.
Call append_call(const std::vector<const AppendBatch*>& batches);
// The journal_conflict of a batch the primary key refused.
Error conflict(const AppendBatch& b);
// The stored fence check_fences reported (its DETAIL: "<index> <fence>").
std::uint64_t refused_at(const Outcome& o);

// --- the lane -----------------------------------------------------------------

class Writer final : public detail::JournalLane {
 public:
  explicit Writer(Shared& shared) : shared_(shared) {}

  // The first connection, made by open().
  Result<void> connect_now();

  detail::Committed commit(std::span<detail::JournalWrite> ops, std::span<Result<void>> results) override;

  // The highest seq a reader saw stored for `id`: saves the lane a read
  // before the id's next append. Any thread.
  void hint(const std::string& id, std::uint64_t highest);

  // Raises (or, with `bump`, increments) a fence in a transaction of its
  // own; the stored value afterwards. Used by commit() and by open().
  Result<std::uint64_t> raise(const std::string& key, std::uint64_t value, bool bump, Clock::time_point deadline);

 private:
  enum class GroupEnd { committed, rolled_back, failed };

  bool ensure_connected(Clock::time_point deadline, std::string& why);
  void drop_connection() { conn_.reset(); }
  void take_hints();
  void forget() { highest_.clear(); }
  Result<std::vector<detail::StoredHighest>> read_highest(const std::vector<std::string>& ids, bool& lost);
  GroupEnd commit_group(std::span<detail::JournalWrite> ops, const std::vector<std::size_t>& group,
                        Clock::time_point deadline, Error& error);
  void commit_slow(std::span<detail::JournalWrite> ops, const std::vector<std::size_t>& slow,
                   std::span<Result<void>> results, Clock::time_point deadline);
  // One operation under its own savepoint; sets `lost` when the
  // transaction is gone.
  Result<void> apply_one(detail::JournalWrite& op, std::uint64_t& written, bool& lost);
  Result<void> slow_append(AppendBatch& batch, bool& lost);
  // An outbox claim or settlement, in a transaction of its own (pg_outbox.cpp).
  Result<void> do_outbox(detail::OutboxWrite& op, Clock::time_point deadline);
  // `why`: when no connection came back, the last attempt's error (a
  // refused password, a refused certificate) for the caller's message.
  std::optional<bool> verify(const AppendBatch& batch, Clock::time_point deadline, std::string& why);

  // A transaction of `events` appended events committed.
  void count_commit(std::uint64_t events) {
    ++committed_.transactions;
    committed_.events += events;
  }

  Shared& shared_;
  PgConn conn_;
  detail::Committed committed_;  // by the commit() under way
  int backoff_ms_ = 0;
  Clock::time_point next_attempt_{};
  std::string last_connect_error_;
  bool connected_once_ = false;
  // Highest seq per id as this lane knows it: what it committed, read or
  // was told by a reader. Never above the stored value (it only grows
  // stored values, and another writer only adds to them), so an append that
  // continues it needs no read: the primary key catches a writer that got
  // there first. Cleared when a transaction's outcome is lost.
  std::unordered_map<std::string, std::uint64_t> highest_;
  std::mutex hints_mu_;
  std::unordered_map<std::string, std::uint64_t> hints_;  // guarded by hints_mu_
};

}  // namespace troupe::pg
