#pragma once
// The activation log of the singleton process tests and its checker (SPEC
// R3). Every instance appends lines to one shared file, opened with
// O_APPEND in each node process, so what an instance did survives its
// process's SIGKILL:
//
//   start <node> <pid> <epoch> <wall us>    when it started
//   alive <node> <pid> <epoch> <wall us>    every few ms while it runs
//   stop  <node> <pid> <epoch> <wall us>    when it stopped (not after a SIGKILL)
//
// The checker turns the lines into lives and names every way the run broke
// "never two at once": two lives that overlap (one's start lies before the
// other's last line, or the V1 activation rule of history_checker.hpp over
// the driver's kill times finds them active together), epochs that do not
// grow in the order of the starts, and kills after which no new instance
// started within the failover bound. Pure functions; header-only, for test
// binaries only.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../sharding/history_checker.hpp"

namespace troupe::cluster::singleton_test {

using proc::NodeSignal;
using proc::WallUs;

// One instance, from its start line to its last line.
struct Life {
  std::string node;
  long pid = 0;
  std::uint64_t epoch = 0;
  WallUs started = 0;
  WallUs last = 0;                // its last line (start, alive or stop)
  std::optional<WallUs> stopped;  // its stop line; nullopt: killed (or still running)
};

// Appends one line with a single write(2): lines from many processes never
// interleave.
inline void append_line(int fd, const std::string& kind, const std::string& node, std::uint64_t epoch) {
  std::string line = kind + " " + node + " " + std::to_string(getpid()) + " " + std::to_string(epoch) + " " +
                     std::to_string(proc::wall_now_us()) + "\n";
  (void)::write(fd, line.data(), line.size());
}

// The lives in a log, in the order of their start lines. Lines that do not
// parse are skipped; lines of an instance whose start line is missing start
// it at their time.
inline std::vector<Life> read_lives(std::istream& in) {
  std::map<std::tuple<std::string, long, std::uint64_t>, Life> by_key;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string kind;
    Life l;
    WallUs at = 0;
    if (!(s >> kind >> l.node >> l.pid >> l.epoch >> at)) continue;
    auto [it, fresh] = by_key.try_emplace({l.node, l.pid, l.epoch}, l);
    Life& x = it->second;
    if (fresh || kind == "start") x.started = fresh ? at : std::min(x.started, at);
    x.last = std::max(x.last, at);
    if (kind == "stop") x.stopped = at;
  }
  std::vector<Life> out;
  for (auto& [k, l] : by_key) out.push_back(l);
  std::sort(out.begin(), out.end(), [](const Life& a, const Life& b) { return a.started < b.started; });
  return out;
}

inline std::string describe(const Life& l) {
  return l.node + " (pid " + std::to_string(l.pid) + ", epoch " + std::to_string(l.epoch) + ")";
}

// "Never two at once": the violations, each a sentence. `taken` is when the
// log was read (the end of a life still running).
inline std::vector<std::string> check_lives(const std::vector<Life>& lives, const std::vector<NodeSignal>& signals,
                                            WallUs taken) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < lives.size(); ++i) {
    for (std::size_t j = i + 1; j < lives.size(); ++j) {
      const Life& a = lives[i];
      const Life& b = lives[j];  // started no earlier than a
      if (a.last >= b.started)
        out.push_back(describe(a) + " still ran " + proc::detail_history::ms_text(a.last - b.started) + " after " +
                      describe(b) + " started: two instances at once");
    }
    if (i > 0 && lives[i].epoch <= lives[i - 1].epoch)
      out.push_back(describe(lives[i]) + " started after " + describe(lives[i - 1]) + " with an epoch not above it");
  }
  // The V1 rule over the driver's kill times (no margin: a singleton may
  // not overlap at all).
  std::vector<proc::Activation> acts;
  for (const auto& l : lives)
    acts.push_back(proc::Activation{"singleton", l.node, l.pid, l.epoch, l.started, l.stopped});
  for (auto& v : proc::check_activations(acts, signals, taken, std::chrono::milliseconds(0))) out.push_back(v);
  return out;
}

// After each SIGKILL of the process running the singleton, a new instance
// (on another process) starts within `bound`.
inline std::vector<std::string> check_failover(const std::vector<Life>& lives, const std::vector<NodeSignal>& kills,
                                               std::chrono::milliseconds bound) {
  std::vector<std::string> out;
  const WallUs bound_us = std::chrono::duration_cast<std::chrono::microseconds>(bound).count();
  for (const auto& k : kills) {
    if (k.kind != NodeSignal::Kind::kill) continue;
    auto ran = std::find_if(lives.begin(), lives.end(), [&](const Life& l) {
      return l.pid == k.pid && l.started <= k.at && !l.stopped;
    });
    if (ran == lives.end()) continue;  // it did not run the singleton when killed
    auto next = std::find_if(lives.begin(), lives.end(), [&](const Life& l) { return l.started > k.at; });
    if (next == lives.end())
      out.push_back("no instance started after " + k.node + " (pid " + std::to_string(k.pid) + ") was killed");
    else if (next->started - k.at > bound_us)
      out.push_back(describe(*next) + " started " + proc::detail_history::ms_text(next->started - k.at) + " after " +
                    k.node + " was killed, past the failover bound of " + proc::detail_history::ms_text(bound_us));
  }
  return out;
}

}  // namespace troupe::cluster::singleton_test
