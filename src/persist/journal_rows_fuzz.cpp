// libFuzzer target for the journals' decoding of stored rows (scripts/fuzz
// runs it): what a damaged disk, a restore from the wrong backup or a
// hostile DBA can leave in the tables is read back as a value or as an
// error, never a crash, undefined behaviour (ASan/UBSan), a leak or a hang.
//
// The first byte picks the back end (its two low bits: SQLite, PostgreSQL,
// or the durable job service's rows) and the read (the rest: recover,
// replay, highest_seq, load_snapshot, highest_fence); the next two bytes are
// replay's bounds (255: unbounded).
//
// SQLite: the rest of the input is rows, each a byte (table: events,
// snapshots, deletions, fences; its high bit: persistence id "p" or "q")
// and then one typed value per column (NULL, INTEGER, TEXT, BLOB, REAL).
// The rows are written with a connection of its own into the file of a
// real SqliteJournal, whose reads then run as in production.
//
// PostgreSQL: the rest is a result set, built with libpq's PGresult
// constructors as the server would send it in binary: a column count, a
// type per column (bigint, bytea, text, unknown), then cells (NULL, 8
// bytes, or bytes). It goes through the decoder of the chosen statement
// (pg_support.hpp: parse_recovery and its siblings).
//
// Durable jobs: the rest is the events of a job service's journal, each a
// byte (type: job.accepted, job.finished, another), a version byte, a
// 16-bit length and the payload, in consecutive seqs; they go through
// decode_job_rows as the service's recovery hands them over. An accepted
// decoding must re-queue jobs with distinct non-zero ids, timeouts the
// watchdog allows, an id counter above every id, and row counts that add
// up to the jobs.
//
// Checks beyond "no crash": an error is corrupt_record (SQLite; PostgreSQL
// also journal_failed for a result of the wrong shape) with a message; a
// value holds what the journal promises its caller: events in consecutive
// seqs from 1 up, replay within its bounds, versions in range, and (SQLite,
// where "highest" is computed from the same rows) no event above highest_seq.

#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../patterns/job_internal.hpp"
#include "postgres/pg_support.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

using troupe::ErrorCode;
using troupe::EventRecord;
using troupe::Result;

void check(bool ok) {
  if (!ok) std::abort();
}

// The input, read front to back; past its end everything reads as zero.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::string bytes(std::size_t n) {
    n = std::min(n, size_ - std::min(at_, size_));
    std::string s(reinterpret_cast<const char*>(data_) + at_, n);
    at_ += n;
    return s;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{byte()} << (8 * i);
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

enum class Read { recover, replay, highest, snapshot, highest_fence, count };

void check_error(const troupe::Error& e, bool postgres) {
  check(e.code() == ErrorCode::corrupt_record || (postgres && e.code() == ErrorCode::journal_failed));
  check(!e.message().empty());
}

void check_events(const std::vector<EventRecord>& events, std::uint64_t from, std::uint64_t to, bool bounded) {
  for (std::size_t i = 0; i < events.size(); ++i) {
    check(events[i].seq >= 1);
    if (i > 0) check(events[i].seq == events[i - 1].seq + 1);
    if (bounded) check(events[i].seq >= from && events[i].seq <= to);
  }
}

// --- SQLite --------------------------------------------------------------------

struct SqliteFixture {
  std::filesystem::path dir;
  std::shared_ptr<troupe::SqliteJournal> journal;
  sqlite3* raw = nullptr;
  sqlite3_stmt* insert[4] = {};

  SqliteFixture() {
    std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    std::string tmpl = base + "/troupe-journal-rows-fuzz-XXXXXX";
    check(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
    troupe::SqliteJournalOptions o;
    o.path = (dir / "journal.db").string();
    o.durability = troupe::Durability::process_crash;
    o.reader_threads = 1;
    auto j = troupe::SqliteJournal::open(o);
    check(j.ok());
    journal = std::move(*j);
    check(sqlite3_open(o.path.c_str(), &raw) == SQLITE_OK);
    check(sqlite3_exec(raw, "PRAGMA synchronous=OFF", nullptr, nullptr, nullptr) == SQLITE_OK);
    const char* sql[4] = {
        "INSERT OR REPLACE INTO events (persistence_id, seq, timestamp_ms, type, version, payload) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        "INSERT OR REPLACE INTO snapshots VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        "INSERT OR REPLACE INTO deletions VALUES (?1, ?2)",
        "INSERT OR REPLACE INTO fences VALUES (?1, ?2)",
    };
    for (int i = 0; i < 4; ++i) check(sqlite3_prepare_v2(raw, sql[i], -1, &insert[i], nullptr) == SQLITE_OK);
  }
  ~SqliteFixture() {
    for (auto* s : insert) sqlite3_finalize(s);
    sqlite3_close(raw);
    journal.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

void bind_value(sqlite3_stmt* s, int col, Input& in) {
  switch (in.byte() % 5) {
    case 0: sqlite3_bind_null(s, col); break;
    case 1: sqlite3_bind_int64(s, col, static_cast<sqlite3_int64>(in.u64())); break;
    case 2: {
      std::string t = in.bytes(in.byte());
      sqlite3_bind_text(s, col, t.data(), static_cast<int>(t.size()), SQLITE_TRANSIENT);
      break;
    }
    case 3: {
      std::string b = in.bytes(in.byte());
      sqlite3_bind_blob(s, col, b.data(), static_cast<int>(b.size()), SQLITE_TRANSIENT);
      break;
    }
    default: {
      std::uint64_t bits = in.u64();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      sqlite3_bind_double(s, col, d);
      break;
    }
  }
}

void sqlite_rows(Read read, std::uint64_t from, std::uint64_t to, Input& in) {
  static SqliteFixture f;
  check(sqlite3_exec(f.raw, "BEGIN; DELETE FROM events; DELETE FROM snapshots; DELETE FROM deletions; "
                            "DELETE FROM fences;", nullptr, nullptr, nullptr) == SQLITE_OK);
  for (int rows = 0; !in.empty() && rows < 64; ++rows) {
    const std::uint8_t head = in.byte();
    sqlite3_stmt* s = f.insert[head % 4];
    const int columns = head % 4 < 2 ? 6 : 2;
    // The first column is the key: mostly the id read below.
    sqlite3_bind_text(s, 1, head & 0x80 ? "q" : "p", 1, SQLITE_STATIC);
    for (int c = 2; c <= columns; ++c) bind_value(s, c, in);
    (void)sqlite3_step(s);  // a NOT NULL refusal just leaves the row out
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
  check(sqlite3_exec(f.raw, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK);

  troupe::Journal& j = *f.journal;
  namespace js = troupe::journal_sync;
  switch (read) {
    case Read::recover: {
      auto r = js::recover(j, "p");
      if (!r.ok()) return check_error(r.error(), false);
      check_events(r->events, 1, UINT64_MAX, false);
      if (!r->events.empty()) check(r->events.back().seq <= r->highest_seq);
      if (r->snapshot && !r->events.empty()) check(r->events.front().seq > r->snapshot->seq);
      break;
    }
    case Read::replay: {
      auto r = js::replay(j, "p", from, to);
      if (!r.ok()) return check_error(r.error(), false);
      check_events(*r, from, to, true);
      break;
    }
    case Read::highest: {
      auto r = js::highest_seq(j, "p");
      if (!r.ok()) return check_error(r.error(), false);
      break;
    }
    case Read::snapshot: {
      auto r = js::load_snapshot(j, "p");
      if (!r.ok()) return check_error(r.error(), false);
      break;
    }
    default: {
      auto r = js::highest_fence(j);
      if (!r.ok()) return check_error(r.error(), false);
      break;
    }
  }
}

// --- PostgreSQL ------------------------------------------------------------------

struct ResultFree {
  void operator()(PGresult* r) const { PQclear(r); }
};

std::unique_ptr<PGresult, ResultFree> build_result(Input& in) {
  std::unique_ptr<PGresult, ResultFree> r(PQmakeEmptyPGresult(nullptr, PGRES_TUPLES_OK));
  check(r != nullptr);
  const int columns = in.byte() % 8;
  std::vector<PGresAttDesc> attrs(static_cast<std::size_t>(columns));
  std::vector<std::string> names(static_cast<std::size_t>(columns));
  static const Oid kOids[4] = {troupe::pg::kInt8Oid, troupe::pg::kByteaOid, 25 /* text */, 0};
  for (int c = 0; c < columns; ++c) {
    names[c] = "c" + std::to_string(c);
    attrs[c] = PGresAttDesc{names[c].data(), 0, 0, 1, kOids[in.byte() % 4], -1, -1};
  }
  if (columns > 0) check(PQsetResultAttrs(r.get(), columns, attrs.data()) != 0);
  for (int row = 0; columns > 0 && !in.empty() && row < 64; ++row) {
    for (int c = 0; c < columns; ++c) {
      const std::uint8_t tag = in.byte() % 3;
      if (tag == 0) {
        check(PQsetvalue(r.get(), row, c, nullptr, -1) != 0);
      } else {
        std::string v = tag == 1 ? in.bytes(8) : in.bytes(in.byte());
        check(PQsetvalue(r.get(), row, c, v.data(), static_cast<int>(v.size())) != 0);
      }
    }
  }
  return r;
}

void postgres_rows(Read read, std::uint64_t from, std::uint64_t to, Input& in) {
  auto r = build_result(in);
  namespace pg = troupe::pg;
  switch (read) {
    case Read::recover: {
      auto rec = pg::parse_recovery(r.get(), "p");
      if (!rec.ok()) return check_error(rec.error(), true);
      // Which events follow the snapshot is the statement's to select (seq
      // above the snapshot's); a result the server cannot send may break it.
      check_events(rec->events, 1, UINT64_MAX, false);
      break;
    }
    case Read::replay: {
      // As PgReader::replay hands them on: from at least 1, to at most kMaxSeq.
      from = std::max<std::uint64_t>(from, 1);
      to = std::min(to, pg::kMaxSeq);
      auto ev = pg::parse_replay(r.get(), "p", from, to);
      if (!ev.ok()) return check_error(ev.error(), true);
      check_events(*ev, from, to, false);  // the bounds are the statement's to keep
      break;
    }
    case Read::highest: {
      auto h = pg::parse_highest(r.get(), "p");
      if (!h.ok()) return check_error(h.error(), true);
      break;
    }
    case Read::snapshot: {
      auto s = pg::parse_snapshot(r.get(), "p");
      if (!s.ok()) return check_error(s.error(), true);
      break;
    }
    default: {
      auto h = pg::parse_highest_fence(r.get());
      if (!h.ok()) return check_error(h.error(), true);
      break;
    }
  }
}

// --- the durable job service's rows ----------------------------------------------

void job_rows(std::uint8_t lo, std::uint8_t hi, Input& in) {
  using namespace std::chrono_literals;
  troupe::Recovery rec;
  std::uint64_t seq = lo;
  for (int rows = 0; !in.empty() && rows < 64; ++rows) {
    EventRecord e;
    e.seq = ++seq;
    const std::uint8_t kind = in.byte() % 3;
    e.type = kind == 0 ? "job.accepted" : kind == 1 ? "job.finished" : in.bytes(in.byte() % 16);
    e.version = in.byte() % 3;
    const std::size_t len = std::size_t{in.byte()} << 8 | in.byte();
    e.payload = in.bytes(len);
    rec.events.push_back(std::move(e));
  }
  rec.highest_seq = seq + (hi & 3);
  troupe::detail::JobJournalState state;
  const troupe::Duration default_timeout = 30s, watchdog = 300s;
  auto jobs = troupe::detail::decode_job_rows(rec, "jobs", default_timeout, watchdog, state);
  if (!jobs.ok()) return check_error(jobs.error(), false);
  std::uint64_t unfinished = 0;
  for (const auto& row : state.rows) unfinished += row.unfinished;
  check(unfinished == jobs->size());
  check(state.next_seq == rec.highest_seq + 1);
  check(state.next_id != 0);  // ids are never 0: the counter must not wrap
  for (std::size_t i = 0; i < jobs->size(); ++i) {
    const auto& j = (*jobs)[i];
    check(j.id != 0 && j.id < state.next_id);
    if (i > 0) check((*jobs)[i - 1].id < j.id);
    check(j.timeout > troupe::Duration::zero() && j.timeout < watchdog);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t head = in.byte();
  const auto read = static_cast<Read>((head >> 2) % static_cast<int>(Read::count));
  const std::uint8_t lo = in.byte(), hi = in.byte();
  const std::uint64_t from = lo, to = hi == 255 ? UINT64_MAX : hi;
  switch (head & 3) {
    case 0: sqlite_rows(read, from, to, in); break;
    case 1: postgres_rows(read, from, to, in); break;
    default: job_rows(lo, hi, in); break;
  }
  return 0;
}
