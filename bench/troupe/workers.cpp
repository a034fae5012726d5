// workers_sync, workers_failover, workers_rebalance: worker placement
// (Coordinator::sync, serve, takeover, rebalance; SPEC W1-W7) measured on
// separate node processes, troupe only. Each run gets a fresh redis-server
// from bench/run (TROUPE_BENCH_REDIS_PORT, no persistence). This process
// writes the units file and starts three (then four) copies of its own
// binary as nodes (workers_node.cpp): each runs one Coordinator serving the
// group "devices" (heartbeat 250 ms, liveness threshold 2 s, takeover
// margin 0.25 s, sync interval 1 s; workers_settings.hpp) and reports every
// start and stop of a unit with its CLOCK_MONOTONIC time. node-1 is the
// manager: it syncs the group from the file (placement_source.hpp's file
// source) and calls the rebalance. Times are taken from those timestamps,
// not from when this process noticed; each row checks its outcome and fails
// (exit 1, naming what went wrong) instead of reporting a number when a node
// does not converge within 60 s or a unit ran on two nodes at once.
//
//   workers_sync        10,000 units synced; then the file gets 1,000 new
//                       units and loses 1,000. workers_sync: seconds from the
//                       file's change until every node runs exactly the new
//                       set (each unit on one node); _intervals: the same in
//                       sync intervals; _initial: seconds from the first sync
//                       until the 10,000 run.
//   workers_failover    10,000 units on 3 nodes; kill -9 of node-2 (about a
//                       third). workers_failover: seconds from the kill until
//                       the last of its units runs on a live node;
//                       _doubles: units that ran on two nodes at once (a
//                       killed node's units count as running until it was
//                       reaped): 0, or the run fails.
//   workers_rebalance   10,000 units on 3 nodes; node-4 joins; one
//                       rebalance. _moves: the moves it made; _min_moves: the
//                       fewest that reach max - min <= 1 from the counts
//                       before; workers_rebalance: seconds from the call until
//                       the last moved unit runs on its new owner;
//                       _early_starts: moved units started on the new owner
//                       before the old owner's stop completed: 0, or the run
//                       fails.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/report.hpp"
#include "workers_fleet.hpp"
#include "workers_settings.hpp"

namespace troupe_bench {
namespace {

using workers::Fleet;

constexpr int kConvergeS = 60;  // the generous bound on every convergence
constexpr int kManager = 0;     // node-1

std::string unit_name(long i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "device-%05ld", i);
  return buf;
}

// Units [first, last]: the set and the file's text.
std::unordered_set<std::string> unit_set(long first, long last) {
  std::unordered_set<std::string> out;
  for (long i = first; i <= last; ++i) out.insert(unit_name(i));
  return out;
}

// Writes the units [first, last] to `path` at once (a rename), so a sync
// never reads half a file.
void write_units(const std::string& path, long first, long last) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "# the device fleet: <unit> <spec>\n";
    for (long i = first; i <= last; ++i) out << unit_name(i) << " {\"model\":\"m" << i % 4 << "\"}\n";
    if (!out) workers::die("workers", "cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

// A temporary directory for the units file, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "troupe-bench-workers-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) workers::die("workers", "mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

double seconds(std::int64_t ns) { return static_cast<double>(ns) / 1e9; }

// Fails unless the units stopped since `since` are exactly those in
// `expected`, each once: any other stop means a node gave up units it
// should have kept running (it lost its lease, for instance).
void stopped_only(Fleet& fleet, std::int64_t since, const std::unordered_set<std::string>& expected) {
  const std::map<std::string, int> stopped = fleet.stopped_since(since);
  long unexpected = 0, twice = 0;
  std::string example;
  for (const auto& [unit, times] : stopped) {
    if (expected.count(unit) == 0) {
      ++unexpected;
      if (example.empty()) example = unit;
    } else if (times > 1) {
      ++twice;
    }
  }
  if (unexpected != 0)
    fleet.fail(std::to_string(unexpected) + " units that should have kept running were stopped (e.g. " +
               example + "; a node that loses its lease stops every unit: see the nodes' log)");
  if (twice != 0) fleet.fail(std::to_string(twice) + " units were stopped more than once");
  if (stopped.size() != expected.size())
    fleet.fail(std::to_string(stopped.size()) + " units stopped, not the " + std::to_string(expected.size()) +
               " expected");
}

// Three nodes running the first units() units, synced by node-1. Returns
// the seconds from the sync command to the last start.
double start_fleet(Fleet& fleet, const std::string& file, int nodes) {
  write_units(file, 1, workers::units());
  for (int i = 0; i < nodes; ++i) fleet.add_node();
  const std::int64_t t0 = workers::now_ns();
  fleet.send(kManager, "sync " + std::to_string(nodes));
  const std::string synced = fleet.reply(kManager, kConvergeS, "the first sync");
  if (synced != "synced " + std::to_string(workers::units()) + " " + std::to_string(workers::units()))
    fleet.fail("the first sync reported '" + synced + "', not all " + std::to_string(workers::units()) +
               " units placed");
  const std::int64_t last =
      fleet.settle(unit_set(1, workers::units()), kConvergeS, "the first sync to converge");
  stopped_only(fleet, t0, {});  // a node that lost its lease while loading would restart its units
  return seconds(last - t0);
}

void no_doubles(Fleet& fleet) {
  const std::vector<std::string> d = fleet.doubles();
  if (!d.empty()) fleet.fail(std::to_string(d.size()) + " units ran on two nodes at once, e.g. " + d.front());
}

std::string counts_text(const std::vector<long>& counts) {
  std::string out;
  for (long c : counts) out += (out.empty() ? "" : "/") + std::to_string(c);
  return out;
}

std::vector<long> counts(Fleet& fleet) {
  return fleet.locked([&] {
    std::vector<long> out;
    for (const auto& n : fleet.nodes())
      if (!n.killed) out.push_back(static_cast<long>(n.running.size()));
    return out;
  });
}

void workers_sync() {
  TempDir dir;
  const std::string file = dir.path + "/units.txt";
  Fleet fleet("workers_sync", file);
  const double initial = start_fleet(fleet, file, 3);
  // +churn new units (after the last), -churn removed (the first).
  const long first = 1 + workers::churn(), last = workers::units() + workers::churn();
  write_units(file, first, last);
  const std::int64_t changed = workers::now_ns();
  const std::int64_t done = fleet.settle(unit_set(first, last), kConvergeS, "the changed file to converge");
  if (done <= changed) fleet.fail("no node started or stopped anything after the file changed");
  stopped_only(fleet, changed, unit_set(1, first - 1));
  no_doubles(fleet);
  const double took = seconds(done - changed);
  const double interval = std::chrono::duration<double>(workers::settings().sync_interval).count();
  std::fprintf(stderr, "workers_sync: %ld units on %s; +%ld/-%ld converged in %.3f s\n", workers::units(),
               counts_text(counts(fleet)).c_str(), workers::churn(), workers::churn(), took);
  bench::report("workers_sync", took, "s");
  bench::report("workers_sync_intervals", took / interval, "intervals");
  bench::report("workers_sync_initial", initial, "s");
}

void workers_failover() {
  TempDir dir;
  const std::string file = dir.path + "/units.txt";
  Fleet fleet("workers_failover", file);
  start_fleet(fleet, file, 3);
  constexpr int kVictim = 1;  // node-2: not the manager, whose sync goes on
  std::vector<std::string> lost = fleet.locked([&] {
    std::vector<std::string> out;
    for (const auto& [unit, epoch] : fleet.nodes()[kVictim].running) out.push_back(unit);
    return out;
  });
  const std::int64_t killed = fleet.kill(kVictim);
  fleet.settle(unit_set(1, workers::units()), kConvergeS, "the killed node's units to run elsewhere");
  // The time the last of them started on a live node.
  // The times the first and the last of them started on a live node.
  std::int64_t first = INT64_MAX, back = 0;
  fleet.locked([&] {
    for (const std::string& u : lost) {
      const auto& runs = fleet.runs().at(u);
      const workers::Run& r = runs.back();
      if (r.stop >= 0 || fleet.nodes()[r.node].killed)
        fleet.fail("unit " + u + " does not run on a live node");
      first = std::min(first, r.start);
      back = std::max(back, r.start);
    }
    return 0;
  });
  stopped_only(fleet, killed, {});
  no_doubles(fleet);
  std::fprintf(
      stderr,
      "workers_failover: node-2 ran %zu of %ld units; the first ran again %.3f s after the kill, the "
      "last %.3f s; now %s\n",
      lost.size(), workers::units(), seconds(first - killed), seconds(back - killed),
      counts_text(counts(fleet)).c_str());
  bench::report("workers_failover", seconds(back - killed), "s");
  bench::report("workers_failover_doubles", 0, "units");
}

// The fewest moves that leave max - min <= 1: the largest groups keep the
// larger share (ceil), so each node gives up only what it has beyond its
// share.
long min_moves(std::vector<long> counts) {
  long total = 0;
  for (long c : counts) total += c;
  const long k = static_cast<long>(counts.size()), q = total / k, r = total % k;
  std::sort(counts.rbegin(), counts.rend());
  long moves = 0;
  for (long i = 0; i < k; ++i)
    moves += std::max(0L, counts[static_cast<std::size_t>(i)] - (q + (i < r ? 1 : 0)));
  return moves;
}

void workers_rebalance() {
  TempDir dir;
  const std::string file = dir.path + "/units.txt";
  Fleet fleet("workers_rebalance", file);
  start_fleet(fleet, file, 3);
  // Where each unit runs before: unit -> node index.
  std::map<std::string, int> before;
  std::vector<long> before_counts = counts(fleet);
  fleet.locked([&] {
    for (int i = 0; i < static_cast<int>(fleet.nodes().size()); ++i)
      for (const auto& [unit, epoch] : fleet.nodes()[i].running) before[unit] = i;
    return 0;
  });
  const int added = fleet.add_node();
  before_counts.push_back(0);
  const long fewest = min_moves(before_counts);

  std::vector<double> cpu_before;
  for (int i = 0; i <= added; ++i) cpu_before.push_back(fleet.cpu_seconds(i));
  fleet.send(kManager, "rebalance 4");
  struct Move {
    std::string unit;
    int from, to;
  };
  std::vector<Move> moves;
  std::int64_t called = 0;
  auto node_index = [&](const std::string& id) {
    for (int i = 0; i < static_cast<int>(fleet.nodes().size()); ++i)
      if (fleet.nodes()[i].id == id) return i;
    fleet.fail("a move names an unknown node '" + id + "'");
  };
  while (true) {
    std::istringstream in(fleet.reply(kManager, kConvergeS, "the rebalance"));
    std::string kind;
    in >> kind;
    if (kind == "move") {
      std::string unit, from, to;
      in >> unit >> from >> to;
      moves.push_back({unit, node_index(from), node_index(to)});
      if (before.at(unit) != moves.back().from)
        fleet.fail("the move of " + unit + " names the wrong old owner");
      continue;
    }
    std::size_t made = 0, left = 0;
    in >> made >> left >> called;
    if (kind != "rebalanced" || made != moves.size() || left != 0)
      fleet.fail("the rebalance answered '" + in.str() + "' after " + std::to_string(moves.size()) +
                 " moves");
    break;
  }
  fleet.settle(unit_set(1, workers::units()), kConvergeS, "the moved units to run on their new owners");
  // Where the time goes: each node's CPU from the call until it settled
  // (the settling includes 1.5 s of quiet).
  std::string cpu;
  for (int i = 0; i <= added; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.2f s", cpu.empty() ? "" : ", ", fleet.nodes()[i].id.c_str(),
                  fleet.cpu_seconds(i) - cpu_before[static_cast<std::size_t>(i)]);
    cpu += buf;
  }
  std::fprintf(stderr, "workers_rebalance: CPU used by the nodes from the call until settled: %s\n",
               cpu.c_str());
  std::unordered_set<std::string> moved;
  for (const Move& m : moves) moved.insert(m.unit);
  stopped_only(fleet, called, moved);
  std::vector<long> after = counts(fleet);
  const auto [lo, hi] = std::minmax_element(after.begin(), after.end());
  if (*hi - *lo > 1)
    fleet.fail("after the rebalance the nodes run " + counts_text(after) + ": max - min > 1");
  // Each moved unit: its last run is on the new owner; the run before it,
  // on the old owner, stopped before it started.
  long early = 0;
  std::int64_t latest = 0;
  std::size_t moved_seen = 0;
  fleet.locked([&] {
    for (const Move& m : moves) {
      const auto& runs = fleet.runs().at(m.unit);
      if (runs.size() < 2 || runs.back().node != m.to || runs.back().stop >= 0 ||
          runs[runs.size() - 2].node != m.from)
        fleet.fail("unit " + m.unit + " did not move from " + fleet.nodes()[m.from].id + " to " +
                   fleet.nodes()[m.to].id);
      if (runs.back().start < runs[runs.size() - 2].stop) ++early;
      latest = std::max(latest, runs.back().start);
    }
    for (const auto& [unit, runs] : fleet.runs())
      if (runs.back().node != before.at(unit)) ++moved_seen;
    return 0;
  });
  if (moved_seen != moves.size())
    fleet.fail(std::to_string(moved_seen) + " units changed node but the rebalance made " +
               std::to_string(moves.size()) + " moves");
  if (early != 0)
    fleet.fail(std::to_string(early) + " moved units started on the new owner before the old owner's stop");
  no_doubles(fleet);
  std::fprintf(stderr, "workers_rebalance: %s -> %s, %zu moves (fewest %ld), %s joined\n",
               counts_text(before_counts).c_str(), counts_text(after).c_str(), moves.size(), fewest,
               fleet.nodes()[added].id.c_str());
  bench::report("workers_rebalance", seconds(latest - called), "s");
  bench::report("workers_rebalance_moves", static_cast<double>(moves.size()), "units");
  bench::report("workers_rebalance_min_moves", static_cast<double>(fewest), "units");
  bench::report("workers_rebalance_early_starts", static_cast<double>(early), "units");
}

}  // namespace

bool worker_placement(const std::string& workload) {
  if (workload == "workers_sync") {
    workers_sync();
  } else if (workload == "workers_failover") {
    workers_failover();
  } else if (workload == "workers_rebalance") {
    workers_rebalance();
  } else {
    return false;
  }
  return true;
}

}  // namespace troupe_bench
