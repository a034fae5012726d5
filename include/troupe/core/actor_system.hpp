#pragma once
// The actor system: worker threads, the timer queue, and the root of every
// actor's supervision tree.
//
// Ownership: the ActorSystem owns its threads and every actor spawned in it.
// Destroying it shuts it down (see shutdown()). ActorRefs may outlive it;
// telling through them afterwards is a dead letter.
// Thread-safety: all members are thread-safe.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"

namespace troupe {

// A message that could not be delivered because its recipient had stopped.
struct DeadLetter {
  std::string recipient;     // actor name, or "" if unnamed
  std::string message_type;  // demangled C++ type of the message
};

struct SystemConfig {
  // Worker threads; 0 = one per core.
  std::size_t threads = 0;
  // Messages an actor handles per activation before yielding its thread.
  std::uint32_t throughput = 64;
  // Time source; null = the system clock. Pass a ManualClock in tests.
  std::shared_ptr<Clock> clock{};
  // How long shutdown() lets actors drain their mailboxes before stopping them.
  Duration shutdown_drain_timeout = std::chrono::seconds(10);
  // Called for every dead letter (on the sending thread; keep it cheap).
  std::function<void(const DeadLetter&)> on_dead_letter{};
  // Log the first dead letters and then one in every 1000 (info, component
  // core, troupe/core/log.hpp).
  bool log_dead_letters = true;
  // Log handler failures (exceptions) (warn, component core).
  bool log_failures = true;
};

// Counters, read at any time; each is exact, the set is not a snapshot.
struct SystemStats {
  std::uint64_t actors_spawned = 0;
  std::uint64_t actors_live = 0;
  std::uint64_t dead_letters = 0;
  std::uint64_t mailbox_overflows = 0;
  std::uint64_t handler_failures = 0;
  std::uint64_t restarts = 0;
  std::uint64_t stale_timer_fires = 0;  // fires of cancelled/replaced timers, dropped
  std::uint64_t timers_pending = 0;
  // User messages accepted into mailboxes, and taken out by their actors
  // (or dropped when the actor stopped), since start.
  std::uint64_t messages_delivered = 0;
  std::uint64_t messages_taken = 0;
  // Messages waiting in mailboxes now (delivered - taken), and actors with
  // messages waiting for a worker thread.
  std::uint64_t mailbox_depth = 0;
  std::uint64_t runnable_actors = 0;
};

class ActorSystem {
 public:
  explicit ActorSystem(SystemConfig config = {});
  ~ActorSystem();
  ActorSystem(const ActorSystem&) = delete;
  ActorSystem& operator=(const ActorSystem&) = delete;

  // Spawns a top-level actor: spawn<A>(ctor args...) or
  // spawn<A>(SpawnOptions{...}, ctor args...). A's constructor runs on the
  // calling thread (its exceptions propagate); on_start runs in the actor.
  // After shutdown() began, returns an empty ref.
  template <class A, class... Args>
  ActorRef<typename A::message_type> spawn(Args&&... args) {
    return detail::spawn_under<A>(*impl_, root(), std::forward<Args>(args)...);
  }

  // Request/response from outside any actor: `make(ReplyTo<R>)` builds the
  // request. The future yields the reply or timeout / dead_letter /
  // mailbox_full / no_reply.
  template <class R, class M, class Make>
  Future<R> ask(const ActorRef<M>& target, Make&& make, Duration timeout) {
    auto* st = new detail::FutureAsk<R>();
    Future<R> f(st);
    detail::send_ask<R>(*impl_, st, target, std::forward<Make>(make), timeout);
    return f;
  }

  // A reply target and the future it completes, with a timeout: for
  // requests that leave through something other than an actor reference (a
  // remote node, a queue). `make(ReplyTo<R>)` builds the request and returns
  // whatever the caller needs from it; the future completes with the reply,
  // an error the target answered, no_reply if the target is dropped, or
  // timeout. Returns {future, make's result}.
  template <class R, class Make>
  auto ask_with(Make&& make, Duration timeout) -> std::pair<Future<R>, std::invoke_result_t<Make, ReplyTo<R>>> {
    auto* st = new detail::FutureAsk<R>();
    Future<R> f(st);
    if (!st->arm(*impl_, deadline_after(detail::clock_of(*impl_).now(), timeout))) {
      // Shutting down: the future already holds that error; the request is
      // still built so the caller can tell, and its target answers nothing.
    }
    return {std::move(f), std::forward<Make>(make)(ReplyTo<R>(st))};
  }

  // Orderly shutdown: refuses new spawns and outside tells, lets actors drain
  // their mailboxes (up to shutdown_drain_timeout), stops every actor
  // (on_stop runs, watchers hear ExitReason::shutdown), then joins the
  // threads. Blocks until done. A second call returns at once. Must not be
  // called from inside an actor.
  void shutdown();

  // Registers `hook` to run at the start of shutdown(), before intake closes,
  // on the thread that calls shutdown(); hooks added later run first. A hook
  // may block (it is how a layer stops gracefully: entity registries wait
  // for processing entities here, SPEC E6) and must not throw. Returns an
  // id for remove_shutdown_hook. After shutdown began, the hook is not kept
  // and 0 is returned.
  std::uint64_t add_shutdown_hook(std::function<void()> hook);
  void remove_shutdown_hook(std::uint64_t id);

  // Tests: blocks until no actor has anything to do (all mailboxes empty, all
  // workers parked) or `timeout` passes; true if idle. Pending timers do not
  // count as work.
  bool wait_idle(Duration timeout = std::chrono::seconds(10));

  SystemStats stats() const;
  Clock& clock() const;
  std::size_t threads() const;

  detail::SystemImpl& impl() noexcept { return *impl_; }

 private:
  detail::CellBase* root() const noexcept;
  std::unique_ptr<detail::SystemImpl> impl_;
};

}  // namespace troupe
