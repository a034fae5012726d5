#pragma once
// The callers of troupe's lock workloads, the same whether the lock lives in
// this process (lock.cpp) or on another node (lock_cluster.cpp): each
// caller is a chain of continuations, the completion of a pair issuing the
// caller's next lock(), as each connection in the Redis peer's event loop
// sends its next command from its reply callback; one pair in flight per
// caller, nothing blocks. Keys are picked by bench::lock::KeyPicker; the
// block is a trivial critical section that checks it runs alone (a per-key
// count of callers inside it); bench::lock::Meter measures.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/lock.hpp"
#include "troupe/patterns/keyed_lock.hpp"

namespace troupe_bench::lock_callers {

// Runs `callers` callers on `lock` over `keys` through `meter`'s warm-up
// and window, then stops them and waits until each has finished its pair.
// Returns the window's seconds. A failed lock, a block that ran while
// another held its key or callers that do not finish: "bench_troupe:
// <name>: ..." on stderr and exit status 1.
inline double drive(const troupe::KeyedLock& lock, const std::vector<std::string>& keys, int callers,
                    bench::lock::Meter& meter, const char* name) {
  struct Shared {
    const troupe::KeyedLock& lock;
    const std::vector<std::string>& keys;
    bench::lock::Meter& meter;
    const char* name;
    int callers;
    std::unique_ptr<std::atomic<int>[]> inside;  // per key: callers inside the block
    std::atomic<bool> stop{false};
    std::atomic<long> overlaps{0};
    std::atomic<int> finished{0};
    std::promise<void> all_done;
  };
  struct Caller {
    Shared* s;
    int id;
    bench::lock::KeyPicker picker;

    void next() {
      if (s->stop.load(std::memory_order_relaxed)) {
        if (s->finished.fetch_add(1) + 1 == s->callers) s->all_done.set_value();
        return;
      }
      const std::size_t k = picker.next();
      std::atomic<int>* inside = &s->inside[k];
      Shared* sh = s;
      const bench::lock::Clock::time_point started =
          s->meter.takes_latencies() ? bench::lock::Clock::now() : bench::lock::Clock::time_point{};
      s->lock
          .lock(s->keys[k],
                [inside, sh](const troupe::LockLease&) {
                  if (inside->fetch_add(1, std::memory_order_acq_rel) != 0)
                    sh->overlaps.fetch_add(1, std::memory_order_relaxed);
                  inside->fetch_sub(1, std::memory_order_acq_rel);
                  return 0;
                })
          .then([this, started](troupe::Result<int> r) {
            if (!r) {
              std::fprintf(stderr, "bench_troupe: %s: lock failed: %s\n", s->name, r.error().to_string().c_str());
              std::_Exit(1);
            }
            s->meter.completed(id, started);
            next();
          });
    }
  };

  Shared s{lock, keys, meter, name, callers, std::make_unique<std::atomic<int>[]>(keys.size()), {}, {}, {}, {}};
  for (std::size_t k = 0; k < keys.size(); ++k) s.inside[k].store(0);
  std::vector<Caller> chains;
  chains.reserve(static_cast<std::size_t>(callers));
  for (int i = 0; i < callers; ++i)
    chains.push_back(Caller{&s, i, bench::lock::KeyPicker(i, static_cast<int>(keys.size()))});
  for (auto& c : chains) c.next();
  const double seconds = meter.measure();
  s.stop = true;
  if (s.all_done.get_future().wait_for(std::chrono::seconds(90)) != std::future_status::ready) {
    std::fprintf(stderr, "bench_troupe: %s: the callers did not finish\n", name);
    std::_Exit(1);
  }
  if (s.overlaps.load() != 0) {
    std::fprintf(stderr, "bench_troupe: %s: %ld blocks ran while another held their key\n", name,
                 s.overlaps.load());
    std::_Exit(1);
  }
  return seconds;
}

}  // namespace troupe_bench::lock_callers
