// journal_crash_writer: appends to an SQLite journal until killed.
//
//   journal_crash_writer <db path> <threads> <ids per thread>
//
// Each thread owns <ids per thread> persistence ids ("crash|<t>-<k>") and, in
// rounds, appends one batch of 1..3 events to each of them, all in flight
// together, then waits for the round's callbacks. It continues every log
// from the highest stored number, so it can be restarted on the same file.
// Every acknowledged event is written to stdout as "<id> <seq>\n" inside
// the callback that reported success, and only there: a line on stdout is a
// promise that the event survives (SPEC E7). The crash test in
// sqlite_journal.test.cpp SIGKILLs this process and holds the journal to it.
// Payloads are crash_payload(id, seq), which the test checks byte for byte.
// The writing itself is crash_writer.hpp's, shared with the PostgreSQL one.
//
// Exit codes: 2 bad arguments, 3 an append or the open failed (message on
// stderr). It never exits on its own otherwise.

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "../crash_writer.hpp"
#include "troupe/persist/sqlite_journal.hpp"

using troupe::test::die;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <db path> <threads> <ids per thread>\n", argv[0]);
    return 2;
  }
  int threads = std::atoi(argv[2]);
  int ids = std::atoi(argv[3]);
  if (threads < 1 || ids < 1) {
    std::fprintf(stderr, "journal_crash_writer: threads and ids must be positive\n");
    return 2;
  }
  troupe::SqliteJournalOptions options;
  options.path = argv[1];
  options.durability = troupe::Durability::full;
  auto journal = troupe::SqliteJournal::open(options);
  if (!journal.ok()) die(journal.error().to_string());
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back(troupe::test::run_crash_writer_thread, std::ref(**journal), t, ids);
  for (auto& w : workers) w.join();  // never returns: the test kills us
  return 0;
}
