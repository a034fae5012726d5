// The PostgreSQL journal's outbox (outbox.hpp): the table (created where it
// is missing, apart from the numbered schema), the statements, the records
// an append sends in its own transaction, claims (FOR UPDATE SKIP LOCKED, so
// dispatchers on several nodes never wait for each other's rows) and
// settlements, and reading their results. The writer lane runs claims and
// settlements in postgres_slow_path.cpp. Layout: doc/journal.md ("The
// outbox"); keep the two in step.

#include "pg_outbox.hpp"

#include <algorithm>
#include <string>
#include <utility>


namespace troupe::pg {

void Sql::outbox_sql(const std::string& s) {
  const std::string t = s + ".outbox";
  outbox_create =
      "CREATE TABLE IF NOT EXISTS " + t + " (id bigserial PRIMARY KEY, key bytea NOT NULL UNIQUE, "
      "kind bytea NOT NULL, payload bytea NOT NULL, persistence_id bytea NOT NULL, seq bigint NOT NULL, "
      "created_ms bigint NOT NULL, status bigint NOT NULL DEFAULT 0, attempts bigint NOT NULL DEFAULT 0, "
      "next_attempt_ms bigint NOT NULL DEFAULT 0, last_error bytea NOT NULL DEFAULT '', lease_owner bytea, "
      "lease_incarnation bigint NOT NULL DEFAULT 0, lease_until_ms bigint NOT NULL DEFAULT 0);"
      "CREATE INDEX IF NOT EXISTS outbox_due ON " + t + " (status, next_attempt_ms, id)";
  outbox_append = "INSERT INTO " + t + " (key, kind, payload, persistence_id, seq, created_ms) "
                  "SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[], $5::int8[], $6::int8[])";
  const std::string columns =
      "o.id, o.key, o.kind, o.payload, o.persistence_id, o.seq, o.created_ms, o.status, o.attempts, "
      "o.next_attempt_ms, o.last_error";
  // Due, and free: its lease ran out, or an earlier run of this owner held
  // it. SKIP LOCKED: rows another dispatcher is claiming right now are left
  // to it rather than waited for.
  outbox_claim = "WITH c AS (SELECT id FROM " + t + " WHERE status = 0 AND next_attempt_ms <= $3::int8 "
                 "AND (lease_until_ms <= $3::int8 OR (lease_owner = $1::bytea AND lease_incarnation <> $2::int8)) "
                 "ORDER BY id LIMIT $5::int8 FOR UPDATE SKIP LOCKED) "
                 "UPDATE " + t + " o SET lease_owner = $1::bytea, lease_incarnation = $2::int8, "
                 "lease_until_ms = $3::int8 + $4::int8, attempts = o.attempts + 1 FROM c WHERE o.id = c.id "
                 "RETURNING " + columns;
  outbox_settle_done = "DELETE FROM " + t + " WHERE key = $1::bytea AND lease_owner = $2::bytea "
                       "AND lease_incarnation = $3::int8";
  outbox_settle_update = "UPDATE " + t + " SET status = $4::int8, next_attempt_ms = $5::int8, "
                         "last_error = $6::bytea, lease_owner = NULL, lease_incarnation = 0, lease_until_ms = 0 "
                         "WHERE key = $1::bytea AND lease_owner = $2::bytea AND lease_incarnation = $3::int8";
  outbox_counts = "SELECT status, count(*)::int8 FROM " + t + " GROUP BY status";
  outbox_entries = "SELECT " + columns + " FROM " + t + " o WHERE o.status = $1::int8 ORDER BY o.id LIMIT $2::int8";
}

std::optional<Params> outbox_rows(const std::vector<const AppendBatch*>& batches) {
  std::size_t n = 0;
  for (const AppendBatch* b : batches) n += b->outbox.size();
  if (n == 0) return std::nullopt;
  ArrayParam keys(kByteaOid), kinds(kByteaOid), payloads(kByteaOid), ids(kByteaOid), seqs(kInt8Oid),
      created(kInt8Oid);
  for (ArrayParam* a : {&keys, &kinds, &payloads, &ids, &seqs, &created}) a->start(n);
  for (const AppendBatch* b : batches) {
    const EventRecord& last = b->events.back();
    for (const OutboxRecord& r : b->outbox) {
      keys.bytes(r.key);
      kinds.bytes(r.kind);
      payloads.bytes(r.payload);
      ids.bytes(b->persistence_id);
      seqs.int8(static_cast<std::int64_t>(last.seq));
      created.int8(last.timestamp_ms);
    }
  }
  Params p;
  for (ArrayParam* a : {&keys, &kinds, &payloads, &ids, &seqs, &created}) p.array(a->take(), a->array_type());
  return p;
}

Error outbox_conflict(const AppendBatch& batch) {
  return Error(ErrorCode::journal_conflict, "append to " + printable(batch.persistence_id) +
                                                " refused: one of its outbox keys is already stored");
}

namespace {

Error bad_row(const char* what) {
  return Error(ErrorCode::corrupt_record, std::string("postgres journal: corrupt outbox row: ") + what);
}

bool int8_at(const PGresult* r, int row, int col, std::int64_t& out) {
  if (PQgetisnull(r, row, col) != 0 || PQgetlength(r, row, col) != 8) return false;
  out = read_int8(PQgetvalue(r, row, col));
  return true;
}

std::string bytes_at(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col)));
}

}  // namespace

Result<OutboxView> parse_outbox_counts(const PGresult* r) {
  OutboxView v;
  for (int row = 0; row < PQntuples(r); ++row) {
    std::int64_t status = 0, n = 0;
    if (!int8_at(r, row, 0, status) || !int8_at(r, row, 1, n) || n < 0) return bad_row("a count is not a bigint");
    (status == 0 ? v.pending : v.failed) += static_cast<std::uint64_t>(n);
  }
  return v;
}

Result<std::vector<OutboxEntry>> parse_outbox_entries(const PGresult* r) {
  std::vector<std::pair<std::int64_t, OutboxEntry>> rows;
  for (int row = 0; row < PQntuples(r); ++row) {
    std::int64_t id = 0, seq = 0, created = 0, status = 0, attempts = 0, next = 0;
    if (!int8_at(r, row, 0, id) || !int8_at(r, row, 5, seq) || !int8_at(r, row, 6, created) ||
        !int8_at(r, row, 7, status) || !int8_at(r, row, 8, attempts) || !int8_at(r, row, 9, next))
      return bad_row("a number is not a bigint");
    for (int col : {1, 2, 3, 4, 10})
      if (PQgetisnull(r, row, col) != 0) return bad_row("a NULL where bytes belong");
    OutboxEntry e;
    e.record.key = bytes_at(r, row, 1);
    e.record.kind = bytes_at(r, row, 2);
    e.record.payload = bytes_at(r, row, 3);
    e.persistence_id = bytes_at(r, row, 4);
    e.seq = static_cast<std::uint64_t>(std::max<std::int64_t>(0, seq));
    e.created_ms = created;
    e.status = status == 0 ? OutboxStatus::pending : OutboxStatus::failed;
    e.attempts = static_cast<std::uint32_t>(std::clamp<std::int64_t>(attempts, 0, UINT32_MAX));
    e.next_attempt_ms = next;
    e.last_error = bytes_at(r, row, 10);
    rows.emplace_back(id, std::move(e));
  }
  // RETURNING gives no order: arrival order, as documented.
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<OutboxEntry> out;
  out.reserve(rows.size());
  for (auto& [id, e] : rows) out.push_back(std::move(e));
  return out;
}

}  // namespace troupe::pg
