#pragma once
// SqliteReadModel: an SQLite database a projection writes its read model
// into, with the projection's offset in the same transaction (exactly once;
// read_model.hpp). It may be the journal's own file (the tables live beside
// the journal's; writes take SQLite's write lock, so a projection's
// transaction waits for, and briefly holds off, the journal's commits) or a
// file of its own.
//
//   auto model = troupe::SqliteReadModel::open({.path = "payments.db"}).value();
//   struct ByCustomer {
//     using ReadModel = troupe::SqliteReadModel;
//     troupe::Result<void> setup(troupe::SqliteTransaction& tx) {
//       return tx.exec("CREATE TABLE IF NOT EXISTS by_customer (customer TEXT, payment TEXT, amount INTEGER)");
//     }
//     troupe::Result<void> apply(troupe::SqliteTransaction& tx, const troupe::StreamEvent& e) { ... }
//   };
//
// Ownership: open() returns a shared handle; the projections that write
// into it and the code that reads it share it. Thread safety: every member
// is thread-safe. Writes (transact) are serialised on one connection; reads
// (query) use a second connection and see the last committed transaction.
//
// Group commit. The pages that projections sharing one model hand to
// transact while another page is being applied wait, and then go together
// in one transaction, a savepoint each: one wait for SQLite's write lock
// (shared with the journal's commits when the model is in its file) for
// all of them. A page that fails (its handler, or its offset moved) undoes
// its own savepoint only; a failure that ends the transaction (or its
// commit failing) fails every page of the group, which their projections
// then try again. The pages' handlers run on the thread of the projection
// that applies the group.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/result.hpp"
#include "troupe/persist/event_query.hpp"
#include "troupe/persist/read_model.hpp"

struct sqlite3;

namespace troupe {

struct SqliteReadModelOptions {
  std::string path;                 // created if missing
  int busy_timeout_ms = 10000;      // how long a write waits for SQLite's lock (the journal's commits)
  bool synchronous_full = false;    // PRAGMA synchronous = FULL (else NORMAL, as the journal's default)
};

// A transaction on the read model, given to a projection's handler. Valid
// only inside the call it is given to; used by that call's thread only.
class SqliteTransaction {
 public:
  // Runs one statement, binding `params` to ?1, ?2, ... Statements are
  // prepared once per read model and kept. Errors: journal_failed with
  // SQLite's message and the statement.
  Result<void> exec(std::string_view sql, std::initializer_list<SqlParam> params = {});
  // Runs a query in the transaction and returns its rows.
  Result<std::vector<SqlRow>> query(std::string_view sql, std::initializer_list<SqlParam> params = {});
  // Rows the last exec changed.
  std::int64_t changes() const;
  // The connection, for what exec and query do not cover. Do not commit or
  // roll back on it.
  sqlite3* handle() const noexcept;

  class Impl;
  explicit SqliteTransaction(Impl& impl) : impl_(impl) {}

 private:
  Impl& impl_;
};

class SqliteReadModel {
 public:
  using Transaction = SqliteTransaction;

  // Opens (creating) the file, in WAL mode, and the offsets table.
  // journal_failed when SQLite cannot.
  static Result<std::shared_ptr<SqliteReadModel>> open(SqliteReadModelOptions options);
  ~SqliteReadModel();
  SqliteReadModel(const SqliteReadModel&) = delete;
  SqliteReadModel& operator=(const SqliteReadModel&) = delete;

  // The stored offset of projection `key`; nullopt if it never stored one.
  Result<std::optional<JournalOffset>> load_offset(std::string_view key);
  // One transaction: checks that `key`'s stored offset is `from` (nullopt:
  // none stored), runs `body`, stores `to`, commits. journal_conflict when
  // the stored offset differs; `body`'s error, or an exception it throws
  // (journal_failed naming it), rolls everything back.
  Result<void> transact(std::string_view key, std::optional<JournalOffset> from, JournalOffset to,
                        const std::function<Result<void>(SqliteTransaction&)>& body);
  // A transaction that stores no offset (a handler's setup).
  Result<void> transact(const std::function<Result<void>(SqliteTransaction&)>& body);
  // A read on the reading connection.
  Result<std::vector<SqlRow>> query(std::string_view sql, std::initializer_list<SqlParam> params = {});
  const std::string& path() const noexcept;

  struct State;

 private:
  explicit SqliteReadModel(std::unique_ptr<State> s);
  std::unique_ptr<State> state_;
};

}  // namespace troupe
