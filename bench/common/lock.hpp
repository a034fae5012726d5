#pragma once
// The lock workloads over the network (lock_cluster, lock_cluster_contended),
// shared by bench/troupe (lock_cluster.cpp: troupe's cluster-wide lock, SPEC
// L6) and bench/peers/redis_lock (a Redis lock) so both sides run the same
// callers, pick the same keys, do the same work under the lock and measure
// between the same points.
//
// Every acquire and every release crosses TCP on loopback on both sides:
//   troupe  the callers run in the bench process, a cluster node of its own;
//           every lock shard is owned by a second node process (the bench
//           process starts it), so each lock() sends Acquire to that node
//           and waits for its Grant, and the release goes back to it;
//   Redis   the callers send SET key token NX PX <lease> and the
//           compare-and-delete release to the redis-server bench/run starts.
//
// Shapes (kShapes): `callers` callers, each with one lock+unlock pair in
// flight at a time, each pair on a key drawn uniformly from `keys` keys by
// the caller's own generator (KeyPicker: std::mt19937 seeded 1000 + caller,
// the same sequence on both sides). The work under the lock is the same on
// both sides: a check that no other caller holds the key (a per-key count
// of holders), nothing else.
//
// Measurement (Meter): warm-up_ms() of pairs, then a window of window_ms().
// A pair counts when it completes inside the window; its latency runs from
// right before the caller asks for the lock (troupe: lock(); Redis: the
// first SET, retries included) until the caller knows it is released
// (troupe: lock()'s future completes; Redis: the release script's reply).
//   <shape>      pairs completed in the window / the window's seconds
//                (locks/s);
//   <shape>_p50, <shape>_p99  nearest-rank percentiles of those pairs'
//                latencies, in us.
// BENCH_SCALE (report.hpp) divides the warm-up and the window.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"

namespace bench::lock {

struct Shape {
  const char* name;
  int keys;
  int callers;
};

inline constexpr Shape kShapes[] = {
    {"lock_cluster", 1000, 50},           // 50 callers over 1,000 keys: little contention
    {"lock_cluster_contended", 1, 50},    // 50 callers on one key
};

// The shape named `name`, or nullptr.
inline const Shape* shape(const char* name) {
  for (const Shape& s : kShapes)
    if (std::strcmp(s.name, name) == 0) return &s;
  return nullptr;
}

// A holder's lease on both sides (Redis: PX; troupe: KeyedLockSettings::lease).
inline constexpr int kLeaseMs = 30'000;

inline long warmup_ms() { return 500 / scale(); }
inline long window_ms() { return 3000 / scale(); }

// The key names (the same on both sides; `prefix` keeps two runs against one
// server apart on the Redis side).
inline std::vector<std::string> key_names(int keys, const std::string& prefix = "") {
  std::vector<std::string> v;
  v.reserve(static_cast<std::size_t>(keys));
  for (int i = 0; i < keys; ++i) v.push_back(prefix + "account-" + std::to_string(i));
  return v;
}

// One caller's key sequence.
class KeyPicker {
 public:
  KeyPicker(int caller, int keys) : rng_(static_cast<std::uint32_t>(1000 + caller)), keys_(keys) {}
  std::size_t next() {
    if (keys_ == 1) return 0;
    return std::uniform_int_distribution<std::size_t>(0, static_cast<std::size_t>(keys_) - 1)(rng_);
  }

 private:
  std::mt19937 rng_;
  int keys_;
};

using Clock = std::chrono::steady_clock;

// The measurement window, opened and closed by the measuring thread.
class Meter {
 public:
  // Per caller, touched only by the thread completing that caller's pair
  // (one pair in flight per caller).
  struct Caller {
    std::size_t pairs = 0;                   // completed in the window
    std::vector<std::int64_t> latencies_ns;  // theirs, if the meter takes latencies
  };

  // `latencies` false: counts pairs only (for workloads whose pairs are so
  // short that reading the clock twice per pair would weigh on the figure;
  // report() is then not available).
  explicit Meter(int callers, bool latencies = true)
      : latencies_(latencies), callers_(static_cast<std::size_t>(callers)) {
    if (latencies_)
      for (auto& c : callers_) c.latencies_ns.reserve(1 << 16);
  }

  bool takes_latencies() const { return latencies_; }

  // A pair of `caller` that started at `started` completed now (`started`
  // is not read unless the meter takes latencies).
  void completed(int caller, Clock::time_point started) {
    if (phase_.load(std::memory_order_relaxed) != kWindow) return;
    Caller& c = callers_[static_cast<std::size_t>(caller)];
    ++c.pairs;
    if (latencies_)
      c.latencies_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count());
  }

  // Sleeps through the warm-up and the window; returns the window's seconds.
  // The callers keep going until the caller of this stops them.
  double measure() {
    std::this_thread::sleep_for(std::chrono::milliseconds(warmup_ms()));
    phase_.store(kWindow);
    Stopwatch window;
    std::this_thread::sleep_for(std::chrono::milliseconds(window_ms()));
    phase_.store(kAfter);
    return window.seconds();
  }

  // After every caller stopped: the pairs completed in the window.
  std::size_t pairs() const {
    std::size_t n = 0;
    for (const auto& c : callers_) n += c.pairs;
    return n;
  }

  // After every caller stopped: prints <name>, <name>_p50, <name>_p99.
  // False if no pair completed in the window.
  bool report(const char* name, double seconds) {
    std::vector<std::int64_t> all;
    for (auto& c : callers_) all.insert(all.end(), c.latencies_ns.begin(), c.latencies_ns.end());
    if (all.empty()) return false;
    const std::string n = name;
    bench::report(name, static_cast<double>(all.size()) / seconds, "locks/s");
    bench::report((n + "_p50").c_str(), percentile(all, 50) / 1e3, "us");
    bench::report((n + "_p99").c_str(), percentile(all, 99) / 1e3, "us");
    return true;
  }

 private:
  static constexpr int kWarmup = 0, kWindow = 1, kAfter = 2;
  std::atomic<int> phase_{kWarmup};
  const bool latencies_;
  std::vector<Caller> callers_;
};

}  // namespace bench::lock
