// CAF 0.17 peer of the troupe benchmark suite: `bench_caf <workload>` runs one
// workload in a fresh process and prints one JSON line per metric (see
// bench/common/report.hpp). Unknown workload -> stderr, exit 2.

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "peers/caf/common.hpp"

namespace {

struct workload {
  const char* name;
  std::function<void(caf::actor_system&)> run;
};

const workload kWorkloads[] = {
  {"ping_pong", caf_bench::ping_pong},
  {"counting", caf_bench::counting},
  {"fan_in_4", [](caf::actor_system& sys) { caf_bench::fan_in(sys, 4); }},
  {"fan_in_16", [](caf::actor_system& sys) { caf_bench::fan_in(sys, 16); }},
  {"skynet", caf_bench::skynet},
  {"thread_ring", caf_bench::thread_ring},
  {"ask", caf_bench::ask},
  {"idle_memory", caf_bench::idle_memory},
};

void usage(std::FILE* out) {
  std::fprintf(out, "usage: bench_caf <workload>\nworkloads:");
  for (const auto& w : kWorkloads)
    std::fprintf(out, " %s", w.name);
  std::fprintf(out, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    usage(stderr);
    return 2;
  }
  const workload* selected = nullptr;
  for (const auto& w : kWorkloads)
    if (std::strcmp(w.name, argv[1]) == 0)
      selected = &w;
  if (selected == nullptr) {
    std::fprintf(stderr, "bench_caf: unknown workload '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  // Configuration choices (everything else stays at CAF's defaults):
  //  - scheduler.max-threads = 2: CAF 0.17 defaults to
  //    max(hardware_concurrency, 4) workers, i.e. 4 on this 2-core machine;
  //    troupe runs 2 workers, so CAF gets exactly the same number.
  //  - The default work-stealing scheduler and max-throughput (unbounded:
  //    an actor drains its whole mailbox per scheduling slot, CAF's best
  //    setting for throughput) are kept.
  //  - No config file / CLI parsing: the process must not pick up a stray
  //    caf-application.ini from the working directory.
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  {
    caf::actor_system sys{cfg};
    selected->run(sys);
    // ~actor_system waits until every actor has terminated; each workload
    // makes sure its actors quit (or are unreachable) before returning.
  }
  return 0;
}
