// What the SQLite journal adds to the contract (journal_contract.test.cpp):
// the file outlives the process, group commit, the single-process lock,
// clear errors for bad files and garbled rows, and no acknowledged event lost
// to a SIGKILL.
// A garbled row is corrupt_record naming the persistence id and seq; the
// other ids still read fine.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>  // mkdtemp
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../crash_writer.hpp"
#include "../journal_test_support.hpp"
#include "sqlite_support.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::Durability;
using troupe::SqliteJournal;
using troupe::SqliteJournalOptions;






// A direct connection to the journal's file, for garbling rows the way a
// disk, a tool or a bug might.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK)
      throw std::runtime_error("raw open failed");
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void exec(const std::string& sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    std::string msg = err != nullptr ? err : "";
    sqlite3_free(err);
    ASSERT_EQ(rc, SQLITE_OK) << sql << ": " << msg;
  }
  std::int64_t count(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) return -1;
    std::int64_t n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    return n;
  }

 private:
  sqlite3* db_ = nullptr;
};

// The layout of schema 2 (the build before the global order), written by
// hand as that build wrote it; without `fences` it is schema 1.
void write_old_layout(RawDb& db, int version) {
  db.exec("CREATE TABLE events (persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, timestamp_ms INTEGER, "
          "type TEXT, version INTEGER, payload BLOB, PRIMARY KEY (persistence_id, seq))");
  db.exec("CREATE TABLE deletions (persistence_id TEXT NOT NULL PRIMARY KEY, deleted_to INTEGER NOT NULL) "
          "WITHOUT ROWID");
  db.exec("CREATE TABLE snapshots (persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, timestamp_ms INTEGER, "
          "type TEXT, version INTEGER, payload BLOB, PRIMARY KEY (persistence_id, seq)) WITHOUT ROWID");
  if (version >= 2) db.exec("CREATE TABLE fences (key TEXT NOT NULL PRIMARY KEY, fence INTEGER NOT NULL) WITHOUT ROWID");
  db.exec("PRAGMA application_id = 1953658224; PRAGMA user_version = " + std::to_string(version));
  db.exec("ALTER TABLE events ADD COLUMN trace_id TEXT");
}

class SqliteJournalTest : public ::testing::Test {
 protected:
  SqliteJournalOptions options(Durability d = Durability::full) const {
    SqliteJournalOptions o;
    o.path = path_;
    o.durability = d;
    return o;
  }
  std::shared_ptr<SqliteJournal> open(SqliteJournalOptions o) {
    auto j = SqliteJournal::open(std::move(o));
    EXPECT_TRUE(j.ok()) << j.error().to_string();
    return j.ok() ? *j : nullptr;
  }
  std::shared_ptr<SqliteJournal> open() { return open(options()); }

  TempDir dir_;
  std::string path_ = dir_.file("journal.db");
};

// --- the file ------------------------------------------------------------------------

TEST_F(SqliteJournalTest, events_snapshots_and_deletions_survive_closing_and_reopening) {
  {
    auto j = open();
    ASSERT_TRUE(js::append(*j, batch("a", 1, 5)).ok());
    ASSERT_TRUE(js::append(*j, batch("b", 1, 2)).ok());
    ASSERT_TRUE(js::save_snapshot(*j, "a", SnapshotRecord{3, 7, "S", 1, std::string("st\0ate", 6)}).ok());
    ASSERT_TRUE(js::delete_up_to(*j, "b", 2).ok());
  }
  auto j = open();
  auto a = js::recover(*j, "a");
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  EXPECT_EQ(*a->snapshot, (SnapshotRecord{3, 7, "S", 1, std::string("st\0ate", 6)}));
  EXPECT_EQ(seqs(a->events), range(4, 5));
  EXPECT_EQ(a->events[1], event(5));
  EXPECT_EQ(a->highest_seq, 5u);
  // b's numbers stay used across the restart.
  EXPECT_TRUE(js::replay(*j, "b")->empty());
  EXPECT_EQ(*js::highest_seq(*j, "b"), 2u);
  auto stale = js::append(*j, batch("b", 2, 2));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ErrorCode::journal_conflict);
  EXPECT_TRUE(js::append(*j, batch("b", 3, 3)).ok());
}

TEST_F(SqliteJournalTest, appends_queued_when_the_journal_is_destroyed_are_committed_and_acknowledged) {
  constexpr int n = 2000;
  std::atomic<int> ok{0}, calls{0};
  {
    auto j = open(options(Durability::process_crash));
    for (int i = 0; i < n; ++i) {
      j->append(batch("q" + std::to_string(i % 20), static_cast<std::uint64_t>(i / 20 + 1),
                      static_cast<std::uint64_t>(i / 20 + 1)),
                [&](Result<void> r) {
                  ++calls;
                  if (r.ok()) ++ok;
                });
    }
  }  // destroyed with most of them still queued
  EXPECT_EQ(calls.load(), n);
  EXPECT_EQ(ok.load(), n);
  auto j = open();
  for (int k = 0; k < 20; ++k) EXPECT_EQ(seqs(*js::replay(*j, "q" + std::to_string(k))), range(1, n / 20));
}

TEST_F(SqliteJournalTest, a_call_made_while_the_journal_closes_fails_at_once_with_journal_failed) {
  std::mutex mu;
  std::vector<ErrorCode> late;
  {
    auto j = open();
    SqliteJournal* raw = j.get();
    // This callback runs while the destructor drains the queue.
    j->append(batch("a", 1, 1), [&, raw](Result<void>) {
      raw->append(batch("a", 2, 2), [&](Result<void> r) {
        std::lock_guard lk(mu);
        late.push_back(r.ok() ? ErrorCode::ok : r.error().code());
      });
      raw->replay("a", 1, 10, [&](Result<std::vector<EventRecord>> r) {
        std::lock_guard lk(mu);
        late.push_back(r.ok() ? ErrorCode::ok : r.error().code());
      });
    });
    j.reset();
  }
  std::lock_guard lk(mu);
  EXPECT_EQ(late, (std::vector<ErrorCode>{ErrorCode::journal_failed, ErrorCode::journal_failed}));
}

TEST_F(SqliteJournalTest, the_journal_may_be_destroyed_from_its_own_callback) {
  // The only owner sits where the first callback can drop it.
  auto holder = std::make_shared<std::shared_ptr<SqliteJournal>>(open());
  SqliteJournal* raw = holder->get();
  std::promise<void> issued, destroyed;
  std::atomic<int> later_calls{0};
  raw->append(batch("a", 1, 1), [holder, all_issued = issued.get_future().share(), &destroyed](Result<void> r) {
    EXPECT_TRUE(r.ok());
    all_issued.wait();  // keeps `raw` valid while the test issues the rest
    holder->reset();    // the last reference: the journal is destroyed here, on its writer thread
    destroyed.set_value();
  });
  for (int i = 2; i <= 20; ++i)
    raw->append(batch("a", static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i)),
                [&](Result<void> r) {
                  EXPECT_TRUE(r.ok());
                  ++later_calls;
                });
  issued.set_value();
  ASSERT_EQ(destroyed.get_future().wait_for(10s), std::future_status::ready);
  // The writer thread finishes and releases the file; reopening waits for that.
  std::shared_ptr<SqliteJournal> again;
  for (int attempt = 0; attempt < 500 && !again; ++attempt) {
    auto r = SqliteJournal::open(options());
    if (r.ok())
      again = *r;
    else
      std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(again);
  EXPECT_EQ(later_calls.load(), 19);
  EXPECT_EQ(*js::highest_seq(*again, "a"), 20u);
}

// --- group commit ----------------------------------------------------------------------

TEST_F(SqliteJournalTest, concurrent_appends_from_many_threads_share_few_transactions) {
  auto j = open();
  constexpr int threads = 8, ids_per_thread = 50, seqs_per_id = 5;
  std::atomic<int> ok{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Everything in flight at once, as 10,000 entities would be.
      std::mutex mu;
      std::condition_variable cv;
      int pending = ids_per_thread * seqs_per_id;
      for (int s = 1; s <= seqs_per_id; ++s)
        for (int k = 0; k < ids_per_thread; ++k)
          j->append(batch("g" + std::to_string(t) + "-" + std::to_string(k), static_cast<std::uint64_t>(s),
                          static_cast<std::uint64_t>(s)),
                    [&](Result<void> r) {
                      if (r.ok()) ++ok;
                      std::lock_guard lk(mu);
                      if (--pending == 0) cv.notify_one();
                    });
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return pending == 0; });
    });
  }
  for (auto& w : workers) w.join();
  constexpr int appends = threads * ids_per_thread * seqs_per_id;
  EXPECT_EQ(ok.load(), appends);
  auto st = j->stats();
  EXPECT_EQ(st.events_written, static_cast<std::uint64_t>(appends));
  EXPECT_EQ(st.append_failures, 0u);
  EXPECT_GE(st.transactions, 1u);
  EXPECT_LE(st.transactions * 10, static_cast<std::uint64_t>(appends))
      << st.transactions << " transactions for " << appends << " appends";
}

TEST_F(SqliteJournalTest, a_transaction_holds_at_most_max_batch_events_events_but_never_splits_a_batch) {
  auto o = options(Durability::process_crash);
  o.max_batch_events = 4;
  auto j = open(o);
  // Hold the writer in a callback so that everything below queues up.
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> held;
  j->append(batch("hold", 1, 1), [&held, released](Result<void>) {
    held.set_value();
    released.wait();
  });
  held.get_future().wait();
  std::atomic<int> ok{0};
  for (int i = 1; i <= 12; ++i)
    j->append(batch("m", static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i)), [&](Result<void> r) {
      if (r.ok()) ++ok;
    });
  std::promise<Result<void>> big;
  j->append(batch("big", 1, 10), [&big](Result<void> r) { big.set_value(std::move(r)); });
  release.set_value();
  auto big_result = big.get_future().get();
  ASSERT_TRUE(big_result.ok()) << big_result.error().to_string();
  EXPECT_EQ(ok.load(), 12);
  // 1 (hold) + 3 (twelve single events, four per transaction) + 1 (the batch of ten).
  EXPECT_EQ(j->stats().transactions, 5u);
  EXPECT_EQ(seqs(*js::replay(*j, "big")), range(1, 10));
}

TEST_F(SqliteJournalTest, stats_count_failed_appends) {
  auto j = open();
  ASSERT_TRUE(js::append(*j, batch("a", 1, 2)).ok());
  EXPECT_FALSE(js::append(*j, batch("a", 1, 1)).ok());
  EXPECT_FALSE(js::append(*j, batch("", 1, 1)).ok());
  auto st = j->stats();
  EXPECT_EQ(st.events_written, 2u);
  EXPECT_EQ(st.append_failures, 2u);
}

// --- opening ------------------------------------------------------------------------------

TEST_F(SqliteJournalTest, a_second_open_of_an_open_journal_fails_cleanly_until_the_first_closes) {
  auto first = open();
  ASSERT_TRUE(js::append(*first, batch("a", 1, 1)).ok());
  auto second = SqliteJournal::open(options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(second.error().message().find("already open"), std::string::npos) << second.error().message();
  EXPECT_NE(second.error().message().find(path_ + ".lock"), std::string::npos) << second.error().message();
  // The refused open changed nothing.
  ASSERT_TRUE(js::append(*first, batch("a", 2, 2)).ok());
  first.reset();
  auto third = open();
  ASSERT_TRUE(third);
  EXPECT_EQ(*js::highest_seq(*third, "a"), 2u);
}

TEST_F(SqliteJournalTest, a_second_process_cannot_open_an_open_journal) {
  auto first = open();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls here: try the lock the way open() does.
    int fd = ::open((path_ + ".lock").c_str(), O_RDWR | O_CLOEXEC);
    _exit(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the lock file was not locked";
}

TEST_F(SqliteJournalTest, opening_a_file_that_is_not_a_database_fails_with_journal_failed) {
  {
    std::ofstream f(path_);
    f << std::string(8192, 'x') << " definitely not SQLite\n";
  }
  auto r = SqliteJournal::open(options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(r.error().message().find("not a database"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find(path_), std::string::npos) << r.error().message();
}

TEST_F(SqliteJournalTest, opening_where_the_directory_is_missing_or_is_a_file_fails_with_journal_failed) {
  std::ofstream(dir_.file("plain")) << "a file, not a directory";
  for (const std::string& p : {dir_.file("missing/journal.db"), dir_.file("plain/journal.db")}) {
    SqliteJournalOptions o;
    o.path = p;
    auto r = SqliteJournal::open(o);
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
    EXPECT_NE(r.error().message().find(p), std::string::npos) << r.error().message();
  }
}

TEST_F(SqliteJournalTest, opening_in_an_unwritable_directory_fails_with_journal_failed) {
  if (geteuid() == 0) {
    // Root writes through directory permissions; procfs refuses new files to
    // everyone, so the same failure is reached there.
    SqliteJournalOptions o;
    o.path = "/proc/self/troupe-journal.db";
    auto r = SqliteJournal::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
    EXPECT_NE(r.error().message().find(o.path), std::string::npos) << r.error().message();
    return;
  }
  std::filesystem::create_directory(dir_.file("ro"));
  std::filesystem::permissions(dir_.file("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  SqliteJournalOptions o;
  o.path = dir_.file("ro/journal.db");
  auto r = SqliteJournal::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(r.error().message().find("Permission denied"), std::string::npos) << r.error().message();
}

TEST_F(SqliteJournalTest, a_journal_written_by_a_newer_schema_version_is_refused) {
  open().reset();
  RawDb(path_).exec("PRAGMA user_version = 99");
  auto r = SqliteJournal::open(options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(r.error().message().find("schema version 99"), std::string::npos) << r.error().message();
}

TEST_F(SqliteJournalTest, a_journal_of_the_first_layout_gains_fences_on_open) {
  {
    RawDb db(path_);
    write_old_layout(db, 1);
    db.exec("INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload) VALUES "
            "('m', 1, 0, 'x', 0, x'01'), ('m', 2, 0, 'x', 0, x'02')");
  }
  auto j = open();
  EXPECT_EQ(RawDb(path_).count("PRAGMA user_version"), 3);
  EXPECT_EQ(js::replay(*j, "m")->size(), 2u);
  ASSERT_TRUE(js::raise_fence(*j, "k", 2).ok());
  troupe::AppendBatch b = batch("m", 3, 3);
  b.fence = {"k", 1};
  EXPECT_EQ(js::append(*j, b).error().code(), ErrorCode::journal_conflict);
  b.fence = {"k", 2};
  EXPECT_TRUE(js::append(*j, b).ok());
  j.reset();
  // The raised fence is stored, not only cached.
  j = open();
  b = batch("m", 4, 4);
  b.fence = {"k", 1};
  EXPECT_EQ(js::append(*j, b).error().code(), ErrorCode::journal_conflict);
}

// proves: X4
TEST_F(SqliteJournalTest, a_journal_from_before_trace_ids_gains_the_column_on_open_and_keeps_its_rows) {
  {
    auto j = open();
    ASSERT_TRUE(js::append(*j, batch("m", 1, 2)).ok());
  }
  // Back to the layout without the column.
  RawDb(path_).exec("ALTER TABLE events DROP COLUMN trace_id");
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM pragma_table_info('events') WHERE name = 'trace_id'"), 0);
  auto j = open();
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM pragma_table_info('events') WHERE name = 'trace_id'"), 1);
  auto old = js::replay(*j, "m");
  ASSERT_TRUE(old.ok()) << old.error().to_string();
  ASSERT_EQ(old->size(), 2u);
  EXPECT_EQ((*old)[0].trace_id, "");
  troupe::AppendBatch b = batch("m", 3, 3);
  b.events[0].trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  ASSERT_TRUE(js::append(*j, b).ok());
  EXPECT_EQ(js::replay(*j, "m", 3)->at(0).trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM events WHERE trace_id = '4bf92f3577b34da6a3ce929d0e0e4736'"), 1);
  // A trace id of the wrong SQL type is a corrupt row, not a guess.
  RawDb(path_).exec("UPDATE events SET trace_id = x'07' WHERE persistence_id = 'm' AND seq = 1");
  auto bad = js::replay(*j, "m");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::corrupt_record);
  EXPECT_NE(bad.error().message().find("trace_id is BLOB"), std::string::npos) << bad.error().message();
}

TEST_F(SqliteJournalTest, another_application_s_database_is_refused_and_left_untouched) {
  {
    RawDb db(path_);
    db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)");
  }
  auto r = SqliteJournal::open(options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(r.error().message().find("another application"), std::string::npos) << r.error().message();
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM sqlite_schema"), 1);
}

TEST_F(SqliteJournalTest, unusable_options_are_invalid_arguments) {
  std::vector<SqliteJournalOptions> bad(4, options());
  bad[0].path = "";
  bad[1].max_batch_events = 0;
  bad[2].reader_threads = 0;
  bad[3].busy_timeout_ms = -1;
  for (auto& o : bad) {
    auto r = SqliteJournal::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  }
}

// --- the unique index as the last word -----------------------------------------------------

// The unique index refuses the number even when the journal's own bookkeeping says it is free.
// proves: E7
TEST_F(SqliteJournalTest, a_row_written_behind_the_journal_s_back_still_makes_the_append_a_conflict) {
  auto j = open();
  ASSERT_TRUE(js::append(*j, batch("a", 1, 2)).ok());
  RawDb raw(path_);
  raw.exec("INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload) "
           "VALUES ('a', 4, 0, 'x', 0, x'00')");
  auto r = js::append(*j, batch("a", 3, 5));  // 3 goes in, 4 collides
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict) << r.error().to_string();
  EXPECT_NE(r.error().message().find("'a'"), std::string::npos);
  EXPECT_EQ(raw.count("SELECT count(*) FROM events WHERE persistence_id = 'a' AND seq = 3"), 0)
      << "a batch is atomic: its first event must be rolled back with it";
  // The journal learnt the real highest number from the collision.
  EXPECT_EQ(js::append(*j, batch("a", 3, 3)).error().code(), ErrorCode::journal_conflict);
  EXPECT_TRUE(js::append(*j, batch("a", 5, 5)).ok());
}

// --- corruption ---------------------------------------------------------------------------

class SqliteCorruption : public SqliteJournalTest {
 protected:
  void SetUp() override {
    journal_ = open();
    ASSERT_TRUE(journal_);
    ASSERT_TRUE(js::append(*journal_, batch("good", 1, 5)).ok());
    ASSERT_TRUE(js::append(*journal_, batch("bad", 1, 5)).ok());
    ASSERT_TRUE(js::save_snapshot(*journal_, "good", SnapshotRecord{2, 0, "S", 1, "g"}).ok());
  }

  // Garbles `bad` with `sql`, then expects corrupt_record naming 'bad' and
  // `seq` from replay and recover, and a clean read of 'good'.
  void expect_corrupt(const std::string& sql, std::uint64_t seq, const std::string& detail) {
    RawDb(path_).exec(sql);
    const std::string seq_text = "seq " + std::to_string(seq);
    auto rep = js::replay(*journal_, "bad");
    ASSERT_FALSE(rep.ok()) << sql;
    EXPECT_EQ(rep.error().code(), ErrorCode::corrupt_record) << rep.error().to_string();
    EXPECT_NE(rep.error().message().find("'bad'"), std::string::npos) << rep.error().message();
    EXPECT_NE(rep.error().message().find(seq_text), std::string::npos) << rep.error().message();
    EXPECT_NE(rep.error().message().find(detail), std::string::npos) << rep.error().message();
    auto rec = js::recover(*journal_, "bad");
    ASSERT_FALSE(rec.ok());
    EXPECT_EQ(rec.error().code(), ErrorCode::corrupt_record);
    EXPECT_NE(rec.error().message().find(seq_text), std::string::npos) << rec.error().message();

    auto good = js::recover(*journal_, "good");
    ASSERT_TRUE(good.ok()) << good.error().to_string();
    EXPECT_EQ(seqs(good->events), range(3, 5));
    EXPECT_EQ(seqs(*js::replay(*journal_, "good")), range(1, 5));
    // The journal itself keeps working.
    EXPECT_TRUE(js::append(*journal_, batch("good", 6, 6)).ok());
  }

  std::shared_ptr<SqliteJournal> journal_;
};

// proves: X1
TEST_F(SqliteCorruption, a_null_type_is_corrupt_record_naming_the_id_and_seq) {
  expect_corrupt("UPDATE events SET type = NULL WHERE persistence_id = 'bad' AND seq = 3", 3, "type is NULL");
}

TEST_F(SqliteCorruption, a_payload_stored_as_text_is_corrupt_record) {
  expect_corrupt("UPDATE events SET payload = 'text' WHERE persistence_id = 'bad' AND seq = 2", 2,
                 "payload is TEXT, expected BLOB");
}

TEST_F(SqliteCorruption, a_timestamp_stored_as_real_is_corrupt_record) {
  expect_corrupt("UPDATE events SET timestamp_ms = 1.5 WHERE persistence_id = 'bad' AND seq = 4", 4,
                 "timestamp_ms is REAL");
}

TEST_F(SqliteCorruption, a_negative_version_is_corrupt_record) {
  expect_corrupt("UPDATE events SET version = -1 WHERE persistence_id = 'bad' AND seq = 5", 5, "version -1");
}

TEST_F(SqliteCorruption, a_version_above_32_bits_is_corrupt_record) {
  expect_corrupt("UPDATE events SET version = 4294967296 WHERE persistence_id = 'bad' AND seq = 1", 1,
                 "version 4294967296");
}

// proves: X1
TEST_F(SqliteCorruption, a_hole_in_the_middle_of_a_log_is_corrupt_record_naming_the_missing_seq) {
  expect_corrupt("DELETE FROM events WHERE persistence_id = 'bad' AND seq = 3", 3, "missing");
}

TEST_F(SqliteCorruption, a_hole_at_the_start_of_a_log_is_corrupt_record_unless_deleted) {
  expect_corrupt("DELETE FROM events WHERE persistence_id = 'bad' AND seq <= 2", 1, "missing");
  // Deleting the same range through the journal explains the hole.
  ASSERT_TRUE(js::delete_up_to(*journal_, "bad", 2).ok());
  EXPECT_EQ(seqs(*js::replay(*journal_, "bad")), range(3, 5));
}

TEST_F(SqliteCorruption, a_garbled_snapshot_is_corrupt_record_for_load_and_recover) {
  RawDb(path_).exec("UPDATE snapshots SET payload = NULL WHERE persistence_id = 'good'");
  auto load = js::load_snapshot(*journal_, "good");
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.error().code(), ErrorCode::corrupt_record);
  EXPECT_NE(load.error().message().find("snapshot of persistence id 'good' seq 2"), std::string::npos)
      << load.error().message();
  EXPECT_EQ(js::recover(*journal_, "good").error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(js::recover(*journal_, "bad").ok());
}

TEST_F(SqliteCorruption, a_garbled_deletion_mark_is_corrupt_record) {
  ASSERT_TRUE(js::delete_up_to(*journal_, "bad", 1).ok());
  RawDb(path_).exec("UPDATE deletions SET deleted_to = 'lots' WHERE persistence_id = 'bad'");
  auto h = js::highest_seq(*journal_, "bad");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code(), ErrorCode::corrupt_record);
  EXPECT_NE(h.error().message().find("'bad'"), std::string::npos) << h.error().message();
  EXPECT_EQ(js::replay(*journal_, "bad").error().code(), ErrorCode::corrupt_record);
  EXPECT_EQ(*js::highest_seq(*journal_, "good"), 5u);
}

// --- the global order (event_query.hpp, doc/journal.md "Global order") -------------------

std::vector<troupe::StreamEvent> query(troupe::Journal& j, troupe::EventSelector sel, troupe::JournalOffset after = {}) {
  auto r = js::query_events(j, troupe::EventQuery{std::move(sel), after, 1000});
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? std::move(r->events) : std::vector<troupe::StreamEvent>{};
}

std::vector<std::uint64_t> orderings(const std::vector<troupe::StreamEvent>& events) {
  std::vector<std::uint64_t> out;
  for (const auto& e : events) out.push_back(e.offset.ordering);
  return out;
}

// proves: R1
TEST_F(SqliteJournalTest, offsets_keep_growing_across_reopening_even_after_the_last_events_were_deleted) {
  using troupe::EventSelector;
  troupe::JournalOffset last{};
  {
    auto j = open();
    ASSERT_TRUE(js::append(*j, batch("t|a", 1, 3)).ok());
    auto all = query(*j, EventSelector::of_type("t"));
    ASSERT_EQ(all.size(), 3u);
    last = all.back().offset;
  }
  {
    auto j = open();
    ASSERT_TRUE(js::append(*j, batch("t|b", 1, 1)).ok());
    auto after = query(*j, EventSelector::of_type("t"), last);
    ASSERT_EQ(after.size(), 1u);
    EXPECT_LT(last, after[0].offset);
    last = after[0].offset;
    // Every event goes, the one holding the highest number too.
    ASSERT_TRUE(js::delete_up_to(*j, "t|a", 3).ok());
    ASSERT_TRUE(js::delete_up_to(*j, "t|b", 1).ok());
  }
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM events"), 0);
  auto j = open();
  EXPECT_TRUE(query(*j, EventSelector::of_type("t")).empty());
  ASSERT_TRUE(js::append(*j, batch("t|c", 1, 1)).ok());
  auto fresh = query(*j, EventSelector::of_type("t"), last);
  ASSERT_EQ(fresh.size(), 1u) << "a number of a deleted event was given again after reopening";
  EXPECT_LT(last, fresh[0].offset);
  EXPECT_EQ(fresh[0].persistence_id, "t|c");
}

// A query by type compares the ids' bytes with "<type>|" and "<type>}":
// ids whose names only start alike, or whose next byte sorts near '|', stay
// out; an id with no '|' is its own type.
TEST_F(SqliteJournalTest, a_query_by_type_keeps_the_ids_of_that_type_and_no_id_that_only_starts_alike) {
  using troupe::EventSelector;
  auto j = open();
  const std::vector<std::string> ids = {"pay",    "pa|y",  "pay|1",       "pay{",      "pay}",   "pay}|x",
                                        "pay||",  "pay~",  "payment|1",   "pa",        "pay\x7f|1",
                                        "pay \xc3\xa9|1", std::string("pay\0|1", 6), "pay|\xff"};
  for (const std::string& id : ids) ASSERT_TRUE(js::append(*j, batch(id, 1, 1)).ok()) << id;
  auto ids_of = [&](std::string type) {
    std::vector<std::string> out;
    for (const auto& e : query(*j, EventSelector::of_type(std::move(type)))) out.push_back(e.persistence_id);
    return out;
  };
  EXPECT_EQ(ids_of("pay"), (std::vector<std::string>{"pay", "pay|1", "pay||", "pay|\xff"}));
  EXPECT_EQ(ids_of("pay}"), (std::vector<std::string>{"pay}", "pay}|x"}));
  EXPECT_EQ(ids_of("pay{"), (std::vector<std::string>{"pay{"}));
  EXPECT_EQ(ids_of("pa"), (std::vector<std::string>{"pa|y", "pa"}));
  EXPECT_EQ(ids_of("pay \xc3\xa9"), (std::vector<std::string>{"pay \xc3\xa9|1"}));
  EXPECT_EQ(ids_of("payment"), (std::vector<std::string>{"payment|1"}));
  EXPECT_TRUE(ids_of("p").empty());
}

TEST_F(SqliteJournalTest, tags_are_stored_with_their_events_and_deleted_with_them) {
  using troupe::EventSelector;
  auto j = open();
  troupe::AppendBatch b = batch("p|1", 1, 3);
  b.events[0].tags = {"c-1", "eu"};
  b.events[2].tags = {"c-1", "c-1"};  // twice: stored as given, found once
  ASSERT_TRUE(js::append(*j, b).ok());
  ASSERT_TRUE(js::append(*j, [] {
                troupe::AppendBatch o = batch("p|2", 1, 1);
                o.events[0].tags = {"c-1"};
                return o;
              }()).ok());
  EXPECT_EQ(orderings(query(*j, EventSelector::with_tag("c-1"))), (std::vector<std::uint64_t>{1, 3, 4}));
  EXPECT_EQ(js::replay(*j, "p|1")->at(2).tags, (std::vector<std::string>{"c-1", "c-1"}));
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM event_tags"), 4);
  ASSERT_TRUE(js::delete_up_to(*j, "p|1", 2).ok());
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM event_tags"), 2) << "the tags of deleted events stay behind";
  EXPECT_EQ(orderings(query(*j, EventSelector::with_tag("c-1"))), (std::vector<std::uint64_t>{3, 4}));
  EXPECT_TRUE(query(*j, EventSelector::with_tag("eu")).empty());
  // A tagged batch is atomic: a conflict in its second event stores no tag.
  troupe::AppendBatch clash = batch("p|2", 2, 3);
  clash.events[0].tags = {"late"};
  RawDb(path_).exec("INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload) "
                    "VALUES ('p|2', 3, 0, 'x', 0, x'00')");
  EXPECT_EQ(js::append(*j, clash).error().code(), ErrorCode::journal_conflict);
  EXPECT_EQ(RawDb(path_).count("SELECT count(*) FROM event_tags WHERE tag = 'late'"), 0);
}

// The queries read in the global order, from the offset on: by type the
// rowids (not the (persistence_id, seq) index, which would need a sort), by
// tag event_tags' key. No full scan, no sort. With statistics saying the
// ids are many and short, as in a journal of many entities, SQLite would
// pick that index for a plain comparison on persistence_id.
TEST_F(SqliteJournalTest, queries_read_by_type_along_the_rowids_and_by_tag_through_its_index_in_order) {
  {
    auto j = open();
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(js::append(*j, batch("t|" + std::to_string(i), 1, 1)).ok());
  }
  RawDb(path_).exec("ANALYZE");
  const std::vector<std::pair<const char*, std::vector<std::string>>> expected = {
      {troupe::sqlite::kQueryByType, {"SEARCH events USING INTEGER PRIMARY KEY (rowid>?)"}},
      {troupe::sqlite::kQueryByTag,
       {"SEARCH t USING PRIMARY KEY (tag=? AND ordering>?)", "SEARCH e USING INTEGER PRIMARY KEY (rowid=?)"}},
  };
  for (const auto& [sql, parts] : expected) {
    std::string plan;
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(raw, (std::string("EXPLAIN QUERY PLAN ") + sql).c_str(), -1, &s, nullptr), SQLITE_OK)
        << sqlite3_errmsg(raw);
    while (sqlite3_step(s) == SQLITE_ROW) plan += std::string(reinterpret_cast<const char*>(sqlite3_column_text(s, 3))) + "; ";
    sqlite3_finalize(s);
    sqlite3_close_v2(raw);
    EXPECT_EQ(plan.find("SCAN"), std::string::npos) << plan;
    EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << plan;
    for (const std::string& part : parts) EXPECT_NE(plan.find(part), std::string::npos) << plan;
  }
}

// proves: R1
TEST_F(SqliteJournalTest, a_journal_of_schema_2_is_migrated_on_open_keeping_its_rowids_as_the_order) {
  {
    RawDb db(path_);
    write_old_layout(db, 2);
    db.exec("INSERT INTO events (rowid, persistence_id, seq, timestamp_ms, type, version, payload, trace_id) VALUES "
            "(5, 'pay|a', 1, 11, 'x', 1, x'01', '4bf92f3577b34da6a3ce929d0e0e4736'), "
            "(7, 'plain', 1, 12, 'x', 1, x'02', NULL), "
            "(9, 'pay|a', 2, 13, 'x', 1, x'03', NULL), "
            "(12, 'pay|b|c', 1, 14, 'x', 1, x'', NULL)");
    db.exec("INSERT INTO events (rowid, persistence_id, seq, timestamp_ms, type, version, payload) "
            "VALUES (20, CAST(x'6e756c007c31' AS TEXT), 1, 0, 'x', 0, x'04')");
    db.exec("INSERT INTO deletions VALUES ('old|d', 4)");
    db.exec("INSERT INTO snapshots VALUES ('pay|a', 1, 0, 'S', 1, x'05')");
  }
  auto j = open();
  ASSERT_TRUE(j);
  EXPECT_EQ(RawDb(path_).count("PRAGMA user_version"), 3);
  using troupe::EventSelector;
  auto pay = query(*j, EventSelector::of_type("pay"));
  EXPECT_EQ(orderings(pay), (std::vector<std::uint64_t>{5, 9, 12}));
  ASSERT_EQ(pay.size(), 3u);
  EXPECT_EQ(pay[0].persistence_id, "pay|a");
  EXPECT_EQ(pay[0].event.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(pay[0].event.payload, "\x01");
  EXPECT_TRUE(pay[0].event.tags.empty());
  EXPECT_EQ(pay[2].persistence_id, "pay|b|c");
  EXPECT_EQ(orderings(query(*j, EventSelector::of_type("plain"))), (std::vector<std::uint64_t>{7}));
  // An id holding a NUL byte keeps all its bytes.
  EXPECT_EQ(RawDb(path_).count("SELECT ordering FROM events WHERE persistence_id = CAST(x'6e756c007c31' AS TEXT)"),
            20);
  EXPECT_EQ(js::replay(*j, std::string("nul\0|1", 6))->size(), 1u);
  auto rec = js::recover(*j, "pay|a");
  ASSERT_TRUE(rec.ok()) << rec.error().to_string();
  EXPECT_EQ(rec->snapshot->seq, 1u);
  EXPECT_EQ(seqs(rec->events), range(2, 2));
  EXPECT_EQ(*js::highest_seq(*j, "old|d"), 4u);
  // New events follow the old ones, tags and all.
  troupe::AppendBatch b = batch("pay|a", 3, 3);
  b.events[0].tags = {"new"};
  ASSERT_TRUE(js::append(*j, b).ok());
  EXPECT_EQ(orderings(query(*j, EventSelector::of_type("pay"), {0, 12})), (std::vector<std::uint64_t>{21}));
  EXPECT_EQ(orderings(query(*j, EventSelector::with_tag("new"))), (std::vector<std::uint64_t>{21}));
  EXPECT_EQ(js::append(*j, batch("pay|a", 2, 2)).error().code(), ErrorCode::journal_conflict);
}

TEST_F(SqliteCorruption, a_garbled_row_in_a_query_is_corrupt_record_naming_the_id_and_seq) {
  using troupe::EventSelector;
  auto expect_query_corrupt = [&](const std::string& sql, EventSelector sel, const std::string& detail) {
    RawDb(path_).exec(sql);
    auto r = js::query_events(*journal_, troupe::EventQuery{sel, {}, 100});
    ASSERT_FALSE(r.ok()) << sql;
    EXPECT_EQ(r.error().code(), ErrorCode::corrupt_record) << r.error().to_string();
    EXPECT_NE(r.error().message().find("'bad' seq 2"), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find(detail), std::string::npos) << r.error().message();
    EXPECT_EQ(query(*journal_, EventSelector::of_type("good")).size(), 5u);
  };
  expect_query_corrupt("UPDATE events SET payload = 'text' WHERE persistence_id = 'bad' AND seq = 2",
                       EventSelector::of_type("bad"), "payload is TEXT");
  RawDb(path_).exec("UPDATE events SET payload = x'00' WHERE persistence_id = 'bad' AND seq = 2");
  ASSERT_EQ(query(*journal_, EventSelector::of_type("bad")).size(), 5u);
  RawDb(path_).exec("INSERT INTO event_tags SELECT 'c', ordering FROM events WHERE persistence_id = 'bad'");
  expect_query_corrupt("UPDATE events SET tags = x'63' WHERE persistence_id = 'bad' AND seq = 2",
                       EventSelector::with_tag("c"), "tags is BLOB");
  expect_query_corrupt("UPDATE events SET tags = 'c' || char(10) || char(10) WHERE persistence_id = 'bad' AND seq = 2",
                       EventSelector::of_type("bad"), "an empty tag");
  expect_query_corrupt("UPDATE events SET tags = 'c' || char(9) WHERE persistence_id = 'bad' AND seq = 2",
                       EventSelector::with_tag("c"), "control character");
  auto rep = js::replay(*journal_, "bad");
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.error().message().find("'bad' seq 2: tags"), std::string::npos) << rep.error().message();
}

// --- crash consistency ---------------------------------------------------------------

#ifdef TROUPE_CRASH_WRITER

using troupe::test::crash_payload;  // what journal_crash_writer writes

// Runs the writer on `path` until it has acknowledged at least `min_acks`
// events and `min_time` has passed, SIGKILLs it, and returns every
// acknowledgement it wrote (the ones still in the pipe included). Returns
// false if the writer died by itself.
bool run_and_kill_writer(const std::string& path, std::size_t min_acks, std::chrono::milliseconds min_time,
                         std::map<std::string, std::uint64_t>& acked, std::size_t& acks) {
  std::string exe = TROUPE_CRASH_WRITER;
  std::vector<std::string> args = {exe, path, "4", "16"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string buffer;
  std::map<std::string, std::uint64_t> this_round;  // a restarted writer may skip unacknowledged numbers
  auto consume = [&] {
    std::size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::istringstream line(buffer.substr(0, nl));
      buffer.erase(0, nl + 1);
      std::string id;
      std::uint64_t seq = 0;
      line >> id >> seq;
      auto& last = this_round[id];
      if (last != 0) {
        EXPECT_EQ(seq, last + 1) << "acknowledged out of order for " << id;
      }
      last = seq;
      auto& highest = acked[id];
      EXPECT_GT(seq, highest) << "acknowledged twice for " << id;
      highest = std::max(highest, seq);
      ++acks;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  const std::size_t acks_before = acks;
  bool died = false;
  char chunk[4096];
  while (acks - acks_before < min_acks || std::chrono::steady_clock::now() - start < min_time) {
    if (std::chrono::steady_clock::now() - start > 60s) break;
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(fds[0], chunk, sizeof chunk);
    if (n <= 0) {
      died = true;
      break;
    }
    buffer.append(chunk, static_cast<std::size_t>(n));
    consume();
  }
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  // What was written before the kill was acknowledged: it counts.
  ssize_t n;
  while ((n = read(fds[0], chunk, sizeof chunk)) > 0) {
    buffer.append(chunk, static_cast<std::size_t>(n));
    consume();
  }
  close(fds[0]);
  return !died && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// proves: E7
TEST_F(SqliteJournalTest, e7_every_acknowledged_event_survives_a_sigkill_and_no_log_has_a_gap) {
  std::map<std::string, std::uint64_t> acked;  // id -> highest acknowledged seq
  std::size_t acks = 0;
  for (int round = 0; round < 3; ++round) {
    // Each round restarts the writer on the same file: it continues every
    // log from the highest number the previous, killed, writer left.
    ASSERT_TRUE(run_and_kill_writer(path_, 2000, 300ms, acked, acks)) << "the writer died before the kill";
    auto j = open();
    ASSERT_TRUE(j);
    for (const auto& [id, highest_acked] : acked) {
      auto rec = js::recover(*j, id);
      ASSERT_TRUE(rec.ok()) << rec.error().to_string();
      EXPECT_GE(rec->highest_seq, highest_acked) << id << ": an acknowledged event was lost";
      ASSERT_EQ(rec->events.size(), rec->highest_seq) << id << ": the log has a gap";
      for (std::size_t i = 0; i < rec->events.size(); ++i) {
        const EventRecord& e = rec->events[i];
        ASSERT_EQ(e.seq, i + 1) << id;
        ASSERT_EQ(e.payload, crash_payload(id, e.seq)) << id;
        ASSERT_EQ(e.type, "crash.Event");
      }
    }
  }
  EXPECT_EQ(acked.size(), 64u);
  EXPECT_GE(acks, 6000u);
}

#endif  // TROUPE_CRASH_WRITER

}  // namespace

// The turns of one file's writers in this process: one object per file
// however it is named, one holder at a time, served in the order asked.
TEST(SqliteWriteTurns, one_file_has_one_set_of_turns_taken_in_the_order_asked) {
  TempDir dir;
  const std::string path = dir.file("turns.db");
  std::ofstream(path).put('x');
  auto a = troupe::sqlite::write_turns(path);
  auto b = troupe::sqlite::write_turns(dir.path().string() + "/./turns.db");
  EXPECT_EQ(a.get(), b.get()) << "two names of one file";
  EXPECT_NE(a.get(), troupe::sqlite::write_turns(dir.file("other.db")).get());

  std::mutex mu;
  std::vector<int> order;
  a->take();  // held while the others line up
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      troupe::sqlite::WriteTurns::Turn turn(a.get());
      std::lock_guard lk(mu);
      order.push_back(i);
    });
    // The next waiter asks only once this one waits (its ticket is drawn).
    std::this_thread::sleep_for(50ms);
  }
  {
    std::lock_guard lk(mu);
    EXPECT_TRUE(order.empty()) << "a turn was taken while another was held";
  }
  a->give_back();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}
