// pg_crash_writer: appends to a PostgreSQL journal with several writer
// lanes until killed.
//
//   pg_crash_writer <conninfo> <schema> <lanes> <threads> <ids per thread>
//
// What its threads append and print: ../crash_writer.hpp. The kill -9 test
// in postgres_query.test.cpp SIGKILLs it while reading the journal's global
// order, and holds the order to the stored logs.
//
// Exit codes: 2 bad arguments, 3 an append or the open failed (message on
// stderr), 4 stdout closed. It never exits on its own otherwise.

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../crash_writer.hpp"
#include "troupe/persist/postgres_journal.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s <conninfo> <schema> <lanes> <threads> <ids per thread>\n", argv[0]);
    return 2;
  }
  const int lanes = std::atoi(argv[3]), threads = std::atoi(argv[4]), ids = std::atoi(argv[5]);
  if (lanes < 1 || threads < 1 || ids < 1) {
    std::fprintf(stderr, "pg_crash_writer: lanes, threads and ids must be positive\n");
    return 2;
  }
  troupe::PostgresJournalOptions options;
  options.conninfo = argv[1];
  options.schema = argv[2];
  options.writer_connections = static_cast<unsigned>(lanes);
  auto journal = troupe::PostgresJournal::open(options);
  if (!journal.ok()) troupe::test::die(journal.error().to_string());
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back(troupe::test::run_crash_writer_thread, std::ref(**journal), t, ids);
  for (auto& w : workers) w.join();  // never returns: the test kills us
  return 0;
}
