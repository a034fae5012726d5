// lock_uncontended / lock_contended / lock_spread: lock+unlock pairs per
// second through troupe::KeyedLock in one process (no network, no other
// process): 1 key and 1 caller, 1 key and 50 callers, 1,000 keys and 50
// callers. troupe-only rows: no peer takes a lock in process, and a lock
// over the network is a different thing to measure (lock_cluster.cpp puts
// the cluster-wide lock beside a Redis lock, both over TCP). The callers,
// their keys (uniform per caller, bench::lock::KeyPicker), the block and the
// measurement (a warm-up, then the pairs completed in a window) are
// lock_cluster's: lock_callers.hpp.

#include <string>
#include <vector>

#include "common/lock.hpp"
#include "common/report.hpp"
#include "lock_callers.hpp"
#include "troupe/core.hpp"
#include "troupe/patterns/keyed_lock.hpp"

namespace troupe_bench {
namespace {

void run(const char* name, int callers, int keys) {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  troupe::ActorSystem sys(cfg);
  auto lock = troupe::KeyedLock::start(sys, {.name = "bench"});
  if (!lock.ok()) {
    std::fprintf(stderr, "bench_troupe: %s: %s\n", name, lock.error().to_string().c_str());
    std::exit(1);
  }
  // Pairs only: an in-process pair takes a few hundred ns, two clock reads
  // and a stored latency per pair would weigh on it.
  bench::lock::Meter meter(callers, /*latencies=*/false);
  const double seconds = lock_callers::drive(lock.value(), bench::lock::key_names(keys), callers, meter, name);
  bench::report(name, static_cast<double>(meter.pairs()) / seconds, "pairs/s");
  lock.value().stop();
  sys.shutdown();
}

}  // namespace

bool lock(const std::string& workload) {
  if (workload == "lock_uncontended") {
    run("lock_uncontended", 1, 1);
  } else if (workload == "lock_contended") {
    run("lock_contended", 50, 1);
  } else if (workload == "lock_spread") {
    run("lock_spread", 50, 1000);
  } else {
    return false;
  }
  return true;
}

}  // namespace troupe_bench
