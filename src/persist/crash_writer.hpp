#pragma once
// What a crash writer (a process a test SIGKILLs while it appends) does:
// each of its threads owns <ids> persistence ids ("crash|<t>-<k>") and, in
// rounds, appends one batch of 1..3 events to each of them, all in flight
// together, then waits for the round's callbacks. Every event carries the
// tag "crash-<seq % 2>". It continues every log from the highest stored
// number, so it can be restarted on the same journal. Every acknowledged
// event is written to stdout as "<id> <seq>\n" inside the callback that
// reported success, and only there: a line is a promise that the event is
// stored. Payloads are crash_payload(id, seq), which tests check byte for
// byte. Header-only; used by pg_crash_writer_main.cpp and its test.

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe::test {

inline std::string crash_payload(const std::string& id, std::uint64_t seq) {
  std::string p = id + "#" + std::to_string(seq) + ":";
  while (p.size() < 64) p += static_cast<char>('a' + (p.size() + seq) % 26);
  return p;
}

// Exit code 3: an append or the open failed.
[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "crash writer: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

// One write(2) per acknowledged batch (under PIPE_BUF: atomic), so lines of
// different threads never interleave. Exit code 4: stdout is closed.
inline void acknowledge(const std::string& lines) {
  std::size_t done = 0;
  while (done < lines.size()) {
    ssize_t n = ::write(STDOUT_FILENO, lines.data() + done, lines.size() - done);
    if (n <= 0) std::_Exit(4);
    done += static_cast<std::size_t>(n);
  }
}

inline void run_crash_writer_thread(troupe::Journal& journal, int t, int ids) {
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
      const std::uint64_t first = next[static_cast<std::size_t>(k)];
      const std::uint64_t count = 1 + (first + round) % 3;
      for (std::uint64_t s = first; s < first + count; ++s) {
        troupe::EventRecord e;
        e.seq = s;
        e.timestamp_ms = static_cast<std::int64_t>(s);
        e.type = "crash.Event";
        e.version = 1;
        e.payload = crash_payload(b.persistence_id, s);
        e.tags = {"crash-" + std::to_string(s % 2)};
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

}  // namespace troupe::test
