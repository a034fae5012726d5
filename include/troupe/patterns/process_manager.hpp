#pragma once
// Back-pressured process manager (SPEC P1-P4).
//
// A *process* is long-running work modelled as an actor: a class A deriving
// from Actor<Msg> that declares `using result_type = R;` and is
// constructible from (ProcessHandle<R>, Args...). It finishes by calling
// complete(value) or fail(error) on its handle, from its own handlers or
// from any other thread:
//
//   struct Charge : troupe::Actor<ChargeMsg> {
//     using result_type = Receipt;
//     Charge(troupe::ProcessHandle<Receipt> h, Order o) : done(std::move(h)), order(std::move(o)) {}
//     void on_start() { ... ask the payment gateway ... }
//     void receive(ChargeMsg& m) { ... done.complete(Receipt{...}); }
//     troupe::ProcessHandle<Receipt> done;
//     Order order;
//   };
//
//   auto pm = troupe::ProcessManager<Charge>::start(system, {.name = "charges", .max_running = 64});
//   troupe::Future<Receipt> r = pm->submit(order);           // answered when the process has finished
//   troupe::Future<troupe::ProcessId> a = pm->enqueue(order);  // answered when it was accepted
//
// What the manager guarantees:
//   P1  At most max_running processes are alive at once; up to `buffer` more
//       requests wait, first in first out. A request that finds
//       max_running + buffer requests outstanding is refused on the caller's
//       thread, before any message is sent: its Future is already complete
//       with ErrorCode::buffer_overflow, and its arguments are not consumed.
//   P2  Processes are the manager's children and are watched by it. A slot
//       is freed when its process actor has terminated, whatever ended it:
//       completion (the manager then stops the actor), failure, an exception
//       (default stop supervision), or a stop by anyone. If the manager stops
//       (stop(), the system's shutdown, or a fault of its own) every request
//       it holds is answered with ErrorCode::shutting_down.
//   P3  Optionally at most starts_per_second process starts per second
//       (a token bucket of `burst` tokens), timed by actor timers, so the
//       manual clock drives it in tests.
//   P4  submit() answers with the process's outcome; enqueue() answers on
//       acceptance and reports the outcome to settings.on_outcome.
//
// A process is spawned as a thin subclass of A that keeps the exception
// escaping receive() or on_start(), so a caller can rethrow the original
// object. An exception from a become() behaviour or an ask continuation
// reaches the caller as handler_failed with its text only (the runtime's
// Down carries no exception object); catch it and call
// handle.fail(Error::from_exception(...)) to keep it.
//
// See doc/process_manager.md for the mechanism behind each guarantee; the
// machinery is in detail/process_state.hpp (one process), process_requests.hpp
// (admission and answering) and process_manager_actor.hpp (the manager).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/patterns/detail/process_manager_actor.hpp"
#include "troupe/patterns/detail/process_requests.hpp"
#include "troupe/patterns/detail/process_state.hpp"

namespace troupe {

// Identifies one accepted request (and the process that runs it) within its
// manager; assigned in acceptance order, starting at 1.
using ProcessId = std::uint64_t;

// ---------------------------------------------------------------------------
// ProcessHandle

// A process's right to finish: complete it with a value or fail it with an
// error. The first completion wins; later ones are ignored (they return
// false), as are completions after the process actor already ended.
// Completing asks the manager's runtime to stop the process actor; its slot
// is freed, and a submit() caller answered, once the actor has terminated.
// Ownership: a copyable handle to state shared with the manager; copies may
// outlive the process and the manager (they then do nothing).
// Thread safety: every member may be called from any thread, concurrently.
template <class R>
class ProcessHandle {
 public:
  using result_type = R;

  // An empty handle: completing it does nothing and returns false.
  ProcessHandle() = default;

  // The id of the request this process runs (0 for an empty handle).
  ProcessId id() const noexcept;

  // Finishes the process with `value`. True if this call finished it.
  template <class V = R>
  requires(!std::is_void_v<V>) bool complete(std::type_identity_t<V> value) const {
    return st_ && st_->settle(Result<R>(std::move(value)));
  }
  // Finishes a process whose result type is void.
  bool complete() const requires std::is_void_v<R> { return st_ && st_->settle(Result<R>()); }
  // Finishes the process with an error (an error with code ok is turned into
  // handler_failed, so a failure can never read as a success).
  bool fail(Error e) const {
    if (!st_) return false;
    if (e.code() == ErrorCode::ok) {
      e = Error(ErrorCode::handler_failed,
                e.message().empty() ? "process failed without an error code" : e.message());
    }
    return st_->settle(Result<R>(std::move(e)));
  }
  // True once the process finished (by a completion, or because its actor ended).
  bool done() const noexcept;

 private:
  template <class>
  friend class detail::ProcessManagerActor;
  template <class T>
  friend std::shared_ptr<detail::ProcessState<T>> detail::state_of(const ProcessHandle<T>& h) noexcept;
  explicit ProcessHandle(std::shared_ptr<detail::ProcessState<R>> st) noexcept : st_(std::move(st)) {}
  std::shared_ptr<detail::ProcessState<R>> st_;
};

// ---------------------------------------------------------------------------
// Settings and metrics

// How a ProcessManager runs its processes. R is the processes' result type
// (ProcessManager<A>::Settings names it for you). Validated by
// ProcessManager<A>::start(); see there for the rules.
template <class R>
struct ProcessManagerSettings {
  // The manager actor's name; process actors are named "<name>/<id>" unless
  // process_options.name gives another prefix. Appears in every error
  // message. Non-empty.
  std::string name = "processes";
  // P1: processes alive at once. At least 1.
  std::size_t max_running = 64;
  // P1: accepted requests that may wait beyond max_running running ones.
  // Zero: refuse whatever finds every slot taken.
  std::size_t buffer = 1024;
  // P3: at most this many process starts per second; 0 = no throttle.
  // Finite; if not 0, at least 1e-9 (one start in ~31 years).
  double starts_per_second = 0;
  // P3: starts allowed at once after an idle period (bucket size). At least
  // 1 when throttled; ignored otherwise.
  std::size_t burst = 1;
  // How each process actor is spawned: mailbox bound, stash bound,
  // supervision. Under the default (stop), a process that throws ends and
  // its caller gets the exception. Under restart, it is rebuilt from its
  // constructor arguments (its handle included) and keeps its slot until it
  // finishes or its restart limit is reached.
  SpawnOptions process_options{};
  // P4: called with the outcome of every process started with enqueue(),
  // including those cancelled by the manager's stop (shutting_down). Runs on
  // the manager's thread, one call at a time; keep it short and
  // non-blocking. An exception it throws is dropped.
  std::function<void(ProcessId, const Result<R>&)> on_outcome{};
};

// A ProcessManager's metrics. Each field is read atomically, one after the
// other: each is exact, the set is not one instant's snapshot.
struct ProcessStats {
  // Process actors alive now: spawned and not yet seen terminated. <= max_running.
  std::uint64_t running = 0;
  // Accepted requests waiting in the manager's FIFO for a slot. <= buffer
  // without a throttle; with one, requests that have a free slot but wait
  // for a start token wait here too, so then running + buffered <= max_running + buffer.
  std::uint64_t buffered = 0;
  // Accepted requests not yet answered-and-freed: running + buffered + those
  // on their way to the manager. The admission bound: <= max_running + buffer.
  std::uint64_t outstanding = 0;
  // Requests admitted (submit() and enqueue()) since start.
  std::uint64_t accepted = 0;
  // Requests refused at once with buffer_overflow (P1).
  std::uint64_t refused = 0;
  // Processes that finished with complete().
  std::uint64_t completed = 0;
  // Processes that finished otherwise: fail(), an exception, a stop before
  // completing, a constructor that threw.
  std::uint64_t failed = 0;
  // Accepted requests answered with shutting_down because the manager
  // stopped before their process finished (or started).
  std::uint64_t cancelled = 0;
  // Highest `running` and `buffered` seen since start.
  std::uint64_t peak_running = 0;
  std::uint64_t peak_buffered = 0;
};

// ---------------------------------------------------------------------------
// ProcessManager

// A back-pressured manager of processes of type A (see the top of this file).
// Ownership: a copyable handle; copies share one manager actor, which the
// ActorSystem owns. Dropping every handle does not stop it: stop() or the
// system's shutdown does. The handle may outlive the system (calls then
// answer shutting_down).
// Thread safety: every member may be called from any thread, also from
// actor handlers (nothing blocks; use Future::then inside an actor).
template <class A>
class ProcessManager {
 public:
  using result_type = typename A::result_type;
  using Settings = ProcessManagerSettings<result_type>;

  static_assert(detail::ActorType<A>, "a process must derive from Actor<Msg> and have receive(Msg&)");
  static_assert(!std::is_abstract_v<A>, "a process type must be concrete");

  // Spawns the manager actor (named settings.name) in `system`.
  // Errors: invalid_argument (empty name, max_running 0, max_running +
  // buffer overflowing, starts_per_second NaN, infinite, negative or below
  // 1e-9, burst 0 with a throttle), shutting_down (the system no longer
  // spawns actors).
  static Result<ProcessManager> start(ActorSystem& system, Settings settings) {
    if (auto v = detail::validate_process_manager(settings.name, settings.max_running, settings.buffer,
                                                  settings.starts_per_second, settings.burst);
        !v.ok()) {
      return std::move(v).error();
    }
    std::string name = settings.name;
    auto core = std::make_shared<detail::ProcessManagerCore<A>>(std::move(settings));
    auto ref = system.spawn<detail::ProcessManagerActor<A>>(SpawnOptions{.name = name}, core);
    if (!ref)
      return Error(ErrorCode::shutting_down,
                   "process manager '" + name + "': the actor system is shutting down");
    return ProcessManager(std::move(core), std::move(ref));
  }

  // P4, reply on completion: runs A(handle, args...) and answers with what
  // the process completed or failed with, or why it ended without:
  // handler_failed (it threw; error().rethrow_if_exception() rethrows the
  // original exception when it escaped receive() or on_start()), no_reply
  // (it stopped, or was stopped, without completing), shutting_down (the
  // manager stopped first). The future completes after the process actor
  // has terminated and its slot is free, so a caller that waits for each
  // run before the next is never refused for its own earlier runs.
  // P1: refused at once with buffer_overflow when max_running + buffer
  // requests are outstanding; the arguments are then left untouched.
  template <class... Args>
  Future<result_type> submit(Args&&... args) const {
    auto* reply = new detail::FutureAsk<result_type>();
    Future<result_type> f(reply);
    auto r = admit(reply, std::forward<Args>(args)...);
    if (!r.ok()) reply->complete(std::move(r).error());
    return f;
  }

  // P4, reply on acceptance: like submit(), but the future (complete on
  // return) holds the process's id as soon as the request is accepted
  // (buffered or started), or buffer_overflow / shutting_down. The outcome
  // goes to settings.on_outcome and the counters.
  template <class... Args>
  Future<ProcessId> enqueue(Args&&... args) const {
    return detail::ready_future<ProcessId>(admit(nullptr, std::forward<Args>(args)...));
  }

  // Stops the manager: later requests are refused with shutting_down, every
  // buffered and running request is answered with shutting_down, and the
  // process actors are stopped. Returns at once; the rest happens in the
  // manager actor.
  void stop() const {
    core_->closed.store(true, std::memory_order_release);
    ref_.stop();
  }
  // True once the manager actor has terminated.
  bool stopped() const noexcept { return ref_.terminated(); }

  ProcessStats stats() const noexcept { return core_->counters.snapshot(); }
  const Settings& settings() const noexcept { return core_->settings; }
  const std::string& name() const noexcept { return core_->settings.name; }

 private:
  using Message = detail::ProcessManagerMsg<A>;

  ProcessManager(std::shared_ptr<detail::ProcessManagerCore<A>> core, ActorRef<Message> ref)
      : core_(std::move(core)), ref_(std::move(ref)) {}

  template <class... Args>
  Result<ProcessId> admit(detail::FutureAsk<result_type>* reply, Args&&... args) const {
    static_assert(std::is_constructible_v<A, ProcessHandle<result_type>&, std::decay_t<Args>&...>,
                  "A must be constructible from (ProcessHandle<result_type>&, Args&...)");
    static_assert(
        (std::is_copy_constructible_v<std::decay_t<Args>> && ...),
        "process arguments must be copyable: the runtime keeps them to rebuild a restarted process");
    auto& core = *core_;
    if (core.closed.load(std::memory_order_acquire))
      return Error(ErrorCode::shutting_down, core.closed_message());
    if (!core.admit()) {
      core.counters.refused.fetch_add(1, std::memory_order_relaxed);
      return Error(ErrorCode::buffer_overflow, core.overflow_message);
    }
    struct Unadmit {
      detail::ProcessManagerCore<A>* core;
      ~Unadmit() {
        if (core) core->unadmit();
      }
    } unadmit{&core};
    const ProcessId id = core.counters.next_id.fetch_add(1, std::memory_order_relaxed) + 1;
    // The request owns one reference to the reply from here; if building
    // the message throws, the unarmed request just lets go of it.
    auto req = std::make_unique<detail::ProcessRequestWith<A, std::decay_t<Args>...>>(
        &core, id, reply, std::forward<Args>(args)...);
    if (reply) reply->retain();
    auto* e = new detail::MsgEnvelope<Message>(detail::ProcessSubmit<A>{std::move(req)});
    auto& request = *std::get<detail::ProcessSubmit<A>>(e->msg).request;
    request.arm();
    // Counted before the push, so accepted never trails the outcomes the
    // manager counts; undone if the push fails.
    core.counters.accepted.fetch_add(1, std::memory_order_relaxed);
    // The envelope is pushed by hand rather than with tell(): a refused push
    // hands it back, so the caller (not a destructor) reports the refusal.
    if (ref_.cell()->push_user(e) != Delivery::delivered) {
      core.counters.accepted.fetch_sub(1, std::memory_order_relaxed);
      request.disarm();
      delete e;  // the request lets go of the reply; the guard frees the admission
      return Error(ErrorCode::shutting_down, core.closed_message());
    }
    unadmit.core = nullptr;
    return id;
  }

  std::shared_ptr<detail::ProcessManagerCore<A>> core_;
  ActorRef<Message> ref_;
};

// --- ProcessHandle members --------------------------------------------------------

template <class R>
ProcessId ProcessHandle<R>::id() const noexcept {
  return st_ ? st_->id() : 0;
}

template <class R>
bool ProcessHandle<R>::done() const noexcept {
  return st_ && st_->done();
}

}  // namespace troupe
