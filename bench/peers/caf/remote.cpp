// remote_tell and remote_ask: CAF 0.17 remote actors (libcaf_io, BASP over
// TCP) between this process and a second copy of it on 127.0.0.1. The
// protocol, counts and measurement points are bench/common/remote.hpp's.
//
// The server publishes its actor with middleman::publish on port 0
// (127.0.0.1) and announces the port; the client gets a proxy with
// middleman::remote_actor and talks to it like to any local actor.
//
// remote_ask's client is an event-based actor with request(...).then. The
// other idiomatic form, a blocking scoped_actor looping over
// request(...).receive, measured no faster (throughput and p50 the same
// within noise, a wider p99; TROUPE_BENCH_CAF_REMOTE_ASK=blocking
// re-measures it). The scheduler policy per workload is explained at
// configure_common.

#include <caf/io/all.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/remote.hpp"
#include "peers/caf/common.hpp"

namespace caf_bench {

// The tell message. A custom type, so it needs an inspect() and a
// registration with add_message_type (configure_common) to cross the wire.
struct tell_msg {
  uint64_t seq = 0;
  std::string tag;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tell_msg& x) {
  return f(caf::meta::type_name("tell_msg"), x.seq, x.tag);
}

struct ask_request {
  uint64_t seq = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ask_request& x) {
  return f(caf::meta::type_name("ask_request"), x.seq);
}

struct ask_response {
  uint64_t seq = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ask_response& x) {
  return f(caf::meta::type_name("ask_response"), x.seq);
}

namespace {

namespace rb = bench::remote;
using clock_type = std::chrono::steady_clock;
using ack_atom = caf::atom_constant<caf::atom("ack")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

int64_t ns_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// --- remote_tell ---------------------------------------------------------------

struct sink_state {
  uint64_t received = 0;
};

caf::behavior tell_sink(caf::stateful_actor<sink_state>* self) {
  return {
    [=](const tell_msg& m) {
      auto& st = self->state;
      if (m.seq != st.received || m.tag.size() != rb::kTagSize)
        fail("remote_tell: sink got an unexpected message");
      if (++st.received % rb::kTellAckEvery == 0)
        self->send(caf::actor_cast<caf::actor>(self->current_sender()), ack_atom::value,
                   st.received);
    },
    [=](stop_atom) { self->quit(); },
  };
}

struct sender_state {
  caf::actor sink;
  caf::actor driver;
  uint64_t warmup = 0;
  uint64_t total = 0;  // warm-up + timed
  uint64_t sent = 0;
  uint64_t acked = 0;
  bool timing = false;
  clock_type::time_point start;
  std::string tag;
};

using sender_actor = caf::stateful_actor<sender_state>;

// Sends until the phase's last message is out or the window is full.
void top_up(sender_actor* self) {
  auto& st = self->state;
  const uint64_t limit = st.timing ? st.total : st.warmup;
  const uint64_t window = static_cast<uint64_t>(rb::kTellWindow);
  while (st.sent < limit && st.sent - st.acked < window) {
    self->send(st.sink, tell_msg{st.sent, st.tag});
    ++st.sent;
  }
}

caf::behavior tell_sender(sender_actor* self, caf::actor sink, caf::actor driver,
                          uint64_t warmup, uint64_t timed) {
  auto& st = self->state;
  st.sink = std::move(sink);
  st.driver = std::move(driver);
  st.warmup = warmup;
  st.total = warmup + timed;
  st.tag = rb::tell_tag();
  // A server that dies (e.g. its sink failed a check) must not leave us
  // waiting for acks until the driver's timeout.
  self->monitor(st.sink);
  self->set_down_handler([](caf::down_msg&) { fail("remote_tell: the server went away"); });
  return {
    [=](ack_atom, uint64_t count) {
      auto& s = self->state;
      s.acked = count;
      if (count == s.total) {
        self->send(s.driver, done_atom::value, ns_between(s.start, clock_type::now()));
        self->quit();
        return;
      }
      if (!s.timing && count == s.warmup) {
        s.timing = true;
        s.start = clock_type::now();
      }
      top_up(self);
    },
    [=](start_atom) { top_up(self); },
  };
}

void measure_tell(caf::actor_system& sys, caf::actor sink) {
  const auto warmup = static_cast<uint64_t>(rb::tell_warmup());
  const auto timed = static_cast<uint64_t>(rb::tell_messages());
  caf::scoped_actor driver{sys};
  auto sender = sys.spawn(tell_sender, sink, caf::actor{driver}, warmup, timed);
  caf::anon_send(sender, start_atom::value);
  int64_t ns = 0;
  await(driver, "remote_tell", [&](done_atom, int64_t elapsed) { ns = elapsed; });
  rb::report_tell(static_cast<double>(ns) / 1e9, static_cast<long>(timed));
}

// --- remote_ask ----------------------------------------------------------------

caf::behavior ask_responder(caf::event_based_actor* self) {
  return {
    [](const ask_request& r) { return ask_response{r.seq}; },
    [=](stop_atom) { self->quit(); },
  };
}

struct ask_result {
  std::vector<int64_t> latencies_ns;
  int64_t elapsed_ns = 0;
};

struct asker_state {
  caf::actor responder;
  caf::actor driver;
  ask_result* result = nullptr;  // owned by the driver, read after done_atom
  uint64_t warmup = 0;
  uint64_t total = 0;  // warm-up + timed
  uint64_t seq = 0;
  clock_type::time_point start;
};

using asker_actor = caf::stateful_actor<asker_state>;

// Issues request `seq`; its response handler issues the next one.
void next_request(asker_actor* self) {
  const uint64_t seq = self->state.seq;
  const auto sent = clock_type::now();
  if (seq == self->state.warmup)
    self->state.start = sent;
  self->request(self->state.responder, std::chrono::seconds(10), ask_request{seq})
    .then(
      [=](const ask_response& r) {
        const auto now = clock_type::now();
        auto& st = self->state;
        if (r.seq != seq)
          fail("remote_ask: wrong response");
        if (seq >= st.warmup)
          st.result->latencies_ns.push_back(ns_between(sent, now));
        if (++st.seq < st.total) {
          next_request(self);
        } else {
          st.result->elapsed_ns = ns_between(st.start, now);
          self->send(st.driver, done_atom::value);
          self->quit();
        }
      },
      [=](caf::error& err) {
        std::fprintf(stderr, "bench_caf: remote_ask: request failed: %s\n",
                     self->system().render(err).c_str());
        std::_Exit(1);
      });
}

caf::behavior asker(asker_actor* self, caf::actor responder, caf::actor driver,
                    ask_result* result, uint64_t warmup, uint64_t timed) {
  auto& st = self->state;
  st.responder = std::move(responder);
  st.driver = std::move(driver);
  st.result = result;
  st.warmup = warmup;
  st.total = warmup + timed;
  self->monitor(st.responder);
  self->set_down_handler([](caf::down_msg&) { fail("remote_ask: the server went away"); });
  return {
    [=](start_atom) { next_request(self); },
  };
}

void remote_ask_event(caf::actor_system& sys, caf::actor responder, uint64_t warmup,
                      uint64_t timed, ask_result& result) {
  caf::scoped_actor driver{sys};
  auto a = sys.spawn(asker, responder, caf::actor{driver}, &result, warmup, timed);
  caf::anon_send(a, start_atom::value);
  await(driver, "remote_ask", [](done_atom) {});
}

void remote_ask_blocking(caf::actor_system& sys, const caf::actor& responder,
                         uint64_t warmup, uint64_t timed, ask_result& result) {
  caf::scoped_actor self{sys};
  clock_type::time_point start;
  for (uint64_t seq = 0; seq < warmup + timed; ++seq) {
    const auto sent = clock_type::now();
    if (seq == warmup)
      start = sent;
    self->request(responder, std::chrono::seconds(10), ask_request{seq})
      .receive(
        [&](const ask_response& r) {
          const auto now = clock_type::now();
          if (r.seq != seq)
            fail("remote_ask: wrong response");
          if (seq >= warmup)
            result.latencies_ns.push_back(ns_between(sent, now));
          result.elapsed_ns = ns_between(start, now);
        },
        [&](caf::error& err) {
          std::fprintf(stderr, "bench_caf: remote_ask: request failed: %s\n",
                       sys.render(err).c_str());
          std::_Exit(1);
        });
  }
}

void measure_ask(caf::actor_system& sys, caf::actor responder) {
  const auto warmup = static_cast<uint64_t>(rb::ask_warmup());
  const auto timed = static_cast<uint64_t>(rb::ask_round_trips());
  ask_result result;
  result.latencies_ns.reserve(timed);
  const char* driver = std::getenv("TROUPE_BENCH_CAF_REMOTE_ASK");
  if (driver != nullptr && std::string{driver} == "blocking")
    remote_ask_blocking(sys, responder, warmup, timed, result);
  else if (driver == nullptr || *driver == '\0' || std::string{driver} == "event")
    remote_ask_event(sys, responder, warmup, timed, result);
  else
    fail("TROUPE_BENCH_CAF_REMOTE_ASK must be 'event' or 'blocking'");
  rb::report_ask(static_cast<double>(result.elapsed_ns) / 1e9, result.latencies_ns);
}

// --- both --------------------------------------------------------------------

// Starts the server node, connects to its actor, runs `measure`, then stops
// the server and waits for it to exit while our middleman is still up (so
// the stop message is flushed to the socket before anything shuts down).
template <class Measure>
void run_client(caf::actor_system& sys, const char* workload, Measure measure) {
  rb::ServerProcess server{workload};
  auto remote = sys.middleman().remote_actor("127.0.0.1", server.port());
  if (!remote) {
    std::fprintf(stderr, "bench_caf: %s: remote_actor: %s\n", workload,
                 sys.render(remote.error()).c_str());
    std::_Exit(1);
  }
  measure(sys, *remote);
  caf::anon_send(*remote, stop_atom::value);
  if (!server.wait_exit())
    fail("remote server did not exit cleanly");
}

// Both processes of a workload use the same configuration. The middleman
// keeps all of its defaults (bench/peers/README.md says why); the scheduler
// policy is the one that measured faster for the workload:
//  - remote_tell: CAF's default work-stealing scheduler. The shared-queue
//    policy ("sharing") measured about half the throughput.
//  - remote_ask: "sharing". With work stealing, an idle worker polls its
//    queue with 50 us sleeps before it parks, and at one request in flight
//    the workers are idle most of the time, so each hop onto a worker pays
//    part of a sleep: p50 ~270 us against 90-150 us with "sharing", whose
//    workers park on a condition variable and are woken on enqueue.
// TROUPE_BENCH_CAF_REMOTE_SCHEDULER=stealing|sharing overrides the choice to
// re-measure it.
void configure_common(caf::actor_system_config& cfg, const char* policy) {
  cfg.load<caf::io::middleman>();
  cfg.add_message_type<tell_msg>("tell_msg");
  cfg.add_message_type<ask_request>("ask_request");
  cfg.add_message_type<ask_response>("ask_response");
  if (const char* env = std::getenv("TROUPE_BENCH_CAF_REMOTE_SCHEDULER"); env != nullptr && *env != '\0') {
    if (std::string{env} != "stealing" && std::string{env} != "sharing")
      fail("TROUPE_BENCH_CAF_REMOTE_SCHEDULER must be 'stealing' or 'sharing'");
    policy = env;
  }
  cfg.set("scheduler.policy", caf::atom_from_string(policy));
}

}  // namespace

void remote_tell_configure(caf::actor_system_config& cfg) {
  configure_common(cfg, "stealing");
}

void remote_ask_configure(caf::actor_system_config& cfg) {
  configure_common(cfg, "sharing");
}

void remote_tell(caf::actor_system& sys) {
  run_client(sys, "remote_tell", [](caf::actor_system& s, caf::actor sink) {
    measure_tell(s, std::move(sink));
  });
}

void remote_ask(caf::actor_system& sys) {
  run_client(sys, "remote_ask", [](caf::actor_system& s, caf::actor responder) {
    measure_ask(s, std::move(responder));
  });
}

int remote_server(caf::actor_system& sys, const char* workload, const char* port_fd) {
  caf::actor a;
  if (std::string{workload} == "remote_tell")
    a = sys.spawn(tell_sink);
  else if (std::string{workload} == "remote_ask")
    a = sys.spawn(ask_responder);
  else
    return 2;
  auto port = sys.middleman().publish(a, 0, "127.0.0.1");
  if (!port) {
    std::fprintf(stderr, "bench_caf: %s server: publish: %s\n", workload,
                 sys.render(port.error()).c_str());
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return 1;
  }
  if (!bench::remote::announce_port(port_fd, *port)) {
    std::fprintf(stderr, "bench_caf: %s server: cannot announce the port\n", workload);
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return 1;
  }
  // Runs until the client's stop message ends the actor. A client that dies
  // instead takes this process with it (PR_SET_PDEATHSIG, see remote.hpp).
  caf::scoped_actor self{sys};
  self->monitor(a);
  self->receive([](const caf::down_msg&) {});
  return 0;
}

}  // namespace caf_bench
