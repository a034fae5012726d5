// thread_ring: kRingSize actors in a ring pass a token carrying a counter
// that starts at kRingHops; each hop decrements it; at 0 the ring is done.

#include <vector>

#include "peers/caf/common.hpp"

namespace caf_bench {
namespace {

struct ring_state {
  caf::actor next;
};

caf::behavior ring_node(caf::stateful_actor<ring_state>* self, caf::actor driver) {
  return {
    [=](int32_t token) {
      if (token > 0)
        self->send(self->state.next, token - 1);
      else
        self->send(driver, done_atom::value);
    },
    [=](next_atom, caf::actor& next) {
      self->state.next = std::move(next);
      return ok_atom::value;
    },
  };
}

}  // namespace

void thread_ring(caf::actor_system& sys) {
  const auto hops = static_cast<int32_t>(bench::kRingHops / bench::scale());
  caf::scoped_actor driver{sys};
  std::vector<caf::actor> ring;
  ring.reserve(bench::kRingSize);
  for (int i = 0; i < bench::kRingSize; ++i)
    ring.push_back(sys.spawn(ring_node, caf::actor{driver}));
  // Wire the ring and wait until every node has its neighbour, so the timed
  // part is the token passing only.
  for (int i = 0; i < bench::kRingSize; ++i)
    driver->request(ring[i], caf::infinite, next_atom::value, ring[(i + 1) % bench::kRingSize])
      .receive([](ok_atom) {}, [](caf::error&) { fail("thread_ring: wiring failed"); });
  bench::Stopwatch sw;
  caf::anon_send(ring[0], hops);
  await(driver, "thread_ring", [](done_atom) {});
  const double s = sw.seconds();
  // The nodes reference each other in a cycle: stop them explicitly.
  for (auto& node : ring)
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  bench::report("thread_ring", static_cast<double>(hops) / s, "hops/s");
}

}  // namespace caf_bench
