// fan_in_K: K senders each send kFanInPerSender ints to one receiver from a
// single handler invocation; the receiver signals once it has seen them all.

#include <string>
#include <vector>

#include "peers/caf/common.hpp"

namespace caf_bench {
namespace {

struct receiver_state {
  int64_t received = 0;
};

caf::behavior receiver(caf::stateful_actor<receiver_state>* self,
                       caf::actor driver, int64_t expected) {
  return {
    [=](int32_t) {
      if (++self->state.received == expected) {
        self->send(driver, done_atom::value);
        self->quit();
      }
    },
  };
}

caf::behavior sender(caf::event_based_actor* self, caf::actor target, int64_t n) {
  return {
    [=](start_atom) {
      for (int64_t i = 0; i < n; ++i)
        self->send(target, static_cast<int32_t>(i));
      self->quit();
    },
  };
}

}  // namespace

void fan_in(caf::actor_system& sys, int senders) {
  const int64_t per = bench::kFanInPerSender / bench::scale();
  const int64_t total = per * senders;
  caf::scoped_actor driver{sys};
  auto sink = sys.spawn(receiver, caf::actor{driver}, total);
  std::vector<caf::actor> sources;
  sources.reserve(static_cast<size_t>(senders));
  for (int i = 0; i < senders; ++i)
    sources.push_back(sys.spawn(sender, sink, per));
  bench::Stopwatch sw;
  for (auto& src : sources)
    caf::anon_send(src, start_atom::value);
  await(driver, "fan_in", [](done_atom) {});
  const double s = sw.seconds();
  const std::string name = "fan_in_" + std::to_string(senders);
  bench::report(name.c_str(), static_cast<double>(total) / s, "msgs/s");
}

}  // namespace caf_bench
