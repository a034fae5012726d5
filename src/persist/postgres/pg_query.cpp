// The PostgreSQL journal's global order (event_query.hpp, doc/journal.md
// "Global order"): the schema 2 to 3 migration that adds it, the append of
// tagged events, the readers' queries by entity type and by tag, and
// reading their answers back.
//
// Each event row carries tx (the appending transaction's xid8, a column
// default) and ordering (a sequence value, a column default), so an append
// sends nothing more than before. A query returns only rows whose tx is
// below the xmin of its own snapshot: every transaction below it has ended,
// so no row can turn up later below an offset already returned.

#include <cstring>
#include <string>
#include <utility>

#include "pg_support.hpp"

namespace troupe::pg {

void Sql::query_sql(const std::string& s) {
  // Schema 2 to 3, in the schema check's transaction (all of it or none).
  // Rows stored before get tx 0 and orderings in a stable order that keeps
  // each id's events in their own order: by the running maximum of the
  // id's timestamps, then id, then seq. The sequence then continues after
  // them. Orderings only break ties within one transaction, so the
  // sequence may cache values per connection.
  const std::string type_of = "CASE WHEN position('\\x7c'::bytea IN persistence_id) > 0 THEN "
                              "substring(persistence_id FROM 1 FOR position('\\x7c'::bytea IN persistence_id) - 1) "
                              "ELSE persistence_id END";
  migrate_from_2 =
      "CREATE SEQUENCE IF NOT EXISTS " + s + ".event_ordering AS bigint CACHE 64;"
      "ALTER TABLE " + s + ".events ADD COLUMN IF NOT EXISTS entity_type bytea GENERATED ALWAYS AS (" + type_of +
      ") STORED, ADD COLUMN IF NOT EXISTS tags bytea, ADD COLUMN IF NOT EXISTS tx xid8 NOT NULL DEFAULT '0', "
      "ADD COLUMN IF NOT EXISTS ordering bigint;"
      "UPDATE " + s + ".events e SET ordering = o.n FROM (SELECT persistence_id, seq, row_number() OVER "
      "(ORDER BY k, persistence_id, seq) AS n FROM (SELECT persistence_id, seq, max(timestamp_ms) OVER "
      "(PARTITION BY persistence_id ORDER BY seq) AS k FROM " + s + ".events) w) o "
      "WHERE e.persistence_id = o.persistence_id AND e.seq = o.seq AND e.ordering IS NULL;"
      "SELECT setval('" + s + ".event_ordering', coalesce((SELECT max(ordering) FROM " + s + ".events), 0) + 1, "
      "false);"
      "ALTER TABLE " + s + ".events ALTER COLUMN ordering SET DEFAULT nextval('" + s + ".event_ordering'), "
      "ALTER COLUMN ordering SET NOT NULL, ALTER COLUMN tx SET DEFAULT pg_current_xact_id();"
      "ALTER SEQUENCE " + s + ".event_ordering OWNED BY " + s + ".events.ordering;"
      "CREATE INDEX IF NOT EXISTS events_by_type ON " + s + ".events (entity_type, tx, ordering);"
      "CREATE TABLE IF NOT EXISTS " + s + ".event_tags (tag bytea NOT NULL, tx xid8 NOT NULL, "
      "ordering bigint NOT NULL, persistence_id bytea NOT NULL, seq bigint NOT NULL, "
      "PRIMARY KEY (tag, tx, ordering));"
      "CREATE INDEX IF NOT EXISTS event_tags_by_event ON " + s + ".event_tags (persistence_id, seq);"
      "UPDATE " + s + ".journal_schema SET version = 3";

  // kAppend's rows plus $8, each event's tags (join_tags; empty: none), and
  // one row per (event, tag): $9 the event's index into the arrays (from
  // 1), $10 the tag. The tag rows take the tx and ordering their event got.
  append_tagged =
      "WITH ins AS (INSERT INTO " + s + ".events (persistence_id, seq, timestamp_ms, type, version, payload, "
      "trace_id, tags) SELECT p, q, t, y, v, b, nullif(convert_from(tr, 'UTF8'), ''), nullif(g, ''::bytea) "
      "FROM unnest($1::bytea[], $2::int8[], $3::int8[], $4::bytea[], $5::int8[], $6::bytea[], $7::bytea[], "
      "$8::bytea[]) AS u(p, q, t, y, v, b, tr, g) RETURNING persistence_id, seq, tx, ordering) "
      "INSERT INTO " + s + ".event_tags (tag, tx, ordering, persistence_id, seq) "
      "SELECT k.tag, i.tx, i.ordering, i.persistence_id, i.seq FROM unnest($9::int8[], $10::bytea[]) AS k(n, tag) "
      "JOIN ins i ON i.persistence_id = ($1::bytea[])[k.n] AND i.seq = ($2::int8[])[k.n] ON CONFLICT DO NOTHING";

  // $1 the type or tag, ($2, $3) the offset to read after, $4 the limit.
  // pg_current_snapshot() is the statement's own snapshot, so every
  // transaction below its xmin has ended and its rows are visible here. A
  // last row with a NULL tx says that committed rows wait behind the
  // horizon (an older transaction is still open): the reader may ask again
  // soon rather than end a short page there.
  const std::string horizon = "pg_snapshot_xmin(pg_current_snapshot())";
  const std::string after = "> ($2::xid8, $3::int8)";
  // The marker's rows: at or beyond the horizon and after the offset. The
  // horizon as the index's lower bound (a row comparison there would make
  // the scan start at the offset and walk every visible row).
  const std::string beyond = "tx >= greatest(" + horizon + ", $2::xid8) AND (tx > $2::xid8 OR ordering > $3::int8)";
  const std::string nulls = "NULL::xid8, NULL::int8, NULL::bytea, NULL::int8, NULL::int8, NULL::bytea, NULL::int8, "
                            "NULL::bytea, NULL::text, NULL::bytea";
  query_type = "(SELECT tx, ordering, persistence_id, seq, timestamp_ms, type, version, payload, trace_id, tags "
               "FROM " + s + ".events WHERE entity_type = $1 AND (tx, ordering) " + after + " AND tx < " + horizon +
               " ORDER BY tx, ordering LIMIT $4) UNION ALL (SELECT " + nulls + " FROM " + s + ".events "
               "WHERE entity_type = $1 AND " + beyond + " LIMIT 1)";
  query_tag = "(SELECT t.tx, t.ordering, e.persistence_id, e.seq, e.timestamp_ms, e.type, e.version, e.payload, "
              "e.trace_id, e.tags FROM " + s + ".event_tags t JOIN " + s + ".events e ON "
              "e.persistence_id = t.persistence_id AND e.seq = t.seq WHERE t.tag = $1 AND "
              "(t.tx, t.ordering) " + after + " AND t.tx < " + horizon + " ORDER BY t.tx, t.ordering LIMIT $4) "
              "UNION ALL (SELECT " + nulls + " FROM " + s + ".event_tags WHERE tag = $1 AND " + beyond + " LIMIT 1)";
}

std::string join_tags(const std::vector<std::string>& tags) {
  std::string out;
  for (const std::string& t : tags) {
    if (!out.empty()) out += '\n';
    out += t;
  }
  return out;
}

Result<void> read_tags(const PGresult* r, int row, int col, const std::string& id, EventRecord& e) {
  if (col >= PQnfields(r) || PQgetisnull(r, row, col) != 0) return {};
  const char* p = PQgetvalue(r, row, col);
  const auto n = static_cast<std::size_t>(PQgetlength(r, row, col));
  auto corrupt = [&](const std::string& what) {
    return Error(ErrorCode::corrupt_record, "postgres journal: corrupt event of persistence id " + printable(id) +
                                                " seq " + std::to_string(e.seq) + ": " + what);
  };
  if (PQftype(r, col) != kByteaOid) return corrupt("tags has type oid " + std::to_string(PQftype(r, col)));
  std::size_t start = 0;
  for (std::size_t i = 0; i <= n; ++i) {
    if (i < n && p[i] != '\n') continue;
    std::string tag(p + start, i - start);
    if (auto v = validate_tag(tag); !v) return corrupt("a stored tag: " + v.error().message());
    e.tags.push_back(std::move(tag));
    start = i + 1;
  }
  if (e.tags.size() > max_tags_per_event) return corrupt(std::to_string(e.tags.size()) + " tags");
  return {};
}

Result<EventPage> parse_page(const PGresult* r, bool& behind) {
  EventPage page;
  behind = false;
  const int rows = PQntuples(r);
  if (PQnfields(r) != 10)
    return Error(ErrorCode::journal_failed, "postgres journal: query: a result of " + std::to_string(PQnfields(r)) +
                                                " columns");
  page.events.reserve(static_cast<std::size_t>(rows));
  for (int row = 0; row < rows; ++row) {
    if (PQgetisnull(r, row, 0) != 0) {  // the marker: more behind the horizon
      behind = true;
      continue;
    }
    StreamEvent se;
    if (PQgetisnull(r, row, 2) != 0)
      return Error(ErrorCode::corrupt_record, "postgres journal: corrupt event: no persistence id");
    se.persistence_id.assign(PQgetvalue(r, row, 2), static_cast<std::size_t>(PQgetlength(r, row, 2)));
    for (int col : {0, 1})
      if (PQgetisnull(r, row, col) != 0 || PQgetlength(r, row, col) != 8)
        return Error(ErrorCode::corrupt_record, "postgres journal: corrupt event of persistence id " +
                                                    printable(se.persistence_id) + ": its " +
                                                    (col == 0 ? "tx" : "ordering") + " is not 8 bytes");
    se.offset.tx = static_cast<std::uint64_t>(read_int8(PQgetvalue(r, row, 0)));
    const std::int64_t ordering = read_int8(PQgetvalue(r, row, 1));
    if (ordering < 0)
      return Error(ErrorCode::corrupt_record, "postgres journal: corrupt event of persistence id " +
                                                  printable(se.persistence_id) + ": ordering " +
                                                  std::to_string(ordering));
    se.offset.ordering = static_cast<std::uint64_t>(ordering);
    if (auto ok = read_record(r, row, 3, se.persistence_id, "event", 1, se.event); !ok) return std::move(ok).error();
    if (PQgetisnull(r, row, 8) == 0)
      se.event.trace_id.assign(PQgetvalue(r, row, 8), static_cast<std::size_t>(PQgetlength(r, row, 8)));
    if (auto t = read_tags(r, row, 9, se.persistence_id, se.event); !t) return std::move(t).error();
    page.events.push_back(std::move(se));
  }
  return page;
}

}  // namespace troupe::pg
