#pragma once
// Shared helpers for the CAF 0.17 peer (bench_caf). See bench/common/report.hpp
// for the contract with bench/run and the troupe side.
//
// Conventions used throughout the CAF workloads:
//  - Dynamically typed, event-based actors (`caf::event_based_actor` /
//    `caf::stateful_actor<State>`). In CAF 0.17 typed actors use the very same
//    runtime path (mailbox, behavior matching); the typing is compile-time
//    only, so the dynamic flavour is the idiomatic and equally fast choice.
//  - Messages are builtin integers, tagged with CAF atoms only where needed
//    (control messages, request/response); neither needs type registration
//    and both are matched by a single precomputed type token.
//  - The only blocking actor is the `caf::scoped_actor` in main() acting as
//    the driver: it kicks the workload off and waits for its "done" message.
//    Timing is taken in the driver, from the kick-off to the "done" message,
//    the same points the troupe side uses.

#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/report.hpp"

namespace caf_bench {

using start_atom = caf::atom_constant<caf::atom("start")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using retrieve_atom = caf::atom_constant<caf::atom("retrieve")>;
using next_atom = caf::atom_constant<caf::atom("next")>;
using ok_atom = caf::atom_constant<caf::atom("ok")>;
using ask_atom = caf::atom_constant<caf::atom("ask")>;

// Generous upper bound for any single wait in the driver; bench/run kills the
// process after 300 s anyway, this only turns a hang into a clear message.
inline constexpr auto kDriverTimeout = std::chrono::seconds(280);

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "bench_caf: %s\n", what);
  std::fflush(stderr);
  std::_Exit(1);
}

// Blocks the driver until one message matching `fs...` arrives; an error
// message or the driver timeout aborts the process.
template <class... Fs>
void await(caf::scoped_actor& self, const char* what, Fs&&... fs) {
  self->receive(
    std::forward<Fs>(fs)...,
    [&](caf::error& err) {
      std::fprintf(stderr, "bench_caf: %s: %s\n", what,
                   self->system().render(err).c_str());
      std::_Exit(1);
    },
    caf::after(kDriverTimeout) >> [&] {
      std::fprintf(stderr, "bench_caf: %s: timed out\n", what);
      std::_Exit(1);
    });
}

// One function per workload; each runs in a fresh actor_system.
void ping_pong(caf::actor_system& sys);
void counting(caf::actor_system& sys);
void fan_in(caf::actor_system& sys, int senders);
void skynet(caf::actor_system& sys);
void thread_ring(caf::actor_system& sys);
void ask(caf::actor_system& sys);
void idle_memory(caf::actor_system& sys);

#if BENCH_CAF_HAVE_IO
// The remote workloads (remote.cpp, bench/common/remote.hpp): the client
// side, run as `bench_caf remote_tell|remote_ask`, and the server node it
// starts as `bench_caf remote_server <workload> <fd>`. Both sides configure
// their actor_system with the workload's *_configure (middleman, message
// types, scheduler policy).
void remote_tell_configure(caf::actor_system_config& cfg);
void remote_ask_configure(caf::actor_system_config& cfg);
void remote_tell(caf::actor_system& sys);
void remote_ask(caf::actor_system& sys);
int remote_server(caf::actor_system& sys, const char* workload, const char* port_fd);
#endif

}  // namespace caf_bench
