#pragma once
// journal_append_N and journal_append_pg_N, shared by
// bench/troupe/journal_append.cpp and its raw peers (bench/peers/sqlite for
// SqliteJournal, bench/peers/pg_raw for PostgresJournal): N entities append
// concurrently, each with exactly one append of one event in flight; the
// metric is durable (acknowledged, fsynced) events per second.
//
// Both sides use the same rows (persistence id "bench|<i>", seq 1, 2, ...,
// type "Deposited" version 1, a 64-byte payload), the same database (a
// temporary SQLite file; for PostgreSQL a fresh database on the server
// bench/run starts, named by kPgConninfoEnv) and the same measurement
// (AckMeter): acknowledged events per second across a fixed window after a
// warm-up.

#include <stdlib.h>  // mkdtemp

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "common/report.hpp"

namespace bench {

inline constexpr long kJournalWarmupMs = 500;
inline constexpr long kJournalWindowMs = 2000;
inline constexpr std::size_t kJournalPayloadBytes = 64;
inline constexpr const char* kJournalEventType = "Deposited";
inline constexpr std::uint32_t kJournalEventVersion = 1;
// SqliteJournalOptions::max_batch_events' default: at most this many events
// per transaction on both sides.
// PostgresJournalOptions::max_batch_events has the same default.
inline constexpr std::size_t kJournalMaxBatchEvents = 16384;
// The connections PostgresJournal writes through: its writer lanes, one
// connection each (PostgresJournalOptions::writer_connections' default, in
// include/troupe/persist/postgres_journal.hpp; its reader connections play
// no part in appending). The raw peer writes through as many. Keep in step
// with the journal.
inline constexpr int kPgWriterConnections = 1;
// The libpq connection string of the database a journal_append_pg_N process
// writes; bench/run sets it (see bench/peers/README.md, "PostgreSQL").
inline constexpr const char* kPgConninfoEnv = "TROUPE_BENCH_PG_CONNINFO";

inline std::string journal_persistence_id(long entity) { return "bench|" + std::to_string(entity); }

inline std::string journal_payload() {
  std::string p(kJournalPayloadBytes, '\0');
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>('a' + i % 26);
  return p;
}

inline std::int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] inline void journal_fail(const char* side, const std::string& what) {
  std::fprintf(stderr, "%s: journal_append: %s\n", side, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const char* side) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-bench-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) journal_fail(side, "cannot create a directory from " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline constexpr std::string_view kJournalSqlitePrefix = "journal_append_";
inline constexpr std::string_view kJournalPgPrefix = "journal_append_pg_";

// Parses "<prefix><N>" (N >= 1; the prefix "journal_append_" or
// "journal_append_pg_"); returns 0 for anything else.
inline long journal_entities(const std::string& workload, std::string_view prefix = kJournalSqlitePrefix) {
  if (workload.compare(0, prefix.size(), prefix) != 0 || workload.size() == prefix.size()) return 0;
  long n = 0;
  for (std::size_t i = prefix.size(); i < workload.size(); ++i) {
    char c = workload[i];
    if (c < '0' || c > '9' || n > 100'000'000) return 0;
    n = n * 10 + (c - '0');
  }
  return n;
}

// main() of a raw peer, `<side> <prefix><N>`: runs `run(N)`; a wrong
// argument -> usage on stderr, exit 2.
template <class Run>
int journal_peer_main(int argc, char** argv, const char* side, std::string_view prefix, Run run) {
  const long entities = argc == 2 ? journal_entities(argv[1], prefix) : 0;
  if (entities == 0) {
    if (argc == 2) std::fprintf(stderr, "%s: unknown workload '%s'\n", side, argv[1]);
    std::fprintf(stderr, "usage: %s %.*s<N>  (N = 1, 100, 10000)\n", side, static_cast<int>(prefix.size()),
                 prefix.data());
    return 2;
  }
  run(entities);
  return 0;
}

// The connection string from kPgConninfoEnv, or fails saying it is missing.
inline std::string pg_conninfo(const char* side) {
  const char* c = std::getenv(kPgConninfoEnv);
  if (c == nullptr || *c == '\0')
    journal_fail(side, std::string(kPgConninfoEnv) +
                           " is not set: bench/run starts a PostgreSQL server and sets it (bench/peers/README.md)");
  return c;
}

// Acknowledged events and when the latest of them was acknowledged. Both
// sides call add() when appends are acknowledged (the troupe side once per
// event, from the journal's callbacks; the raw peer once per commit).
class AckMeter {
 public:
  using Clock = std::chrono::steady_clock;

  void add(std::uint64_t events) {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    count_ += events;
    last_ = now;
  }

  std::uint64_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

  // Waits out the warm-up, then measures across the window: events
  // acknowledged between the last acknowledgement before the window opens
  // and the last one before it closes, divided by the time between those
  // two acknowledgements. Measuring between acknowledgements (not between
  // the sampling instants) keeps commits of thousands of events from
  // quantising the result. Waits past the window until at least one more
  // acknowledgement arrived.
  double measure() const {
    using std::chrono::milliseconds;
    std::this_thread::sleep_for(milliseconds(kJournalWarmupMs / scale()));
    const auto [c0, t0] = sample();
    std::this_thread::sleep_for(milliseconds(kJournalWindowMs / scale()));
    auto [c1, t1] = sample();
    while (c1 == c0) {
      std::this_thread::sleep_for(milliseconds(10));
      std::tie(c1, t1) = sample();
    }
    return static_cast<double>(c1 - c0) / std::chrono::duration<double>(t1 - t0).count();
  }

 private:
  std::pair<std::uint64_t, Clock::time_point> sample() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {count_, last_};
  }

  mutable std::mutex mu_;
  std::uint64_t count_ = 0;
  Clock::time_point last_ = Clock::now();
};

}  // namespace bench
