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
//
// Exit codes: 2 bad arguments, 3 an append or the open failed (message on
// stderr). It never exits on its own otherwise.

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/persist/sqlite_journal.hpp"

namespace {

std::string crash_payload(const std::string& id, std::uint64_t seq) {
  // ~64 bytes, different for every event.
  std::string p = id + "#" + std::to_string(seq) + ":";
  while (p.size() < 64) p += static_cast<char>('a' + (p.size() + seq) % 26);
  return p;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "journal_crash_writer: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

// One write(2) per acknowledged batch: a pipe write of under PIPE_BUF bytes
// is atomic, so lines from different threads never interleave.
void acknowledge(const std::string& lines) {
  std::size_t done = 0;
  while (done < lines.size()) {
    ssize_t n = ::write(STDOUT_FILENO, lines.data() + done, lines.size() - done);
    if (n <= 0) std::_Exit(4);  // the reader is gone
    done += static_cast<std::size_t>(n);
  }
}

void run_thread(troupe::Journal& journal, int t, int ids) {
  std::vector<std::string> names;
  std::vector<std::uint64_t> next;
  for (int k = 0; k < ids; ++k) {
    names.push_back("crash|" + std::to_string(t) + "-" + std::to_string(k));
    auto h = troupe::journal_sync::highest_seq(journal, names.back());
    if (!h.ok()) die(h.error().to_string());
    next.push_back(*h + 1);
  }
  std::mutex mu;
  std::condition_variable cv;
  for (std::uint64_t round = 0;; ++round) {
    int pending = ids;
    for (int k = 0; k < ids; ++k) {
      troupe::AppendBatch b;
      b.persistence_id = names[static_cast<std::size_t>(k)];
      std::uint64_t first = next[static_cast<std::size_t>(k)];
      std::uint64_t count = 1 + (first + round) % 3;
      for (std::uint64_t s = first; s < first + count; ++s) {
        troupe::EventRecord e;
        e.seq = s;
        e.timestamp_ms = static_cast<std::int64_t>(s);
        e.type = "crash.Event";
        e.version = 1;
        e.payload = crash_payload(b.persistence_id, s);
        b.events.push_back(std::move(e));
      }
      next[static_cast<std::size_t>(k)] = first + count;
      std::string id = b.persistence_id;
      journal.append(std::move(b), [&, id, first, count](troupe::Result<void> r) {
        if (!r.ok()) die("append to " + id + " failed: " + r.error().to_string());
        std::string lines;
        for (std::uint64_t s = first; s < first + count; ++s) lines += id + " " + std::to_string(s) + "\n";
        acknowledge(lines);
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
  for (int t = 0; t < threads; ++t) workers.emplace_back(run_thread, std::ref(**journal), t, ids);
  for (auto& w : workers) w.join();  // never returns: the test kills us
  return 0;
}
