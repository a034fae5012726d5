// projection_crash_child: appends events and runs a projection over them
// until killed; projection_crash.test.cpp SIGKILLs it again and again and
// holds the read model to the journal after every kill.
//
//   projection_crash_child sqlite <journal file> <role> <prefix>
//   projection_crash_child postgres <conninfo> <schema> <role> <prefix>
//
// role: "both" (writers and the projection), "writer" (writers only: a
// second process appending to the same journal at the same time).
// Writers: 4 threads, each owning 8 ids "crash|<prefix>-<t>-<k>" (entity
// type "crash"), appending batches of 1..3 events in rounds and continuing
// every log from its highest stored number. The projection ("fold" over type "crash")
// inserts each event into `applied` (primary key id, seq: a second
// application fails its page) and adds it to `totals`, in the same database
// as the journal (the journal's SQLite file; its PostgreSQL schema).
// Exit codes: 2 bad arguments, 3 a failure (message on stderr).

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "projection_crash_fold.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "projection_crash_child: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

void write_forever(troupe::Journal& journal, const std::string& prefix, int t) {
  constexpr int kIds = 8;
  std::vector<std::string> ids;
  std::vector<std::uint64_t> next;
  for (int k = 0; k < kIds; ++k) {
    ids.push_back("crash|" + prefix + "-" + std::to_string(t) + "-" + std::to_string(k));
    auto h = troupe::journal_sync::highest_seq(journal, ids.back());
    if (!h) die(h.error().to_string());
    next.push_back(*h + 1);
  }
  std::mutex mu;
  std::condition_variable cv;
  for (std::uint64_t round = 0;; ++round) {
    int pending = kIds;
    for (int k = 0; k < kIds; ++k) {
      troupe::AppendBatch b;
      b.persistence_id = ids[static_cast<std::size_t>(k)];
      const std::uint64_t first = next[static_cast<std::size_t>(k)];
      const std::uint64_t count = 1 + (first + round) % 3;
      for (std::uint64_t s = first; s < first + count; ++s)
        b.events.push_back(troupe::test::fold_event(b.persistence_id, s));
      next[static_cast<std::size_t>(k)] = first + count;
      journal.append(std::move(b), [&](troupe::Result<void> r) {
        if (!r) die("append: " + r.error().to_string());
        std::lock_guard lk(mu);
        if (--pending == 0) cv.notify_one();
      });
    }
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return pending == 0; });
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return 2;
  const std::string backend = argv[1];
  std::shared_ptr<troupe::Journal> journal;
  int next_arg = 3;
  if (backend == "sqlite") {
    auto j = troupe::SqliteJournal::open({.path = argv[2]});
    if (!j) die(j.error().to_string());
    journal = *j;
  } else if (backend == "postgres" && argc >= 6) {
    troupe::PostgresJournalOptions o;
    o.conninfo = argv[2];
    o.schema = argv[3];
    o.writer_connections = 4;
    auto j = troupe::PostgresJournal::open(o);
    if (!j) die(j.error().to_string());
    journal = *j;
    next_arg = 4;
  } else {
    return 2;
  }
  const std::string role = argv[next_arg];
  const std::string prefix = argv[next_arg + 1];

  troupe::ActorSystem system(troupe::SystemConfig{.threads = 2});
  std::optional<troupe::test::FoldProjection> projection;
  if (role == "both") {
    auto p = backend == "sqlite" ? troupe::test::start_fold(system, journal, argv[2])
                                 : troupe::test::start_fold(system, journal, argv[2], argv[3]);
    if (!p) die("projection: " + p.error().to_string());
    projection.emplace(std::move(*p));
  } else if (role != "writer") {
    return 2;
  }
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) writers.emplace_back([&, t] { write_forever(*journal, prefix, t); });
  for (;;) pause();
}
