// idle_memory: resident memory per idle actor. Spawns kIdleActors stateful,
// event-based actors holding an int, keeps their handles and compares VmRSS
// before and after.

#include <atomic>
#include <thread>
#include <vector>

#include "peers/caf/common.hpp"

namespace caf_bench {
namespace {

// Counts actors whose initialization (behavior construction) has run on a
// worker, so the driver knows when spawning is really done. One relaxed
// increment per actor, outside the measured memory.
std::atomic<long> initialized{0};

struct idle_state {
  int value = 0;
};

caf::behavior idle(caf::stateful_actor<idle_state>* self) {
  initialized.fetch_add(1, std::memory_order_relaxed);
  return {
    [=](int32_t x) { self->state.value += x; },
  };
}

// Waits until every spawned actor has been initialized and the workers have
// gone quiet.
void settle(long expected) {
  while (initialized.load(std::memory_order_relaxed) < expected)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

void idle_memory(caf::actor_system& sys) {
  const long n = bench::kIdleActors / bench::scale();
  std::vector<caf::actor> handles;
  handles.reserve(static_cast<size_t>(n));
  settle(0);
  const long before = bench::proc_status_kb("VmRSS");
  // Default spawn options (no lazy_init): each actor is initialized right
  // away, as it would be in a real application.
  for (long i = 0; i < n; ++i)
    handles.push_back(sys.spawn(idle));
  settle(n);
  const long after = bench::proc_status_kb("VmRSS");
  bench::report("idle_memory",
                static_cast<double>(after - before) * 1024.0 / static_cast<double>(n),
                "bytes/actor");
}

}  // namespace caf_bench
