// counting (Savina "Counting Actor"): a producer sends kCountingMessages
// increments to a counter from a single handler invocation, then asks for the
// count and checks it.

#include "peers/caf/common.hpp"

namespace caf_bench {
namespace {

struct counter_state {
  int64_t count = 0;
};

caf::behavior counter(caf::stateful_actor<counter_state>* self) {
  return {
    // An increment is a bare int (no tag atom: smaller message, one type
    // token to match, ~5% faster). Hot handler first: CAF tries the cases of a
    // behavior in order.
    [=](int32_t delta) { self->state.count += delta; },
    [=](retrieve_atom) { return self->state.count; },
  };
}

caf::behavior producer(caf::event_based_actor* self, caf::actor target,
                       caf::actor driver, int64_t n) {
  return {
    [=](start_atom) {
      for (int64_t i = 0; i < n; ++i)
        self->send(target, int32_t{1});
      // No timeout: a 10M-message backlog can legitimately take a while.
      self->request(target, caf::infinite, retrieve_atom::value)
        .then(
          [=](int64_t count) {
            if (count != n) {
              std::fprintf(stderr, "bench_caf: counting: expected %lld, got %lld\n",
                           static_cast<long long>(n), static_cast<long long>(count));
              std::_Exit(1);
            }
            self->send(driver, done_atom::value);
            self->quit();
          },
          [=](caf::error&) { fail("counting: retrieve failed"); });
    },
  };
}

}  // namespace

void counting(caf::actor_system& sys) {
  const int64_t n = bench::kCountingMessages / bench::scale();
  caf::scoped_actor driver{sys};
  auto counter_actor = sys.spawn(counter);
  auto producer_actor = sys.spawn(producer, counter_actor, caf::actor{driver}, n);
  bench::Stopwatch sw;
  caf::anon_send(producer_actor, start_atom::value);
  await(driver, "counting", [](done_atom) {});
  const double s = sw.seconds();
  caf::anon_send_exit(counter_actor, caf::exit_reason::user_shutdown);
  bench::report("counting", static_cast<double>(n) / s, "msgs/s");
  bench::report("counting_peak_rss",
                static_cast<double>(bench::proc_status_kb("VmHWM")) / 1024.0, "MB");
}

}  // namespace caf_bench
