// Process manager workloads (troupe only; the peers have no counterpart):
//   process_manager_1, _64, _1024 — processes started and completed per
//       second with max_running = 1, 64, 1024: trivial processes that
//       complete on their first message, submitted by one caller that keeps
//       max_running + 4096 requests in flight (so the buffer never refuses);
//   process_manager_refusal — ns per submit refused by a full manager
//       (median of 31 batches of 10,000);
//   process_manager_overload_rss — peak RSS (MB) while two callers ask for
//       ten times what the manager can complete, for 2 s (64 running, 1024
//       buffered, processes that take 2 ms).
// Runs the overload first, so that the process's peak RSS is its own.

#include "troupe/patterns/process_manager.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"
#include "troupe/core.hpp"

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;
using troupe::ProcessHandle;
using troupe::ProcessId;
using troupe::ProcessManager;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_troupe: process_manager: %s\n", what.c_str());
  std::exit(1);
}

troupe::SystemConfig config() {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  return cfg;
}

struct Go {};

// Completes on its first message (which it sends itself at start).
struct Trivial : troupe::Actor<Go> {
  using result_type = long;
  Trivial(ProcessHandle<long> h, long v) : handle(std::move(h)), value(v) {}
  void on_start() { self().tell(Go{}); }
  void receive(Go&) { handle.complete(value); }
  ProcessHandle<long> handle;
  long value;
};

// Completes 2 ms after it started (an actor timer on the real clock).
struct Timed : troupe::Actor<Go> {
  using result_type = long;
  static constexpr troupe::Duration kTakes = 2ms;
  Timed(ProcessHandle<long> h, long v) : handle(std::move(h)), value(v) {}
  void on_start() { start_timer("done", kTakes, Go{}); }
  void receive(Go&) { handle.complete(value); }
  ProcessHandle<long> handle;
  long value;
};

// Never completes by itself: it parks its handle for the bench to complete.
struct Parking {
  std::mutex mu;
  std::vector<ProcessHandle<long>> handles;
};
struct Parked : troupe::Actor<Go> {
  using result_type = long;
  Parked(ProcessHandle<long> h, std::shared_ptr<Parking> p) : handle(std::move(h)), parking(std::move(p)) {}
  void on_start() {
    std::lock_guard lk(parking->mu);
    parking->handles.push_back(handle);
  }
  void receive(Go&) {}
  ProcessHandle<long> handle;
  std::shared_ptr<Parking> parking;
};

// Counts outcomes; a caller can wait for the count to move.
struct Outcomes {
  std::atomic<std::uint64_t> done{0};
  std::atomic<std::uint64_t> failed{0};
  void add(bool ok) {
    if (!ok) failed.fetch_add(1, std::memory_order_relaxed);
    done.fetch_add(1, std::memory_order_release);
    done.notify_one();
  }
};

double throughput(std::size_t max_running, double seconds) {
  constexpr std::size_t kBuffer = 4096;
  troupe::ActorSystem sys(config());
  auto outcomes = std::make_shared<Outcomes>();
  auto pm = ProcessManager<Trivial>::start(
      sys, {.name = "bench",
            .max_running = max_running,
            .buffer = kBuffer,
            .on_outcome = [outcomes](ProcessId, const troupe::Result<long>& r) { outcomes->add(r.ok()); }});
  if (!pm.ok()) die(pm.error().to_string());
  const std::uint64_t window = max_running + kBuffer;
  std::uint64_t submitted = 0;
  bench::Stopwatch sw;
  while (sw.seconds() < seconds) {
    for (int k = 0; k < 256; ++k) {
      std::uint64_t c = outcomes->done.load(std::memory_order_acquire);
      while (submitted - c >= window) {
        outcomes->done.wait(c, std::memory_order_acquire);
        c = outcomes->done.load(std::memory_order_acquire);
      }
      auto accepted = pm->enqueue(static_cast<long>(submitted));
      if (!accepted.get().ok()) die("a submit within the bound was refused");
      ++submitted;
    }
  }
  for (std::uint64_t c = outcomes->done.load(); c < submitted; c = outcomes->done.load())
    outcomes->done.wait(c);
  double s = sw.seconds();
  if (outcomes->failed.load() != 0) die(std::to_string(outcomes->failed.load()) + " processes failed");
  auto st = pm->stats();
  if (st.peak_running > max_running) die("more processes ran than max_running");
  return static_cast<double>(submitted) / s;
}

double refusal_ns() {
  constexpr int kBatches = 31;
  constexpr int kPerBatch = 10'000;
  troupe::ActorSystem sys(config());
  auto parking = std::make_shared<Parking>();
  auto pm = ProcessManager<Parked>::start(sys, {.name = "full", .max_running = 1, .buffer = 0});
  if (!pm.ok()) die(pm.error().to_string());
  auto first = pm->submit(parking);
  while (pm->stats().running == 0) std::this_thread::sleep_for(100us);
  std::vector<double> per_call;
  std::uint64_t refused = 0;
  for (int b = 0; b < kBatches; ++b) {
    bench::Stopwatch sw;
    for (int i = 0; i < kPerBatch; ++i) {
      auto f = pm->enqueue(parking);
      refused += f.get().ok() ? 0 : 1;
    }
    per_call.push_back(sw.seconds() * 1e9 / kPerBatch);
  }
  if (refused != static_cast<std::uint64_t>(kBatches) * kPerBatch)
    die("a submit to a full manager was accepted");
  {
    std::lock_guard lk(parking->mu);
    for (auto& h : parking->handles) h.complete(0);
    parking->handles.clear();
  }
  if (!first.get().ok()) die("the parked process did not complete");
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

struct OverloadFigures {
  double peak_mb = 0;             // VmHWM at the end
  double first_half_max_mb = 0;   // highest VmRSS sampled in the first half
  double second_half_max_mb = 0;  // ... and in the second
  double offered_per_s = 0;       // submits attempted per second
  double completed_per_s = 0;
  std::uint64_t accepted = 0, refused = 0;
  std::uint64_t peak_running = 0, peak_buffered = 0, peak_outstanding = 0;
};

OverloadFigures overload(double seconds) {
  constexpr std::size_t kRunning = 64, kBuffer = 1024;
  constexpr int kProducers = 2;
  // Ten times what 64 processes of 2 ms each can complete.
  const double capacity_per_s =
      static_cast<double>(kRunning) / std::chrono::duration<double>(Timed::kTakes).count();
  const double offered_per_producer = 10 * capacity_per_s / kProducers;
  troupe::ActorSystem sys(config());
  auto outcomes = std::make_shared<Outcomes>();
  auto pm = ProcessManager<Timed>::start(
      sys, {.name = "overload",
            .max_running = kRunning,
            .buffer = kBuffer,
            .on_outcome = [outcomes](ProcessId, const troupe::Result<long>& r) { outcomes->add(r.ok()); }});
  if (!pm.ok()) die(pm.error().to_string());
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> attempts{0};
  std::vector<std::thread> producers;
  bench::Stopwatch sw;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      std::uint64_t sent = 0;
      auto start = std::chrono::steady_clock::now();
      while (!stop.load(std::memory_order_relaxed)) {
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        auto due = static_cast<std::uint64_t>(elapsed * offered_per_producer);
        for (; sent < due; ++sent) (void)pm->enqueue(static_cast<long>(sent) * kProducers + p);
        std::this_thread::sleep_for(1ms);
      }
      attempts.fetch_add(sent);
    });
  }
  OverloadFigures f;
  while (sw.seconds() < seconds) {
    double mb = static_cast<double>(bench::proc_status_kb("VmRSS")) / 1024.0;
    auto& half = sw.seconds() < seconds / 2 ? f.first_half_max_mb : f.second_half_max_mb;
    half = std::max(half, mb);
    f.peak_outstanding = std::max(f.peak_outstanding, pm->stats().outstanding);
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  for (auto& t : producers) t.join();
  double offered_s = sw.seconds();
  while (pm->stats().outstanding > 0) std::this_thread::sleep_for(1ms);
  auto st = pm->stats();
  f.peak_mb = static_cast<double>(bench::proc_status_kb("VmHWM")) / 1024.0;
  f.offered_per_s = static_cast<double>(attempts.load()) / offered_s;
  f.completed_per_s = static_cast<double>(st.completed) / sw.seconds();
  f.accepted = st.accepted;
  f.refused = st.refused;
  f.peak_running = st.peak_running;
  f.peak_buffered = st.peak_buffered;
  if (st.peak_running > kRunning || st.peak_buffered > kBuffer || f.peak_outstanding > kRunning + kBuffer)
    die("the bounds were exceeded");
  if (st.completed != st.accepted || outcomes->failed.load() != 0)
    die("an accepted process did not complete");
  return f;
}

}  // namespace

void process_manager() {
  const double seconds = 2.0 / static_cast<double>(bench::scale());
  auto o = overload(seconds);
  bench::report("process_manager_overload_rss", o.peak_mb, "MB");
  bench::report("process_manager_refusal", refusal_ns(), "ns");
  const double each = 1.0 / static_cast<double>(bench::scale());
  bench::report("process_manager_1", throughput(1, each), "processes/s");
  bench::report("process_manager_64", throughput(64, each), "processes/s");
  bench::report("process_manager_1024", throughput(1024, each), "processes/s");
}

}  // namespace troupe_bench
