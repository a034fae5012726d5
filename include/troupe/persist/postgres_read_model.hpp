#pragma once
// PostgresReadModel: a PostgreSQL schema a projection writes its read model
// into, with the projection's offset in the same transaction (exactly once;
// read_model.hpp). It may be the journal's own database and schema (the
// tables live beside the journal's) or any other.
//
//   auto model = troupe::PostgresReadModel::open({.conninfo = "...", .schema = "payments"}).value();
//   struct ByCustomer {
//     using ReadModel = troupe::PostgresReadModel;
//     troupe::Result<void> apply(troupe::PostgresTransaction& tx, const troupe::StreamEvent& e) {
//       return tx.exec("INSERT INTO by_customer VALUES ($1, $2)", {customer, id});
//     }
//   };
//
// Statements name their tables as they are; the connection's search_path
// starts with the schema, so unqualified names are the schema's.
//
// A projection's page commits without waiting for its WAL flush
// (synchronous_commit off for that transaction): a crash of the server may
// lose the last pages, and their offset with them, so they are applied
// again. Exactly once holds; the read model is rebuilt from the journal,
// whose own commits stay durable.
//
// Ownership: open() returns a shared handle; the projections that write
// into it and the code that reads it share it. Thread safety: every member
// is thread-safe. The projections' pages run on up to max_writers
// connections, one transaction on each at a time (the projections sharing
// the model commit side by side); transact(body) (the handlers' setups)
// runs one at a time in this process; reads (query) use one more
// connection. All reconnect after the server dropped them (the transaction
// in flight fails and its page is tried again). A page is one pipeline:
// BEGIN, the offset's move, the handler's statements and COMMIT go in one
// round trip (more only where the handler reads rows).

#include <cstddef>
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

struct pg_conn;

namespace troupe {

struct PostgresReadModelOptions {
  std::string conninfo;            // libpq connection string
  std::string schema = "public";   // created if missing
  std::size_t max_writers = 4;     // write connections (>= 1), made as transactions need them
};

// A transaction on the read model, given to a projection's handler. Valid
// only inside the call it is given to; used by that call's thread only.
class PostgresTransaction {
 public:
  // Runs one statement, binding `params` to $1, $2, ... (as text; integers
  // and reals in their decimal form). Errors: journal_failed with the
  // server's message and SQLSTATE.
  Result<void> exec(std::string_view sql, std::initializer_list<SqlParam> params = {});
  // Runs a query in the transaction and returns its rows (integers as
  // integers, reals as reals, everything else as text).
  Result<std::vector<SqlRow>> query(std::string_view sql, std::initializer_list<SqlParam> params = {});
  // Rows the last exec changed; -1 in a projection's page, whose
  // statements go as one pipeline and are answered when it commits (an
  // error of one of them then fails the page).
  std::int64_t changes() const;
  // The connection, for what exec and query do not cover. Do not commit or
  // roll back on it.
  pg_conn* handle() const noexcept;

  class Impl;
  explicit PostgresTransaction(Impl& impl) : impl_(impl) {}

 private:
  Impl& impl_;
};

class PostgresReadModel {
 public:
  using Transaction = PostgresTransaction;

  // Connects twice, creates the schema and the offsets table if missing.
  // invalid_argument for an empty conninfo or schema; journal_failed when
  // the server refuses.
  static Result<std::shared_ptr<PostgresReadModel>> open(PostgresReadModelOptions options);
  ~PostgresReadModel();
  PostgresReadModel(const PostgresReadModel&) = delete;
  PostgresReadModel& operator=(const PostgresReadModel&) = delete;

  // As SqliteReadModel's (sqlite_read_model.hpp).
  Result<std::optional<JournalOffset>> load_offset(std::string_view key);
  Result<void> transact(std::string_view key, std::optional<JournalOffset> from, JournalOffset to,
                        const std::function<Result<void>(PostgresTransaction&)>& body);
  Result<void> transact(const std::function<Result<void>(PostgresTransaction&)>& body);
  Result<std::vector<SqlRow>> query(std::string_view sql, std::initializer_list<SqlParam> params = {});
  const std::string& schema() const noexcept;

  struct State;

 private:
  explicit PostgresReadModel(std::unique_ptr<State> s);
  std::unique_ptr<State> state_;
};

}  // namespace troupe
