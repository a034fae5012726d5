#pragma once
// What the workers_* rows (bench/troupe/workers.cpp) and their node
// processes (workers_node.cpp) share: the group, the coordinator settings
// every node runs with, the sizes and the clock.

#include <chrono>
#include <cstdint>

#include "common/report.hpp"
#include "troupe/cluster/coordinator.hpp"

namespace troupe_bench::workers {

using namespace std::chrono_literals;

inline constexpr const char* kGroup = "devices";
inline constexpr long kUnits = 10'000;  // units placed before each row's event
inline constexpr long kChurn = 1'000;   // workers_sync: units added, and units removed

// Short but realistic settings: a heartbeat every 250 ms, a member is live
// while its last heartbeat is at most 2 s old, anyone may take a dead
// member's units 0.25 s after that, and the manager syncs (and every node
// re-reads its assignments) once a second. (With a 1.5 s threshold every
// rebalance of 2,500 units on a busy 2-core machine made the old owners
// miss their lease; see bench/README.md.)
inline troupe::cluster::CoordinatorSettings settings() {
  troupe::cluster::CoordinatorSettings s;
  s.key_prefix = "bench-workers";
  s.heartbeat_interval = 250ms;
  s.liveness_threshold = 2000ms;
  s.takeover_margin = 250ms;
  s.sync_interval = 1s;
  return s;
}

inline long units() { return kUnits / bench::scale(); }
inline long churn() { return kChurn / bench::scale(); }

// steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process on
// the machine, so the nodes' timestamps compare with the bench process's.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace troupe_bench::workers
