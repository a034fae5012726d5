#pragma once
// Shared by bench/troupe and bench/peers/caf so both sides measure and report
// the same way. One process runs one workload; it prints one JSON line per
// metric on stdout:
//   {"bench":"ping_pong","value":1234567.0,"unit":"round trips/s"}
// bench/run starts the processes, alternates implementations and aggregates.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace bench {

// Sizes fixed by the issue; BENCH_SCALE (a divisor, e.g. 10) shrinks them for
// quick checks, never for reported numbers.
inline long scale() {
  const char* s = std::getenv("BENCH_SCALE");
  long v = s ? std::atol(s) : 1;
  return v > 0 ? v : 1;
}

inline constexpr long kPingPongRoundTrips = 1'000'000;
inline constexpr long kCountingMessages = 10'000'000;
inline constexpr long kFanInPerSender = 1'000'000;
inline constexpr long kSkynetLeaves = 1'000'000;  // 10-ary tree, 6 levels
inline constexpr int kRingSize = 503;
inline constexpr long kRingHops = 10'000'000;
inline constexpr long kAskPairs = 1'000'000;
inline constexpr long kIdleActors = 1'000'000;

// From /proc/self/status, in kB: "VmRSS" (now) or "VmHWM" (peak).
inline long proc_status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  std::size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atol(line.c_str() + n + 1);
    }
  }
  return -1;
}

inline void report(const char* bench, double value, const char* unit) {
  std::printf("{\"bench\":\"%s\",\"value\":%.3f,\"unit\":\"%s\"}\n", bench, value, unit);
  std::fflush(stdout);
}

// Nearest-rank percentile (p in (0, 100]) of `ns`, which it sorts: the
// smallest value with at least p% of the samples at or below it.
inline double percentile(std::vector<int64_t>& ns, double p) {
  if (ns.empty())
    return 0.0;
  std::sort(ns.begin(), ns.end());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(ns.size())));
  rank = std::clamp<std::size_t>(rank, 1, ns.size());
  return static_cast<double>(ns[rank - 1]);
}

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace bench
