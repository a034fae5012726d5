// The SQLite journal's outbox (outbox.hpp): the table, created on open where
// it is missing; an append's records, inserted in the append's savepoint so
// they are stored with its events or not at all; claims and settlements on
// the writer lane; and the readers' view. The layout is documented in
// doc/journal.md ("The outbox"); keep the two in step.

#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../outbox_support.hpp"
#include "sqlite_reader.hpp"
#include "sqlite_support.hpp"
#include "sqlite_writer.hpp"

namespace troupe::sqlite {
namespace {

// A rowid table: the rowid is the records' arrival order, which claims
// follow. Not part of the numbered schema: a file without the table gets
// it on open, and an older build ignores it.
constexpr const char* kCreateOutbox = R"sql(
CREATE TABLE IF NOT EXISTS outbox (
  key               TEXT    NOT NULL PRIMARY KEY,
  kind              TEXT    NOT NULL,
  payload           BLOB,
  persistence_id    TEXT    NOT NULL,
  seq               INTEGER NOT NULL,
  created_ms        INTEGER NOT NULL,
  status            INTEGER NOT NULL DEFAULT 0,
  attempts          INTEGER NOT NULL DEFAULT 0,
  next_attempt_ms   INTEGER NOT NULL DEFAULT 0,
  last_error        TEXT    NOT NULL DEFAULT '',
  lease_owner       TEXT,
  lease_incarnation INTEGER NOT NULL DEFAULT 0,
  lease_until_ms    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (status, next_attempt_ms);
)sql";

constexpr const char* kInsertOutbox =
    "INSERT INTO outbox (key, kind, payload, persistence_id, seq, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
// Due, and free: its lease ran out, or an earlier run of this owner held it.
constexpr const char* kClaimOutbox =
    "UPDATE outbox SET lease_owner = ?1, lease_incarnation = ?2, lease_until_ms = ?3 + ?4, attempts = attempts + 1 "
    "WHERE rowid IN (SELECT rowid FROM outbox WHERE status = 0 AND next_attempt_ms <= ?3 "
    "AND (lease_until_ms <= ?3 OR (lease_owner = ?1 AND lease_incarnation <> ?2)) ORDER BY rowid LIMIT ?5) "
    "RETURNING rowid, key, kind, payload, persistence_id, seq, created_ms, status, attempts, next_attempt_ms, "
    "last_error";
constexpr const char* kSettleDone =
    "DELETE FROM outbox WHERE key = ?1 AND lease_owner = ?2 AND lease_incarnation = ?3";
constexpr const char* kSettleUpdate =
    "UPDATE outbox SET status = ?4, next_attempt_ms = ?5, last_error = ?6, lease_owner = NULL, "
    "lease_incarnation = 0, lease_until_ms = 0 WHERE key = ?1 AND lease_owner = ?2 AND lease_incarnation = ?3";
constexpr const char* kOutboxCounts = "SELECT status, count(*) FROM outbox GROUP BY status";
constexpr const char* kOutboxEntries =
    "SELECT rowid, key, kind, payload, persistence_id, seq, created_ms, status, attempts, next_attempt_ms, "
    "last_error FROM outbox WHERE status = ?1 ORDER BY rowid LIMIT ?2";

std::string text(sqlite3_stmt* s, int col) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, col));
  return std::string(p != nullptr ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(s, col)));
}

std::string blob(sqlite3_stmt* s, int col) {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(s, col));
  return std::string(p != nullptr ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(s, col)));
}

// The entry of the current row of kClaimOutbox or kOutboxEntries (column 0
// is the rowid, which the caller sorts by).
OutboxEntry read_entry(sqlite3_stmt* s) {
  OutboxEntry e;
  e.record.key = text(s, 1);
  e.record.kind = text(s, 2);
  e.record.payload = blob(s, 3);
  e.persistence_id = text(s, 4);
  e.seq = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 5)));
  e.created_ms = sqlite3_column_int64(s, 6);
  e.status = sqlite3_column_int64(s, 7) == 0 ? OutboxStatus::pending : OutboxStatus::failed;
  e.attempts = static_cast<std::uint32_t>(std::clamp<sqlite3_int64>(sqlite3_column_int64(s, 8), 0, UINT32_MAX));
  e.next_attempt_ms = sqlite3_column_int64(s, 9);
  e.last_error = text(s, 10);
  return e;
}

}  // namespace

Result<void> ensure_outbox(sqlite3* db, const std::string& path) {
  return exec(db, path, kCreateOutbox, "create the outbox table");
}

Result<void> Writer::prepare_outbox() {
  return prepare_all(db_.get(), options_.path,
                     {{&insert_outbox_, kInsertOutbox},
                      {&claim_outbox_, kClaimOutbox},
                      {&settle_done_, kSettleDone},
                      {&settle_update_, kSettleUpdate}});
}

Result<void> Writer::insert_outbox(const AppendBatch& batch) {
  sqlite3_stmt* s = insert_outbox_.get();
  const EventRecord& last = batch.events.back();
  for (const OutboxRecord& r : batch.outbox) {
    ResetOnExit reset(s);
    int rc = bind_text(s, 1, r.key);
    if (rc == SQLITE_OK) rc = bind_text(s, 2, r.kind);
    if (rc == SQLITE_OK) rc = bind_blob(s, 3, r.payload);
    if (rc == SQLITE_OK) rc = bind_text(s, 4, batch.persistence_id);
    if (rc == SQLITE_OK) rc = bind_seq(s, 5, last.seq);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 6, last.timestamp_ms);
    if (rc == SQLITE_OK) rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) {
      const int ext = sqlite3_extended_errcode(db_.get());
      if (ext == SQLITE_CONSTRAINT_PRIMARYKEY || ext == SQLITE_CONSTRAINT_UNIQUE)
        return detail::outbox_key_taken(batch.persistence_id, r.key);
      return fail("store the outbox record " + quoted(r.key) + " of " + quoted(batch.persistence_id));
    }
  }
  return {};
}

Result<void> Writer::do_outbox(detail::OutboxWrite& op) {
  if (op.claim) {
    const OutboxClaim& c = *op.claim;
    sqlite3_stmt* s = claim_outbox_.get();
    ResetOnExit reset(s);
    int rc = bind_text(s, 1, c.owner);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 2, static_cast<sqlite3_int64>(c.incarnation));
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, c.now_ms);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 4, c.lease_ms);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 5, static_cast<sqlite3_int64>(c.limit));
    if (rc != SQLITE_OK) return fail("bind an outbox claim");
    std::vector<std::pair<sqlite3_int64, OutboxEntry>> rows;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) rows.emplace_back(sqlite3_column_int64(s, 0), read_entry(s));
    if (rc != SQLITE_DONE) return fail("claim outbox records");
    // RETURNING gives no order: arrival order, as documented.
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    op.claimed.clear();
    for (auto& [rowid, e] : rows) op.claimed.push_back(std::move(e));
    return {};
  }
  const OutboxSettlement& st = *op.settlement;
  const bool done = st.outcome == OutboxSettlement::Outcome::done;
  sqlite3_stmt* s = done ? settle_done_.get() : settle_update_.get();
  ResetOnExit reset(s);
  int rc = bind_text(s, 1, st.key);
  if (rc == SQLITE_OK) rc = bind_text(s, 2, st.owner);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, static_cast<sqlite3_int64>(st.incarnation));
  if (!done) {
    const bool retry = st.outcome == OutboxSettlement::Outcome::retry;
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 4, retry ? 0 : 1);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 5, retry ? st.next_attempt_ms : 0);
    if (rc == SQLITE_OK) rc = bind_text(s, 6, st.error);
  }
  if (rc == SQLITE_OK) rc = sqlite3_step(s);
  if (rc != SQLITE_DONE) return fail("settle the outbox record " + quoted(st.key));
  return {};
}

Result<OutboxView> Reader::read_outbox(const OutboxQuery& q) {
  const std::string& path = options_.path;
  if (!outbox_counts_.get())
    if (auto r = prepare_all(db_.get(), path, {{&outbox_counts_, kOutboxCounts}, {&outbox_entries_, kOutboxEntries}});
        !r)
      return std::move(r).error();
  if (auto r = begin(); !r) return std::move(r).error();
  OutboxView v;
  Result<void> r = [&]() -> Result<void> {
    {
      sqlite3_stmt* s = outbox_counts_.get();
      ResetOnExit reset(s);
      int rc;
      while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const auto n = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 1)));
        (sqlite3_column_int64(s, 0) == 0 ? v.pending : v.failed) += n;
      }
      if (rc != SQLITE_DONE) return failed(path, "count the outbox", db_.get());
    }
    if (q.limit == 0) return {};
    sqlite3_stmt* s = outbox_entries_.get();
    ResetOnExit reset(s);
    if (sqlite3_bind_int64(s, 1, q.status == OutboxStatus::pending ? 0 : 1) != SQLITE_OK ||
        sqlite3_bind_int64(s, 2, static_cast<sqlite3_int64>(std::min<std::size_t>(q.limit, INT64_MAX))) != SQLITE_OK)
      return failed(path, "bind an outbox read", db_.get());
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) v.entries.push_back(read_entry(s));
    if (rc != SQLITE_DONE) return failed(path, "list the outbox", db_.get());
    return {};
  }();
  if (!r) {
    abort();
    return std::move(r).error();
  }
  if (auto e = end(); !e) return std::move(e).error();
  return v;
}

}  // namespace troupe::sqlite
