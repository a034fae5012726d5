// ask: one client makes kAskPairs strictly sequential requests to one server
// with CAF's request/response, each request with a 10 s timeout armed.

#include "peers/caf/common.hpp"

namespace caf_bench {
namespace {

caf::behavior server(caf::event_based_actor*) {
  return {
    [](ask_atom, int32_t x) { return x + 1; },
  };
}

struct client_state {
  caf::actor server;
  caf::actor driver;
  int32_t total = 0;
  int32_t sent = 0;
};

using client_actor = caf::stateful_actor<client_state>;

// Issues the next request; the response handler issues the one after it.
void next_request(client_actor* self) {
  const int32_t x = self->state.sent++;
  self->request(self->state.server, std::chrono::seconds(10), ask_atom::value, x)
    .then(
      [=](int32_t y) {
        if (y != x + 1)
          fail("ask: wrong reply");
        if (self->state.sent < self->state.total) {
          next_request(self);
        } else {
          self->send(self->state.driver, done_atom::value);
          self->quit();
        }
      },
      [=](caf::error& err) {
        std::fprintf(stderr, "bench_caf: ask: request failed: %s\n",
                     self->system().render(err).c_str());
        std::_Exit(1);
      });
}

caf::behavior client(client_actor* self, caf::actor srv, caf::actor driver,
                     int32_t total) {
  self->state.server = std::move(srv);
  self->state.driver = std::move(driver);
  self->state.total = total;
  return {
    [=](start_atom) { next_request(self); },
  };
}

}  // namespace

void ask(caf::actor_system& sys) {
  const auto pairs = static_cast<int32_t>(bench::kAskPairs / bench::scale());
  caf::scoped_actor driver{sys};
  auto server_actor = sys.spawn(server);
  auto client_actor_handle = sys.spawn(client, server_actor, caf::actor{driver}, pairs);
  bench::Stopwatch sw;
  caf::anon_send(client_actor_handle, start_atom::value);
  await(driver, "ask", [](done_atom) {});
  const double s = sw.seconds();
  caf::anon_send_exit(server_actor, caf::exit_reason::user_shutdown);
  bench::report("ask", static_cast<double>(pairs) / s, "pairs/s");
}

}  // namespace caf_bench
