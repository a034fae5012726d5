#include "pg_support.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

namespace troupe::pg {

std::string printable(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::int64_t read_int8(const char* p) {
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(p[i]);
  return static_cast<std::int64_t>(u);
}

std::int64_t fence_lock(const std::string& schema, const std::string& key) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64
  auto mix = [&](std::string_view s) {
    for (char c : s) {
      h ^= static_cast<std::uint8_t>(c);
      h *= 1099511628211ull;
    }
  };
  mix(schema);
  mix(std::string_view("\0", 1));
  mix(key);
  return static_cast<std::int64_t>(h);
}

namespace {
void put_int32(std::string& b, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<char>((v >> shift) & 0xff));
}
void put_int64(char* out, std::uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}
}  // namespace

void Params::eight(std::uint64_t v, Oid t) {
  ints_.push_back(std::make_unique<char[]>(8));
  put_int64(ints_.back().get(), v);
  add(ints_.back().get(), 8, t);
}

void Params::add(const char* p, std::size_t n, Oid t) {
  values_.push_back(p);
  lengths_.push_back(static_cast<int>(n));
  formats_.push_back(1);
  types_.push_back(t);
}

void ArrayParam::start(std::size_t n) {
  buf_.clear();
  put_int32(buf_, 1);  // dimensions
  put_int32(buf_, 0);  // no NULLs
  put_int32(buf_, element_);
  put_int32(buf_, static_cast<std::uint32_t>(n));
  put_int32(buf_, 1);  // lower bound
}

void ArrayParam::bytes(const std::string& s) {
  put_int32(buf_, static_cast<std::uint32_t>(s.size()));
  buf_ += s;
}

void ArrayParam::int8(std::int64_t v) {
  put_int32(buf_, 8);
  char b[8];
  put_int64(b, static_cast<std::uint64_t>(v));
  buf_.append(b, 8);
}

namespace {
void fill_failure(PGconn* c, PGresult* r, Outcome& o) {
  if (r != nullptr) {
    if (const char* s = PQresultErrorField(r, PG_DIAG_SQLSTATE); s != nullptr) o.sqlstate = s;
    if (const char* d = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL); d != nullptr) o.detail = d;
    o.message = trim(PQresultErrorMessage(r));
  }
  if (o.message.empty()) o.message = trim(PQerrorMessage(c));
  o.lost = PQstatus(c) == CONNECTION_BAD;
  if (o.message.empty()) o.message = "no result from the server";
}

Outcome finish(PGconn* c, PGresult* r) {
  Outcome o;
  o.res.reset(r);
  ExecStatusType st = r != nullptr ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  o.ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!o.ok) fill_failure(c, r, o);
  return o;
}
}  // namespace

Outcome run(PGconn* c, const std::string& sql, const Params* p) {
  PGresult* r = p == nullptr ? PQexecParams(c, sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 1)
                             : PQexecParams(c, sql.c_str(), p->size(), p->types(), p->values(), p->lengths(),
                                            p->formats(), 1);
  return finish(c, r);
}

Outcome run_prepared(PGconn* c, const char* name, const Params& p) {
  return finish(c, PQexecPrepared(c, name, p.size(), p.values(), p.lengths(), p.formats(), 1));
}

Outcome run_pipeline(PGconn* c, const std::vector<Call>& calls) {
  Outcome out;
  auto broken = [&](const char* doing) {
    out.ok = false;
    out.lost = PQstatus(c) == CONNECTION_BAD;
    out.message = std::string(doing) + ": " + trim(PQerrorMessage(c));
    return std::move(out);
  };
  if (PQenterPipelineMode(c) != 1) return broken("enter pipeline mode");
  for (const Call& call : calls) {
    if (PQsendQueryPrepared(c, call.name, call.params.size(), call.params.values(), call.params.lengths(),
                            call.params.formats(), 1) != 1) {
      Outcome o = broken("send a statement");
      o.lost = true;  // half a pipeline on the wire: the caller drops the connection
      return o;
    }
  }
  if (PQpipelineSync(c) != 1) {
    Outcome o = broken("send the pipeline");
    o.lost = true;
    return o;
  }
  // Every statement's results, each ended by a NULL, then the Sync's.
  out.ok = true;
  for (;;) {
    PGresult* r = PQgetResult(c);
    if (r == nullptr) {
      if (PQstatus(c) == CONNECTION_BAD) {
        out.ok = false;
        out.lost = true;
        if (out.message.empty()) out.message = trim(PQerrorMessage(c));
        return out;
      }
      continue;
    }
    PgResult owned(r);
    const ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_PIPELINE_SYNC) break;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_PIPELINE_ABORTED) continue;
    if (out.ok) {  // the first failure is the one that counts
      out.ok = false;
      fill_failure(c, r, out);
    }
    if (PQstatus(c) == CONNECTION_BAD) {
      out.lost = true;
      return out;
    }
  }
  if (PQexitPipelineMode(c) != 1) {
    out.ok = false;
    out.lost = true;
    out.message = "leave pipeline mode: " + trim(PQerrorMessage(c));
  }
  return out;
}

std::vector<Outcome> run_each(PGconn* c, const std::vector<Call>& calls) {
  std::vector<Outcome> out(calls.size());
  // Calls from `i` on get no answer: the connection is gone, or in a state
  // only dropping it clears.
  auto lost_from = [&](std::size_t i, const char* doing) {
    const std::string message = std::string(doing) + ": " + trim(PQerrorMessage(c));
    for (; i < out.size(); ++i) {
      out[i] = Outcome();
      out[i].lost = true;
      out[i].message = message;
    }
    return std::move(out);
  };
  if (PQenterPipelineMode(c) != 1) return lost_from(0, "enter pipeline mode");
  for (const Call& call : calls) {
    if (PQsendQueryPrepared(c, call.name, call.params.size(), call.params.values(), call.params.lengths(),
                            call.params.formats(), 1) != 1 ||
        PQpipelineSync(c) != 1)
      return lost_from(0, "send a statement");
  }
  // Each call's result, then a NULL, then its Sync's.
  for (std::size_t i = 0; i < calls.size(); ++i) {
    bool answered = false;
    for (;;) {
      PGresult* r = PQgetResult(c);
      if (r == nullptr) {
        if (PQstatus(c) == CONNECTION_BAD) return lost_from(i, "read a result");
        continue;
      }
      if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
        PQclear(r);
        break;
      }
      if (answered) {
        PQclear(r);
        continue;
      }
      out[i] = finish(c, r);
      answered = true;
    }
    if (!answered) {
      out[i].message = "no result from the server";
    }
  }
  if (PQexitPipelineMode(c) != 1) return lost_from(0, "leave pipeline mode");
  return out;
}

Error failed(std::string_view doing, const Outcome& o) {
  return Error(ErrorCode::journal_failed, "postgres journal: " + std::string(doing) + ": " + o.message +
                                              (o.sqlstate.empty() ? "" : " (SQLSTATE " + o.sqlstate + ")"));
}

template <class Record>
Result<void> read_record(const PGresult* r, int row, int first, const std::string& id, const char* what,
                         std::int64_t min_seq, Record& out) {
  auto corrupt = [&](const std::string& seq_text, const std::string& why) {
    return Error(ErrorCode::corrupt_record, "postgres journal: corrupt " + std::string(what) +
                                                " of persistence id " + printable(id) + " seq " + seq_text +
                                                ": " + why);
  };
  static const char* names[] = {"seq", "timestamp_ms", "type", "version", "payload"};
  static const Oid types[] = {kInt8Oid, kInt8Oid, kByteaOid, kInt8Oid, kByteaOid};
  std::string seq_text = "?";
  for (int i = 0; i < 5; ++i) {
    const int col = first + i;
    if (PQftype(r, col) != types[i])
      return corrupt(seq_text, std::string(names[i]) + " has type oid " + std::to_string(PQftype(r, col)));
    if (PQgetisnull(r, row, col) != 0)
      return corrupt(seq_text, std::string(names[i]) + " is NULL, expected " +
                                   (types[i] == kInt8Oid ? "bigint" : "bytea"));
    if (types[i] == kInt8Oid && PQgetlength(r, row, col) != 8)
      return corrupt(seq_text, std::string(names[i]) + " is not an 8-byte bigint");
    if (i == 0) {
      std::int64_t seq = read_int8(PQgetvalue(r, row, col));
      seq_text = std::to_string(seq);
      if (seq < min_seq) return corrupt(seq_text, "seq is below " + std::to_string(min_seq));
    }
  }
  std::int64_t version = read_int8(PQgetvalue(r, row, first + 3));
  if (version < 0 || version > std::int64_t{std::numeric_limits<std::uint32_t>::max()})
    return corrupt(seq_text, "version " + std::to_string(version) + " is outside 0.." +
                                 std::to_string(std::numeric_limits<std::uint32_t>::max()));
  out.seq = static_cast<std::uint64_t>(read_int8(PQgetvalue(r, row, first)));
  out.timestamp_ms = read_int8(PQgetvalue(r, row, first + 1));
  out.type.assign(PQgetvalue(r, row, first + 2), static_cast<std::size_t>(PQgetlength(r, row, first + 2)));
  out.version = static_cast<std::uint32_t>(version);
  out.payload.assign(PQgetvalue(r, row, first + 4), static_cast<std::size_t>(PQgetlength(r, row, first + 4)));
  return {};
}

template Result<void> read_record<EventRecord>(const PGresult*, int, int, const std::string&, const char*,
                                               std::int64_t, EventRecord&);
template Result<void> read_record<SnapshotRecord>(const PGresult*, int, int, const std::string&, const char*,
                                                  std::int64_t, SnapshotRecord&);

// --- reading the readers' results --------------------------------------------------

namespace {
// The kind of a recover/replay row (column 0) and the two numbers of the
// kind-1 row: the highest stored seq (column 1) and the deletion mark
// (column 4).
std::int64_t row_kind(const PGresult* r, int row) {
  if (PQgetisnull(r, row, 0) != 0 || PQgetlength(r, row, 0) != 8) return -1;
  return read_int8(PQgetvalue(r, row, 0));
}

Result<std::uint64_t> mark(const PGresult* r, int row, int col, const std::string& id, const char* what) {
  if (PQgetisnull(r, row, col) != 0 || PQgetlength(r, row, col) != 8)
    return Error(ErrorCode::corrupt_record, "postgres journal: corrupt record of persistence id " + printable(id) +
                                                " seq ?: " + what + " is not a bigint");
  std::int64_t v = read_int8(PQgetvalue(r, row, col));
  if (v < 0)
    return Error(ErrorCode::corrupt_record, "postgres journal: corrupt record of persistence id " + printable(id) +
                                                " seq ?: " + what + " is " + std::to_string(v) +
                                                ", expected a non-negative bigint");
  return static_cast<std::uint64_t>(v);
}

// Where recover and replay rows hold an event's trace id (text or NULL).
constexpr int kTraceColumn = 6;

// Reads kind-2 event rows from `first_row` on, checking that they run on
// without a hole after the deletion mark.
Result<void> read_events(const PGresult* r, int first_row, const std::string& id, std::uint64_t from,
                         std::uint64_t deleted_to, std::vector<EventRecord>& out) {
  // Rows must run on without a hole from here: below deleted_to they were
  // deleted on purpose; anything else missing was lost.
  std::uint64_t expected = std::max(from, deleted_to + 1);
  const int rows = PQntuples(r);
  for (int row = first_row; row < rows; ++row) {
    EventRecord e;
    if (auto ok = read_record(r, row, 1, id, "event", 1, e); !ok) return ok;
    if (PQgetisnull(r, row, kTraceColumn) == 0) {
      if (PQftype(r, kTraceColumn) != kTextOid)
        return Error(ErrorCode::corrupt_record, "postgres journal: corrupt event of persistence id " + printable(id) +
                                                    " seq " + std::to_string(e.seq) + ": trace_id has type oid " +
                                                    std::to_string(PQftype(r, kTraceColumn)));
      e.trace_id.assign(PQgetvalue(r, row, kTraceColumn), static_cast<std::size_t>(PQgetlength(r, row, kTraceColumn)));
    }
    if (auto t = read_tags(r, row, kTraceColumn + 1, id, e); !t) return t;
    if (row == first_row && e.seq < expected) expected = e.seq;  // leftovers at or below the deletion mark
    if (e.seq != expected)
      return Error(ErrorCode::corrupt_record,
                   "postgres journal: corrupt event log of persistence id " + printable(id) + " seq " +
                       std::to_string(expected) + ": missing (the next stored event is " + std::to_string(e.seq) +
                       ", and events were deleted only up to " + std::to_string(deleted_to) + ")");
    ++expected;
    out.push_back(std::move(e));
  }
  return {};
}
}  // namespace

Result<Recovery> parse_recovery(const PGresult* r, const std::string& id) {
  Recovery rec;
  int row = 0;
  if (PQntuples(r) > 0 && row_kind(r, 0) == 0) {
    SnapshotRecord snap;
    if (auto ok = read_record(r, 0, 1, id, "snapshot", 0, snap); !ok) return std::move(ok).error();
    rec.snapshot = std::move(snap);
    row = 1;
  }
  if (row >= PQntuples(r) || row_kind(r, row) != 1)
    return Error(ErrorCode::journal_failed, "postgres journal: recover " + printable(id) + ": unexpected result");
  auto max_seq = mark(r, row, 1, id, "max(seq) of its events");
  if (!max_seq) return std::move(max_seq).error();
  auto deleted_to = mark(r, row, 4, id, "its deleted_to mark");
  if (!deleted_to) return std::move(deleted_to).error();
  rec.highest_seq = std::max(*max_seq, *deleted_to);
  const std::uint64_t from = rec.snapshot ? rec.snapshot->seq + 1 : 1;
  if (auto e = read_events(r, row + 1, id, from, *deleted_to, rec.events); !e) return std::move(e).error();
  return rec;
}

Result<std::vector<EventRecord>> parse_replay(const PGresult* r, const std::string& id, std::uint64_t from,
                                              std::uint64_t to) {
  if (PQntuples(r) < 1 || row_kind(r, 0) != 1)
    return Error(ErrorCode::journal_failed, "postgres journal: replay " + printable(id) + ": unexpected result");
  auto deleted_to = mark(r, 0, 4, id, "its deleted_to mark");
  if (!deleted_to) return std::move(deleted_to).error();
  std::vector<EventRecord> events;
  if (from > to) return events;
  if (auto e = read_events(r, 1, id, from, *deleted_to, events); !e) return std::move(e).error();
  return events;
}

Result<std::uint64_t> parse_highest(const PGresult* r, const std::string& id) {
  std::uint64_t h = 0;
  const char* names[] = {"max(seq) of its events", "its deleted_to mark"};
  for (int col = 0; col < 2; ++col) {
    if (PQgetisnull(r, 0, col) != 0) continue;
    auto v = mark(r, 0, col, id, names[col]);
    if (!v) return std::move(v).error();
    h = std::max(h, *v);
  }
  return h;
}

Result<std::optional<SnapshotRecord>> parse_snapshot(const PGresult* r, const std::string& id) {
  if (PQntuples(r) == 0) return std::optional<SnapshotRecord>();
  SnapshotRecord snap;
  if (auto ok = read_record(r, 0, 0, id, "snapshot", 0, snap); !ok) return std::move(ok).error();
  return std::optional<SnapshotRecord>(std::move(snap));
}

Result<std::uint64_t> parse_highest_fence(const PGresult* r) { return mark(r, 0, 0, "", "the highest fence"); }

Sql::Sql(const std::string& s) {
  const std::string fences_table =
      "CREATE TABLE " + s + ".fences (key bytea NOT NULL PRIMARY KEY, fence bigint NOT NULL);";
  // Takes the shared lock of every fence a transaction appends under (in
  // the order given: the writer sorts them), then compares the stored
  // fences, in a fresh snapshot (a VOLATILE function's statements each take
  // one), against the writer's. Raising a fence takes the same lock
  // exclusively, so it waits for appends in flight and they wait for it.
  const std::string check_fences_fn =
      "CREATE OR REPLACE FUNCTION " + s + ".check_fences(keys bytea[], fences bigint[], locks bigint[]) "
      "RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$ DECLARE l bigint; bad record; BEGIN "
      "FOREACH l IN ARRAY locks LOOP PERFORM pg_advisory_xact_lock_shared(l); END LOOP; "
      "SELECT g.n, f.fence INTO bad FROM unnest(keys, fences) WITH ORDINALITY AS g(key, fence, n) "
      "JOIN " + s + ".fences f ON f.key = g.key WHERE f.fence > g.fence ORDER BY g.n LIMIT 1; "
      "IF FOUND THEN RAISE EXCEPTION 'fence refused' USING ERRCODE = '" + std::string(kFenceRefused) +
      "', DETAIL = bad.n || ' ' || bad.fence; END IF; END $fn$;";
  create = "CREATE SCHEMA IF NOT EXISTS " + s + ";" +
           "CREATE TABLE " + s + ".events (persistence_id bytea NOT NULL, seq bigint NOT NULL, "
           "timestamp_ms bigint, type bytea, version bigint, payload bytea, PRIMARY KEY (persistence_id, seq));" +
           "CREATE TABLE " + s + ".deletions (persistence_id bytea NOT NULL PRIMARY KEY, "
           "deleted_to bigint NOT NULL);" +
           "CREATE TABLE " + s + ".snapshots (persistence_id bytea NOT NULL, seq bigint NOT NULL, "
           "timestamp_ms bigint, type bytea, version bigint, payload bytea, PRIMARY KEY (persistence_id, seq));" +
           fences_table + check_fences_fn +
           "CREATE TABLE " + s + ".journal_schema (version bigint NOT NULL);" +
           "INSERT INTO " + s + ".journal_schema (version) VALUES (2)";  // migrate_from_2 follows
  migrate_from_1 = fences_table + check_fences_fn + "UPDATE " + s + ".journal_schema SET version = 2";
  // Serializes first opens racing to create the tables (key: "trup").
  lock = "SELECT pg_advisory_xact_lock(1953658224)";
  version_table_exists = "SELECT to_regclass('" + s + ".journal_schema') IS NOT NULL";
  read_version = "SELECT max(version) FROM " + s + ".journal_schema";
  has_trace_column = "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('" + s +
                     ".events') AND attname = 'trace_id' AND NOT attisdropped";
  add_trace_column = "ALTER TABLE " + s + ".events ADD COLUMN IF NOT EXISTS trace_id text";

  // The trace ids come as bytea (empty: none) and are stored as text or NULL.
  append = "INSERT INTO " + s + ".events (persistence_id, seq, timestamp_ms, type, version, payload, trace_id) "
           "SELECT p, q, t, y, v, b, nullif(convert_from(tr, 'UTF8'), '') FROM unnest($1::bytea[], $2::int8[], "
           "$3::int8[], $4::bytea[], $5::int8[], $6::bytea[], $7::bytea[]) AS u(p, q, t, y, v, b, tr)";
  check_fences = "SELECT " + s + ".check_fences($1::bytea[], $2::int8[], $3::int8[])";
  insert_snapshots = "INSERT INTO " + s + ".snapshots AS o (persistence_id, seq, timestamp_ms, type, version, "
                     "payload) SELECT * FROM unnest($1::bytea[], $2::int8[], $3::int8[], $4::bytea[], "
                     "$5::int8[], $6::bytea[]) ON CONFLICT (persistence_id, seq) DO UPDATE SET "
                     "timestamp_ms = excluded.timestamp_ms, type = excluded.type, version = excluded.version, "
                     "payload = excluded.payload";
  prune_snapshots = "DELETE FROM " + s + ".snapshots o USING (SELECT DISTINCT unnest($1::bytea[]) AS pid) k "
                    "WHERE o.persistence_id = k.pid AND o.seq < (SELECT max(m.seq) FROM " + s +
                    ".snapshots m WHERE m.persistence_id = k.pid)";
  // Deletes up to min($2, highest) and records the mark; the mark never
  // passes the highest stored number, so the next append is still highest + 1.
  delete_to = "WITH h AS (SELECT least($2::int8, greatest(coalesce((SELECT max(seq) FROM " + s +
              ".events WHERE persistence_id = $1), 0), coalesce((SELECT deleted_to FROM " + s +
              ".deletions WHERE persistence_id = $1), 0))) AS upto), "
              "d AS (DELETE FROM " + s + ".events WHERE persistence_id = $1 AND seq <= (SELECT upto FROM h)), "
              "dt AS (DELETE FROM " + s + ".event_tags WHERE persistence_id = $1 AND seq <= (SELECT upto FROM h)) "
              "INSERT INTO " + s + ".deletions AS o (persistence_id, deleted_to) SELECT $1, upto FROM h "
              "WHERE upto > 0 ON CONFLICT (persistence_id) DO UPDATE SET "
              "deleted_to = greatest(o.deleted_to, excluded.deleted_to)";
  highest_many = "SELECT (SELECT max(seq) FROM " + s + ".events e WHERE e.persistence_id = k.pid), "
                 "(SELECT deleted_to FROM " + s + ".deletions d WHERE d.persistence_id = k.pid) "
                 "FROM unnest($1::bytea[]) WITH ORDINALITY AS k(pid, n) ORDER BY k.n";
  verify = "SELECT 1 FROM " + s + ".events WHERE persistence_id = $1 AND seq = $2 AND timestamp_ms = $3 "
           "AND payload = $4";
  raise_fence = "INSERT INTO " + s + ".fences AS o (key, fence) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE "
                "SET fence = greatest(o.fence, excluded.fence) RETURNING fence";
  bump_fence = "INSERT INTO " + s + ".fences AS o (key, fence) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE "
               "SET fence = o.fence + 1 RETURNING fence";

  // One statement each, so one snapshot and one round trip. Row kinds: 0 the
  // latest snapshot, 1 the highest stored seq (column 2) and the deletion
  // mark (column 5), 2 the events (their trace id in column 7, their tags
  // in column 8).
  recover = "SELECT 0::int8 AS kind, seq, timestamp_ms, type, version, payload, NULL::text, NULL::bytea FROM "
            "(SELECT * FROM " + s + ".snapshots WHERE persistence_id = $1 ORDER BY seq DESC LIMIT 1) s "
            "UNION ALL SELECT 1, coalesce((SELECT max(seq) FROM " + s + ".events WHERE persistence_id = $1), 0), "
            "NULL, NULL, coalesce((SELECT deleted_to FROM " + s + ".deletions WHERE persistence_id = $1), 0), NULL, "
            "NULL, NULL UNION ALL SELECT 2, seq, timestamp_ms, type, version, payload, trace_id, tags FROM " + s +
            ".events "
            "WHERE persistence_id = $1 AND seq > coalesce((SELECT max(seq) FROM " + s +
            ".snapshots WHERE persistence_id = $1), 0) ORDER BY 1, 2";
  replay = "SELECT 1::int8 AS kind, 0::int8 AS seq, NULL::int8, NULL::bytea, coalesce((SELECT deleted_to FROM " +
           s + ".deletions WHERE persistence_id = $1), 0), NULL::bytea, NULL::text, NULL::bytea "
           "UNION ALL SELECT 2, seq, timestamp_ms, type, version, payload, trace_id, tags FROM " + s + ".events "
           "WHERE persistence_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY 1, 2";
  highest = "SELECT (SELECT max(seq) FROM " + s + ".events WHERE persistence_id = $1), "
            "(SELECT deleted_to FROM " + s + ".deletions WHERE persistence_id = $1)";
  snapshot = "SELECT seq, timestamp_ms, type, version, payload FROM " + s + ".snapshots "
             "WHERE persistence_id = $1 ORDER BY seq DESC LIMIT 1";
  highest_fence = "SELECT coalesce(max(fence), 0) FROM " + s + ".fences";
  outbox_sql(s);
  query_sql(s);
}

std::vector<Sql::Prepared> Sql::writer_statements() const {
  return {{kAppend, &append},          {kAppendTagged, &append_tagged},          {kCheckFences, &check_fences}, {kInsertSnapshots, &insert_snapshots},
          {kPruneSnapshots, &prune_snapshots}, {kDeleteTo, &delete_to}, {kHighestMany, &highest_many},
          {kVerify, &verify},          {kOutboxAppend, &outbox_append}, {kOutboxClaim, &outbox_claim},
          {kOutboxSettleDone, &outbox_settle_done}, {kOutboxSettleUpdate, &outbox_settle_update}};
}

std::vector<Sql::Prepared> Sql::reader_statements() const {
  return {{kRecover, &recover},   {kReplay, &replay}, {kHighest, &highest},
          {kSnapshot, &snapshot}, {kHighestFence, &highest_fence}, {kOutboxCounts, &outbox_counts},
          {kOutboxEntries, &outbox_entries}, {kQueryType, &query_type}, {kQueryTag, &query_tag}};
}

Result<void> prepare_all(PGconn* c, const std::vector<Sql::Prepared>& statements) {
  // All of them in one pipeline: one round trip, so a connection made again
  // under load is ready soon.
  auto broken = [&](const char* doing) {
    Outcome o;
    fill_failure(c, nullptr, o);
    return failed(doing, o);
  };
  if (PQenterPipelineMode(c) != 1) return broken("prepare: enter pipeline mode");
  for (const auto& st : statements)
    if (PQsendPrepare(c, st.name, st.sql->c_str(), 0, nullptr) != 1) return broken("prepare: send");
  if (PQpipelineSync(c) != 1) return broken("prepare: send");
  std::optional<Error> first;
  std::size_t i = 0;
  for (;;) {
    PGresult* raw = PQgetResult(c);
    if (raw == nullptr) {
      if (PQstatus(c) == CONNECTION_BAD) return broken("prepare");
      ++i;  // the end of one statement's results
      continue;
    }
    PgResult r(raw);
    const ExecStatusType st = PQresultStatus(raw);
    if (st == PGRES_PIPELINE_SYNC) break;
    if (st == PGRES_COMMAND_OK || st == PGRES_PIPELINE_ABORTED || first) continue;
    Outcome o;
    fill_failure(c, raw, o);
    first = failed(std::string("prepare ") + (i < statements.size() ? statements[i].name : "?"), o);
  }
  if (PQexitPipelineMode(c) != 1) return broken("prepare: leave pipeline mode");
  if (first) return *first;
  return {};
}

}  // namespace troupe::pg
