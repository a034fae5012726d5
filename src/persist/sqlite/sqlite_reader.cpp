// The SQLite journal's readers: replay, recovery, snapshots and the highest
// numbers, each row checked as it is read (SPEC X1: a row this journal would
// not have written is corrupt_record, never a crash or a guess).

#include "sqlite_reader.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace troupe::sqlite {
namespace {

// Reads the record columns (seq, timestamp_ms, type, version, payload, and
// for an event trace_id and tags) of the current row into `out`, checking every SQL type and range: a row
// that is not what this journal writes is corrupt_record, naming the id and
// the seq (SPEC X1: a bad row is a clear error, never a crash or a guess).
template <class Record>
Result<void> read_record(sqlite3_stmt* s, const std::string& path, const std::string& id, const char* what,
                         std::int64_t min_seq, Record& out) {
  auto corrupt = [&](const std::string& seq_text, const std::string& why) {
    return Error(ErrorCode::corrupt_record, "sqlite journal " + quoted(path) + ": corrupt " + what +
                                                " of persistence id " + quoted(id) + " seq " + seq_text + ": " +
                                                why);
  };
  if (sqlite3_column_type(s, 0) != SQLITE_INTEGER)
    return corrupt("?", std::string("seq is ") + type_name(sqlite3_column_type(s, 0)) + ", expected INTEGER");
  std::int64_t seq = sqlite3_column_int64(s, 0);
  std::string seq_text = std::to_string(seq);
  if (seq < min_seq) return corrupt(seq_text, "seq is below " + std::to_string(min_seq));
  auto expect = [&](int col, int type, const char* name) -> Result<void> {
    int t = sqlite3_column_type(s, col);
    if (t != type)
      return corrupt(seq_text, std::string(name) + " is " + type_name(t) + ", expected " + type_name(type));
    return {};
  };
  if (auto r = expect(1, SQLITE_INTEGER, "timestamp_ms"); !r) return r;
  if (auto r = expect(2, SQLITE_TEXT, "type"); !r) return r;
  if (auto r = expect(3, SQLITE_INTEGER, "version"); !r) return r;
  if (auto r = expect(4, SQLITE_BLOB, "payload"); !r) return r;
  std::int64_t version = sqlite3_column_int64(s, 3);
  if (version < 0 || version > std::int64_t{std::numeric_limits<std::uint32_t>::max()})
    return corrupt(seq_text, "version " + std::to_string(version) + " is outside 0.." +
                                 std::to_string(std::numeric_limits<std::uint32_t>::max()));
  out.seq = static_cast<std::uint64_t>(seq);
  out.timestamp_ms = sqlite3_column_int64(s, 1);
  // Column types were checked above, so these calls convert nothing.
  const auto* type = reinterpret_cast<const char*>(sqlite3_column_text(s, 2));
  out.type.assign(type != nullptr ? type : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 2)));
  out.version = static_cast<std::uint32_t>(version);
  const auto* payload = static_cast<const char*>(sqlite3_column_blob(s, 4));
  // A zero-length BLOB comes back as a null pointer.
  out.payload.assign(payload != nullptr ? payload : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 4)));
  if constexpr (std::is_same_v<Record, EventRecord>) {
    // The trace id: NULL for none (rows written before the column existed).
    const int t = sqlite3_column_type(s, 5);
    if (t != SQLITE_NULL && t != SQLITE_TEXT)
      return corrupt(seq_text, std::string("trace_id is ") + type_name(t) + ", expected TEXT or NULL");
    const auto* trace = reinterpret_cast<const char*>(sqlite3_column_text(s, 5));
    out.trace_id.assign(trace != nullptr ? trace : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 5)));
    // The tags: NULL for none, else what join_tags wrote.
    const int tt = sqlite3_column_type(s, 6);
    if (tt != SQLITE_NULL && tt != SQLITE_TEXT)
      return corrupt(seq_text, std::string("tags is ") + type_name(tt) + ", expected TEXT or NULL");
    if (tt == SQLITE_TEXT) {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(s, 6));
      std::string_view tags(text != nullptr ? text : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 6)));
      for (std::size_t at = 0; at <= tags.size();) {
        std::size_t end = std::min(tags.find(kTagSeparator, at), tags.size());
        std::string_view tag = tags.substr(at, end - at);
        if (auto v = validate_tag(tag); !v) return corrupt(seq_text, "tags: " + v.error().message());
        if (out.tags.size() == max_tags_per_event)
          return corrupt(seq_text, "more than " + std::to_string(max_tags_per_event) + " tags");
        out.tags.emplace_back(tag);
        at = end + 1;
      }
    }
  }
  return {};
}

}  // namespace

Result<void> Reader::open() {
  const std::string& path = options_.path;
  if (sqlite3_open_v2(path.c_str(), db_.out(), SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK)
    return failed(path, "open for reading", db_.get());
  sqlite3_busy_timeout(db_.get(), options_.busy_timeout_ms);
  return prepare_all(db_.get(), path,
                     {
                         {&begin_, "BEGIN"},
                         {&commit_, "COMMIT"},
                         {&rollback_, "ROLLBACK"},
                         {&events_, kSelectEvents},
                         {&snapshot_, kSelectSnapshot},
                         {&highest_, kSelectHighest},
                         {&highest_fence_, kSelectHighestFence},
                     });
}

Result<void> Reader::begin() {
  // A read that starts after an append's callback sees that append: each
  // read takes a fresh snapshot of the WAL here, after the commit.
  return run(db_.get(), options_.path, begin_.get(), "begin a read transaction");
}

Result<void> Reader::end() {
  if (auto r = run(db_.get(), options_.path, commit_.get(), "end a read transaction"); !r) {
    abort();
    return r;
  }
  return {};
}

void Reader::abort() {
  if (sqlite3_get_autocommit(db_.get()) == 0)
    (void)run(db_.get(), options_.path, rollback_.get(), "roll back a read transaction");
}

Result<detail::StoredHighest> Reader::read_highest(const std::string& id) {
  sqlite3_stmt* s = highest_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK || sqlite3_step(s) != SQLITE_ROW)
    return failed(options_.path, "read the highest seq of " + quoted(id), db_.get());
  detail::StoredHighest h;
  const char* names[] = {"max(seq) of its events", "its deleted_to mark"};
  std::uint64_t* values[] = {&h.max_seq, &h.deleted_to};
  for (int col = 0; col < 2; ++col) {
    int t = sqlite3_column_type(s, col);
    if (t == SQLITE_NULL) continue;
    sqlite3_int64 v = sqlite3_column_int64(s, col);
    if (t != SQLITE_INTEGER || v < 0)
      return Error(ErrorCode::corrupt_record,
                   "sqlite journal " + quoted(options_.path) + ": corrupt record of persistence id " + quoted(id) +
                       " seq ?: " + names[col] + " is " +
                       (t == SQLITE_INTEGER ? std::to_string(v) : std::string(type_name(t))) +
                       ", expected a non-negative INTEGER");
    *values[col] = static_cast<std::uint64_t>(v);
  }
  return h;
}

Result<void> Reader::read_events(const std::string& id, std::uint64_t from, std::uint64_t to,
                                 std::uint64_t deleted_to, std::vector<EventRecord>& out) {
  from = std::max<std::uint64_t>(from, 1);
  to = std::min(to, kMaxSeq);
  if (from > to) return {};
  sqlite3_stmt* s = events_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, from) != SQLITE_OK || bind_seq(s, 3, to) != SQLITE_OK)
    return failed(options_.path, "bind the replay of " + quoted(id), db_.get());
  // Rows must run on without a hole from here: below deleted_to they were
  // deleted on purpose; anything else missing was lost.
  std::uint64_t expected = std::max(from, deleted_to + 1);
  bool first = true;
  for (;;) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return {};
    if (rc != SQLITE_ROW) return failed(options_.path, "replay " + quoted(id), db_.get());
    EventRecord e;
    if (auto r = read_record(s, options_.path, id, "event", 1, e); !r) return r;
    // Rows at or below the deletion mark are harmless leftovers.
    if (first && e.seq < expected) expected = e.seq;
    first = false;
    if (e.seq != expected)
      return Error(ErrorCode::corrupt_record,
                   "sqlite journal " + quoted(options_.path) + ": corrupt event log of persistence id " +
                       quoted(id) + " seq " + std::to_string(expected) + ": missing (the next stored event is " +
                       std::to_string(e.seq) + ", and events were deleted only up to " +
                       std::to_string(deleted_to) + ")");
    ++expected;
    out.push_back(std::move(e));
  }
}

Result<std::optional<SnapshotRecord>> Reader::read_snapshot(const std::string& id) {
  sqlite3_stmt* s = snapshot_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK) return failed(options_.path, "bind the snapshot load", db_.get());
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::optional<SnapshotRecord>();
  if (rc != SQLITE_ROW) return failed(options_.path, "load the snapshot of " + quoted(id), db_.get());
  SnapshotRecord snap;
  if (auto r = read_record(s, options_.path, id, "snapshot", 0, snap); !r) return std::move(r).error();
  return std::optional<SnapshotRecord>(std::move(snap));
}

Result<std::vector<EventRecord>> Reader::replay(const std::string& id, std::uint64_t from, std::uint64_t to) {
  // The deletion mark and the rows must come from one snapshot, or a delete
  // committed between the two reads would look like a hole.
  if (auto r = begin(); !r) return std::move(r).error();
  auto h = read_highest(id);
  std::vector<EventRecord> events;
  Result<void> r = h ? read_events(id, from, to, h->deleted_to, events) : Result<void>(h.error());
  if (!r) {
    abort();
    return std::move(r).error();
  }
  if (auto e = end(); !e) return std::move(e).error();
  return events;
}

Result<std::uint64_t> Reader::highest_seq(const std::string& id) {
  auto h = read_highest(id);
  if (!h) return std::move(h).error();
  return h->value();
}

Result<std::optional<SnapshotRecord>> Reader::load_snapshot(const std::string& id) {
  return read_snapshot(id);
}

Result<EventPage> Reader::query_events(const EventQuery& query) {
  const std::string& path = options_.path;
  EventPage page;
  // Orderings here have no transaction part: an offset with one was made
  // by another journal and lies after everything here; so does one beyond
  // the largest rowid.
  if (query.after.tx != 0 || query.after.ordering >= kMaxSeq) return page;
  const bool by_tag = !query.select.tag.empty();
  Stmt& stmt = by_tag ? by_tag_ : by_type_;
  if (stmt.get() == nullptr)
    if (auto r = prepare(db_.get(), path, by_tag ? kQueryByTag : kQueryByType, stmt); !r) return std::move(r).error();
  // By type: the bounds of the ids "<type>|...", alive until the reset.
  const std::string& type = query.select.entity_type;
  const std::string from = by_tag ? std::string() : type + '|';
  const std::string below = by_tag ? std::string() : type + '}';
  sqlite3_stmt* s = stmt.get();
  ResetOnExit reset(s);
  int rc = bind_text(s, 1, by_tag ? query.select.tag : type);
  if (rc == SQLITE_OK) rc = bind_seq(s, 2, query.after.ordering);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, static_cast<sqlite3_int64>(query.limit));
  if (rc == SQLITE_OK && !by_tag) rc = bind_text(s, 4, from);
  if (rc == SQLITE_OK && !by_tag) rc = bind_text(s, 5, below);
  if (rc != SQLITE_OK) return failed(path, "bind the query " + query.select.to_string(), db_.get());
  page.events.reserve(std::min<std::size_t>(query.limit, 1024));
  for (;;) {
    rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return page;
    if (rc != SQLITE_ROW) return failed(path, "query " + query.select.to_string(), db_.get());
    StreamEvent out;
    // The ordering is the rowid: always an INTEGER, and above the offset.
    out.offset = JournalOffset{0, static_cast<std::uint64_t>(sqlite3_column_int64(s, 7))};
    const int id_type = sqlite3_column_type(s, 8);
    if (id_type != SQLITE_TEXT)
      return Error(ErrorCode::corrupt_record, "sqlite journal " + quoted(path) + ": corrupt event at ordering " +
                                                  std::to_string(out.offset.ordering) + ": persistence_id is " +
                                                  type_name(id_type) + ", expected TEXT");
    const auto* id = reinterpret_cast<const char*>(sqlite3_column_text(s, 8));
    out.persistence_id.assign(id != nullptr ? id : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 8)));
    if (auto r = read_record(s, path, out.persistence_id, "event", 1, out.event); !r) return std::move(r).error();
    page.events.push_back(std::move(out));
  }
}

Result<std::uint64_t> Reader::highest_fence() {
  sqlite3_stmt* s = highest_fence_.get();
  ResetOnExit reset(s);
  if (sqlite3_step(s) != SQLITE_ROW) return failed(options_.path, "read the highest fence", db_.get());
  return static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
}

Result<Recovery> Reader::recover(const std::string& id) {
  // One read transaction: the snapshot, the events after it and the highest
  // number all come from the same committed state.
  if (auto r = begin(); !r) return std::move(r).error();
  Recovery rec;
  Result<void> r = [&]() -> Result<void> {
    auto snap = read_snapshot(id);
    if (!snap) return std::move(snap).error();
    rec.snapshot = std::move(*snap);
    auto h = read_highest(id);
    if (!h) return std::move(h).error();
    rec.highest_seq = h->value();
    std::uint64_t from = rec.snapshot ? rec.snapshot->seq + 1 : 1;
    return read_events(id, from, UINT64_MAX, h->deleted_to, rec.events);
  }();
  if (!r) {
    abort();
    return std::move(r).error();
  }
  if (auto e = end(); !e) return std::move(e).error();
  return rec;
}

}  // namespace troupe::sqlite
