// lock_uncontended / lock_contended / lock_spread: lock+unlock pairs per
// second through troupe::KeyedLock, with the same caller counts as the Redis
// lock peer (bench/peers/redis_lock). A caller asks for the lock and, when
// its block has run and the result is back, asks again: one pair in flight
// per caller, as for a Redis client that waits for its reply. The block is a
// trivial critical section that checks it runs alone.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"
#include "troupe/core.hpp"
#include "troupe/patterns/keyed_lock.hpp"

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;

struct KeyCounter {
  int inside = 0;  // touched only under the key's lock
};

struct Shared {
  troupe::KeyedLock lock;
  std::vector<std::string> keys;
  std::vector<KeyCounter> guards;  // one per key
  std::atomic<bool> stop{false};
  std::atomic<long> pairs{0};
  std::atomic<long> overlaps{0};
  std::atomic<int> finished{0};
  std::promise<void> all_done;
  int callers = 0;
};

// One caller: a chain of continuations. The completion of a pair issues the
// caller's next lock, as each connection in the Redis peer's event loop
// sends its next command from its reply callback; one pair in flight per
// caller, nothing blocks.
struct Caller {
  Shared* s;
  std::size_t next_key;
  long done = 0;

  void next() {
    if (s->stop.load(std::memory_order_relaxed)) {
      s->pairs.fetch_add(done, std::memory_order_relaxed);
      if (s->finished.fetch_add(1) + 1 == s->callers) s->all_done.set_value();
      return;
    }
    std::size_t k = next_key;
    next_key = (next_key + 7) % s->keys.size();
    KeyCounter* g = &s->guards[k];
    Shared* sh = s;
    s->lock
        .lock(s->keys[k],
              [g, sh](const troupe::LockLease&) {
                if (++g->inside != 1) sh->overlaps.fetch_add(1, std::memory_order_relaxed);
                --g->inside;
                return 0;
              })
        .then([this](troupe::Result<int> r) {
          if (!r) {
            std::fprintf(stderr, "lock failed: %s\n", r.error().to_string().c_str());
            std::abort();
          }
          ++done;
          next();
        });
  }
};

void run(const char* name, int callers, int keys) {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  troupe::ActorSystem sys(cfg);
  Shared s{troupe::KeyedLock::start(sys, {.name = "bench"}).value(), {}, {}, {}, {}, {}, {}, {}, callers};
  for (int i = 0; i < keys; ++i) s.keys.push_back("account-" + std::to_string(i));
  s.guards.resize(static_cast<std::size_t>(keys));
  const auto duration = std::chrono::milliseconds(1500 / bench::scale());
  std::vector<Caller> chains;
  for (int i = 0; i < callers; ++i) chains.push_back(Caller{&s, static_cast<std::size_t>(i) % s.keys.size()});
  bench::Stopwatch sw;
  for (auto& c : chains) c.next();
  std::this_thread::sleep_for(duration);
  s.stop = true;
  s.all_done.get_future().wait();
  double secs = sw.seconds();
  if (s.overlaps.load() != 0) {
    std::fprintf(stderr, "%s: %ld overlapping holders\n", name, s.overlaps.load());
    std::exit(1);
  }
  bench::report(name, static_cast<double>(s.pairs.load()) / secs, "pairs/s");
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
