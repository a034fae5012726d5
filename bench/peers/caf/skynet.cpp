// skynet: a 10-ary tree of actors down to kSkynetLeaves leaves; each leaf
// sends its ordinal to its parent, inner nodes sum their 10 children, send
// the sum upward and terminate.

#include "peers/caf/common.hpp"

namespace caf_bench {
namespace {

constexpr int kFanOut = 10;

// A leaf has nothing to wait for: it sends its number and, having no
// behavior, terminates as soon as this function returns.
void skynet_leaf(caf::event_based_actor* self, caf::actor parent, int64_t num) {
  self->send(parent, num);
}

struct node_state {
  int64_t sum = 0;
  int pending = kFanOut;
};

caf::behavior skynet_node(caf::stateful_actor<node_state>* self,
                          caf::actor parent, int64_t num, int64_t size) {
  const int64_t child_size = size / kFanOut;
  auto me = caf::actor_cast<caf::actor>(self);
  for (int i = 0; i < kFanOut; ++i) {
    const int64_t child_num = num + i * child_size;
    if (child_size == 1)
      self->spawn(skynet_leaf, me, child_num);
    else
      self->spawn(skynet_node, me, child_num, child_size);
  }
  return {
    [=](int64_t x) {
      self->state.sum += x;
      if (--self->state.pending == 0) {
        self->send(parent, self->state.sum);
        self->quit();
      }
    },
  };
}

}  // namespace

void skynet(caf::actor_system& sys) {
  // Same shrinking rule as the troupe side: one tree level per factor of 10.
  int64_t leaves = bench::kSkynetLeaves;
  for (long s = bench::scale(); s >= 10 && leaves > kFanOut; s /= 10)
    leaves /= kFanOut;
  const int64_t expected = leaves * (leaves - 1) / 2;
  caf::scoped_actor driver{sys};
  int64_t sum = -1;
  bench::Stopwatch sw;
  sys.spawn(skynet_node, caf::actor{driver}, int64_t{0}, leaves);
  await(driver, "skynet", [&](int64_t x) { sum = x; });
  const double s = sw.seconds();
  if (sum != expected) {
    std::fprintf(stderr, "bench_caf: skynet: expected %lld, got %lld\n",
                 static_cast<long long>(expected), static_cast<long long>(sum));
    std::_Exit(1);
  }
  bench::report("skynet", s * 1e3, "ms");
}

}  // namespace caf_bench
