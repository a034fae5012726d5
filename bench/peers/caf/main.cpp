// CAF 0.17 peer of the troupe benchmark suite: `bench_caf <workload>` runs one
// workload in a fresh process and prints one JSON line per metric (see
// bench/common/report.hpp). Unknown workload -> stderr, exit 2. The remote
// workloads start a second copy of this binary as their server node
// (`bench_caf remote_server <workload> <fd>`, see bench/common/remote.hpp).

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "common/remote.hpp"
#include "peers/caf/common.hpp"

namespace {

struct workload {
  const char* name;
  std::function<void(caf::actor_system&)> run;
  // Extra configuration before the actor_system starts (remote workloads:
  // the middleman and their message types), or null.
  void (*configure)(caf::actor_system_config&) = nullptr;
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
#if BENCH_CAF_HAVE_IO
  {"remote_tell", caf_bench::remote_tell, caf_bench::remote_tell_configure},
  {"remote_ask", caf_bench::remote_ask, caf_bench::remote_ask_configure},
#endif
};

const workload* find_workload(const char* name) {
  for (const auto& w : kWorkloads)
    if (std::strcmp(w.name, name) == 0)
      return &w;
  return nullptr;
}

// See main()'s comment for the configuration choices.
void base_config(caf::actor_system_config& cfg, const workload& w) {
  cfg.set("scheduler.max-threads", 2);
  if (w.configure != nullptr)
    w.configure(cfg);
}

void usage(std::FILE* out) {
  std::fprintf(out, "usage: bench_caf <workload>\nworkloads:");
  for (const auto& w : kWorkloads)
    std::fprintf(out, " %s", w.name);
  std::fprintf(out, "\n");
}

}  // namespace

int main(int argc, char** argv) {
#if BENCH_CAF_HAVE_IO
  if (argc == 4 && std::strcmp(argv[1], bench::remote::kServerArg) == 0) {
    const workload* w = find_workload(argv[2]);
    if (w == nullptr || w->configure == nullptr) {
      std::fprintf(stderr, "bench_caf: no remote workload '%s'\n", argv[2]);
      return 2;
    }
    caf::actor_system_config cfg;
    base_config(cfg, *w);
    caf::actor_system sys{cfg};
    return caf_bench::remote_server(sys, argv[2], argv[3]);
  }
#endif
  if (argc != 2) {
    usage(stderr);
    return 2;
  }
  const workload* selected = find_workload(argv[1]);
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
  //  - Remote workloads load the middleman (BASP over TCP) with all of its
  //    settings at their defaults and pick the scheduler policy that
  //    measured faster for each (remote.cpp, configure_common, and
  //    bench/peers/README.md say why).
  caf::actor_system_config cfg;
  base_config(cfg, *selected);
  {
    caf::actor_system sys{cfg};
    selected->run(sys);
    // ~actor_system waits until every actor has terminated; each workload
    // makes sure its actors quit (or are unreachable) before returning.
  }
  return 0;
}
