#pragma once
// What the PostgreSQL journal's writer lanes and readers share: libpq
// handles, binary parameters (scalars and one-dimensional arrays), running
// a statement or a pipeline of prepared statements, reading stored records,
// and the SQL itself. Internal to src/persist/postgres; the layout and the
// statements are documented in doc/journal.md ("PostgreSQL").

#include <libpq-fe.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe::pg {

// The layout the statements below use; stored in <schema>.journal_schema.
// A higher number was written by a newer troupe: refuse it rather than
// misread it. Version 1 had no fences, version 2 no global order; open()
// migrates both.
constexpr std::int64_t kSchemaVersion = 3;
// Bound on a writer lane's highest-seq cache; past it the cache starts over.
constexpr std::size_t kMaxCachedHighest = std::size_t{1} << 20;
constexpr std::uint64_t kMaxSeq = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
// SQLSTATE check_fences raises when a stored fence is above the writer's.
constexpr const char* kFenceRefused = "TR001";
constexpr const char* kUniqueViolation = "23505";
// Type OIDs (pg_type.h is a server header).
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kByteaArrayOid = 1001;
constexpr Oid kInt8ArrayOid = 1016;
constexpr Oid kTextOid = 25;
constexpr Oid kXid8Oid = 5069;

struct ResultDeleter {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultDeleter>;
struct ConnDeleter {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
using PgConn = std::unique_ptr<PGconn, ConnDeleter>;

// Printable form of an id that may hold any byte.
std::string printable(std::string_view s);
std::string trim(std::string s);
std::int64_t read_int8(const char* p);
// The advisory lock key of a fence: a stable 64-bit hash of schema and key.
std::int64_t fence_lock(const std::string& schema, const std::string& key);

// Parameters of one statement, all sent in binary. bytes() keeps a pointer
// to the caller's string, which must outlive the statement's run: a
// temporary would be gone by then, so it does not compile.
class Params {
 public:
  void bytes(const std::string& s) { add(s.data(), s.size(), kByteaOid); }
  void bytes(std::string&&) = delete;
  void int8(std::int64_t v) { eight(static_cast<std::uint64_t>(v), kInt8Oid); }
  // A transaction id (xid8): eight bytes, unsigned.
  void xid8(std::uint64_t v) { eight(v, kXid8Oid); }
  // A one-dimensional array parameter built with ArrayParam; kept here.
  void array(std::string encoded, Oid array_type) {
    arrays_.push_back(std::make_unique<std::string>(std::move(encoded)));
    add(arrays_.back()->data(), arrays_.back()->size(), array_type);
  }
  int size() const { return static_cast<int>(values_.size()); }
  const char* const* values() const { return values_.data(); }
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }
  const Oid* types() const { return types_.data(); }

 private:
  void add(const char* p, std::size_t n, Oid t);
  void eight(std::uint64_t v, Oid t);
  std::vector<std::unique_ptr<char[]>> ints_;
  std::vector<std::unique_ptr<std::string>> arrays_;
  std::vector<const char*> values_;
  std::vector<int> lengths_, formats_;
  std::vector<Oid> types_;
};

// A one-dimensional array in PostgreSQL's binary array format: ndim,
// has-nulls flag, element type, length, lower bound, then each element as
// its length and bytes. start(n) then exactly n elements.
class ArrayParam {
 public:
  explicit ArrayParam(Oid element) : element_(element) {}
  void start(std::size_t n);
  void bytes(const std::string& s);
  void int8(std::int64_t v);
  // Moves the encoded array out (for Params::array).
  std::string take() { return std::move(buf_); }
  Oid array_type() const { return element_ == kByteaOid ? kByteaArrayOid : kInt8ArrayOid; }

 private:
  Oid element_;
  std::string buf_;
};

// The outcome of one statement (or of a pipeline: its first failure).
struct Outcome {
  PgResult res;
  bool ok = false;
  bool lost = false;     // the connection is gone
  std::string sqlstate;  // on failure, when the server sent one
  std::string message;
  std::string detail;
};

Outcome run(PGconn* c, const std::string& sql, const Params* p = nullptr);
Outcome run_prepared(PGconn* c, const char* name, const Params& p);

// One statement of a pipeline: a prepared statement and its parameters.
struct Call {
  const char* name;
  Params params;
};
// Sends `calls` in pipeline mode followed by one Sync, so they run in one
// implicit transaction and one round trip, then reads every result. ok when
// all succeeded (the transaction committed); otherwise the first failure
// (the transaction rolled back), or lost when the connection broke — then
// the outcome of the transaction is not known.
Outcome run_pipeline(PGconn* c, const std::vector<Call>& calls);
// Sends `calls` in pipeline mode, each followed by a Sync of its own (so
// each runs in its own implicit transaction and one failing aborts none of
// the others), all in one round trip, and returns one Outcome per call, in
// order, each holding its result. If the connection breaks, the calls not
// yet answered get lost outcomes.
std::vector<Outcome> run_each(PGconn* c, const std::vector<Call>& calls);

Error failed(std::string_view doing, const Outcome& o);

// Reads the five record columns (seq, timestamp_ms, type, version, payload)
// starting at column `first` of `row`, checking types, nulls and ranges:
// anything this journal would not have written is corrupt_record.
template <class Record>
Result<void> read_record(const PGresult* r, int row, int first, const std::string& id, const char* what,
                         std::int64_t min_seq, Record& out);

// The readers' results as the journal's values, each checked row by row as
// read_record does (a row this journal would not have written is
// corrupt_record; a result of the wrong shape is journal_failed). `r` is the
// result of the statement of that name (Sql below); pure functions of it.
// recover: an optional kind-0 snapshot row, the kind-1 row with the highest
// seq and the deletion mark, then kind-2 events without a hole.
Result<Recovery> parse_recovery(const PGresult* r, const std::string& id);
// replay: the kind-1 row, then the events from `from` (at least 1) to `to`.
Result<std::vector<EventRecord>> parse_replay(const PGresult* r, const std::string& id, std::uint64_t from,
                                              std::uint64_t to);
// highest: max(seq) and the deletion mark, either NULL.
Result<std::uint64_t> parse_highest(const PGresult* r, const std::string& id);
// snapshot: no row, or the five record columns.
Result<std::optional<SnapshotRecord>> parse_snapshot(const PGresult* r, const std::string& id);
// highest_fence: one bigint.
Result<std::uint64_t> parse_highest_fence(const PGresult* r);
// query_type / query_tag (pg_query.cpp): tx, ordering, persistence_id, the
// five record columns, trace_id, tags; `behind`: committed events wait
// behind the visibility horizon (the marker row).
Result<EventPage> parse_page(const PGresult* r, bool& behind);
// An event's tags as stored (pg_query.cpp): one bytea, the tags joined by
// '\n' (a tag holds no control character), NULL for none.
std::string join_tags(const std::vector<std::string>& tags);
// Reads the tags column `col` of `row` into e.tags (a NULL is none);
// corrupt_record for what join_tags would not have written.
Result<void> read_tags(const PGresult* r, int row, int col, const std::string& id, EventRecord& e);

// The SQL, with the schema's quoted name filled in, and the names the
// statements are prepared under.
struct Sql {
  explicit Sql(const std::string& quoted_schema);

  std::string create, migrate_from_1, lock, version_table_exists, read_version;
  // Schema 2 to 3 (pg_query.cpp): the global order and the tags.
  std::string migrate_from_2;
  // The events' trace_id column (SPEC X4): whether it is there, and adding it.
  std::string has_trace_column, add_trace_column;
  // Writer lanes (prepared on every writer connection).
  std::string append, check_fences, insert_snapshots, prune_snapshots, delete_to, highest_many, verify;
  std::string raise_fence, bump_fence;
  // Readers (prepared on every reader connection).
  std::string recover, replay, highest, snapshot, highest_fence;

  static constexpr const char* kAppend = "troupe_append";
  // The global order (pg_query.cpp): appends of events with tags (a writer
  // uses kAppend when none of a group's events has one) and the readers'
  // queries by entity type and by tag.
  std::string append_tagged, query_type, query_tag;
  static constexpr const char* kAppendTagged = "troupe_append_tagged";
  static constexpr const char* kQueryType = "troupe_query_type";
  static constexpr const char* kQueryTag = "troupe_query_tag";
  static constexpr const char* kCheckFences = "troupe_check_fences";
  static constexpr const char* kInsertSnapshots = "troupe_insert_snapshots";
  static constexpr const char* kPruneSnapshots = "troupe_prune_snapshots";
  static constexpr const char* kDeleteTo = "troupe_delete_to";
  static constexpr const char* kHighestMany = "troupe_highest_many";
  static constexpr const char* kVerify = "troupe_verify";
  static constexpr const char* kRecover = "troupe_recover";
  static constexpr const char* kReplay = "troupe_replay";
  static constexpr const char* kHighest = "troupe_highest";
  static constexpr const char* kSnapshot = "troupe_snapshot";
  static constexpr const char* kHighestFence = "troupe_highest_fence";

  // The outbox (pg_outbox.cpp): its table, created where missing, apart
  // from the numbered schema; the writers' and readers' statements.
  std::string outbox_create, outbox_append, outbox_claim, outbox_settle_done, outbox_settle_update, outbox_counts,
      outbox_entries;
  static constexpr const char* kOutboxAppend = "troupe_outbox_append";
  static constexpr const char* kOutboxClaim = "troupe_outbox_claim";
  static constexpr const char* kOutboxSettleDone = "troupe_outbox_settle_done";
  static constexpr const char* kOutboxSettleUpdate = "troupe_outbox_settle_update";
  static constexpr const char* kOutboxCounts = "troupe_outbox_counts";
  static constexpr const char* kOutboxEntries = "troupe_outbox_entries";

  struct Prepared {
    const char* name;
    const std::string* sql;
  };
  std::vector<Prepared> writer_statements() const;
  std::vector<Prepared> reader_statements() const;

 private:
  void outbox_sql(const std::string& quoted_schema);
  void query_sql(const std::string& quoted_schema);
};

// Prepares `statements` on `c`.
Result<void> prepare_all(PGconn* c, const std::vector<Sql::Prepared>& statements);

}  // namespace troupe::pg
