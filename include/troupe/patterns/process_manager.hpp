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
// See doc/process_manager.md for the mechanism behind each guarantee.

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

namespace troupe {

// Identifies one accepted request (and the process that runs it) within its
// manager; assigned in acceptance order, starting at 1.
using ProcessId = std::uint64_t;

template <class R>
class ProcessHandle;
template <class A>
class ProcessManager;

namespace detail {

template <class R>
class ProcessState;
template <class A>
class ProcessShell;
template <class A>
class ProcessManagerActor;

template <class R>
std::shared_ptr<ProcessState<R>> state_of(const ProcessHandle<R>& h) noexcept;

}  // namespace detail

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

namespace detail {

// --- non-template parts (src/patterns/process_manager.cpp) ---------------------

struct ProcessCounters {
  // The admission count every caller races on, on a cache line of its own;
  // then the other counters callers write; then those only the manager writes.
  alignas(64) std::atomic<std::uint64_t> outstanding{0};
  alignas(64) std::atomic<std::uint64_t> next_id{0};
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> refused{0};
  // Written by the manager actor only.
  alignas(64) std::atomic<std::uint64_t> running{0};
  std::atomic<std::uint64_t> buffered{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> peak_running{0};
  std::atomic<std::uint64_t> peak_buffered{0};

  ProcessStats snapshot() const noexcept;
};

// invalid_argument naming the manager and the offending setting, or ok.
Result<void> validate_process_manager(const std::string& name, std::size_t max_running, std::size_t buffer,
                                      double starts_per_second, std::size_t burst);
// Time between two starts at `starts_per_second` (> 0), rounded up to 1 ns.
Duration process_start_interval(double starts_per_second) noexcept;
// The buffer_overflow text: names the manager and its bounds.
std::string process_overflow_message(const std::string& name, std::size_t max_running, std::size_t buffer);
// What a requester whose process ended without completing is told.
Error process_ended_error(const std::string& process, ExitReason reason, const std::string& detail,
                          const std::exception_ptr& thrown);

// --- per-process state ---------------------------------------------------------

// Shared by a process's handles, its shell and the manager. The result is
// written once (first completion wins); the manager reads it when the
// process actor has terminated.
template <class R>
class ProcessState {
 public:
  explicit ProcessState(ProcessId id) noexcept : id_(id) {}

  ProcessId id() const noexcept { return id_; }
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

  // First completion wins. Stops the process actor if the manager has
  // attached it already (else attach() does).
  bool settle(Result<R>&& r) {
    CellRef to_stop;
    {
      std::lock_guard lk(mu_);
      if (done_.load(std::memory_order_relaxed)) return false;
      result_.emplace(std::move(r));
      done_.store(true, std::memory_order_release);
      to_stop = std::move(cell_);
    }
    if (to_stop) to_stop->request_stop();
    return true;
  }

  // The manager links the spawned actor. Holding the cell here forms a
  // cycle (the actor holds a handle to this state), which settle(),
  // outcome() and close() break; the manager always reaches one of them.
  void attach(CellRef cell) {
    {
      std::lock_guard lk(mu_);
      if (!done_.load(std::memory_order_relaxed)) {
        cell_ = std::move(cell);
        return;
      }
    }
    cell->request_stop();
  }
  // The manager stops before the actor ended: its result if it has one;
  // otherwise later completions are ignored from here on.
  std::optional<Result<R>> close() {
    CellRef drop;  // released after the lock
    std::lock_guard lk(mu_);
    drop = std::move(cell_);
    if (result_) return std::move(*result_);
    done_.store(true, std::memory_order_release);
    return std::nullopt;
  }

  // Kept so that a caller can rethrow what the process threw.
  void note_exception(std::exception_ptr e) noexcept {
    std::lock_guard lk(mu_);
    thrown_ = std::move(e);
  }

  // After the actor terminated: its result, or why it has none. Later
  // completions are ignored from here on.
  Result<R> outcome(const std::string& process, ExitReason reason, const std::string& why) {
    CellRef drop;  // released after the lock
    std::lock_guard lk(mu_);
    drop = std::move(cell_);
    if (result_) return std::move(*result_);
    done_.store(true, std::memory_order_release);
    return process_ended_error(process, reason, why, thrown_);
  }

 private:
  const ProcessId id_;
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::optional<Result<R>> result_;
  std::exception_ptr thrown_;
  CellRef cell_;
};

template <class R>
std::shared_ptr<ProcessState<R>> state_of(const ProcessHandle<R>& h) noexcept {
  return h.st_;
}

// Process actors are spawned as this subclass of A (unless A is final):
// it keeps the exception that escapes receive() or on_start(), so that a
// caller can rethrow the original object. The rest of A is untouched.
template <class A>
class ProcessShell final : public A {
 public:
  using R = typename A::result_type;
  using Msg = typename A::message_type;

  template <class... X>
  explicit ProcessShell(ProcessHandle<R>& h, X&... x) : A(h, x...), troupe_process_state_(state_of(h)) {}

  void on_start() {
    try {
      A::on_start();
    } catch (...) {
      troupe_process_state_->note_exception(std::current_exception());
      throw;
    }
  }
  void receive(Msg& m) {
    try {
      A::receive(m);
    } catch (...) {
      troupe_process_state_->note_exception(std::current_exception());
      throw;
    }
  }

 private:
  std::shared_ptr<ProcessState<R>> troupe_process_state_;
};

template <class A>
using ProcessActorOf = std::conditional_t<std::is_final_v<A>, A, ProcessShell<A>>;

template <class A>
class ProcessManagerCore;

// One accepted request. If it is destroyed armed and unanswered (its
// message was dropped by a stopping manager), it answers shutting_down.
template <class A>
class ProcessRequest {
 public:
  using R = typename A::result_type;
  using ProcMsg = typename A::message_type;

  ProcessRequest(ProcessManagerCore<A>* core, ProcessId id, FutureAsk<R>* reply) noexcept
      : core_(core), id_(id), reply_(reply) {}
  ProcessRequest(const ProcessRequest&) = delete;
  ProcessRequest& operator=(const ProcessRequest&) = delete;
  virtual ~ProcessRequest() {
    if (armed_)
      core_->finish(*this, Error(ErrorCode::shutting_down, core_->stopped_message()), Outcome::cancelled);
    if (reply_) reply_->release();
  }

  // Spawns the process under `mgr`; may throw what A's constructor throws.
  virtual ActorRef<ProcMsg> spawn(ProcessManagerActor<A>& mgr, const SpawnOptions& o,
                                  ProcessHandle<R>& h) = 0;

  ProcessId id() const noexcept { return id_; }

  enum class Outcome : std::uint8_t { completed, failed, cancelled };

  // Answers the requester: submit() through its future, enqueue() through
  // settings.on_outcome.
  void answer(Result<R>&& r, const std::function<void(ProcessId, const Result<R>&)>& on_outcome) noexcept {
    armed_ = false;
    if (auto* f = std::exchange(reply_, nullptr)) {
      f->complete(std::move(r));
      f->release();
    } else if (on_outcome) {
      try {
        on_outcome(id_, r);
      } catch (...) {
        // the callback has nobody to report to: its exception is dropped
      }
    }
  }
  // Armed once its message is built: from then on, dropping the request
  // answers it. Disarmed again if the message could not be sent (the
  // caller then reports that itself).
  void arm() noexcept { armed_ = true; }
  void disarm() noexcept { armed_ = false; }

 private:
  ProcessManagerCore<A>* core_;
  ProcessId id_;
  FutureAsk<R>* reply_;  // one reference, or null for enqueue()
  bool armed_ = false;
};

template <class A, class... Args>
class ProcessRequestWith final : public ProcessRequest<A> {
 public:
  using R = typename A::result_type;
  using ProcMsg = typename A::message_type;

  template <class... X>
  ProcessRequestWith(ProcessManagerCore<A>* core, ProcessId id, FutureAsk<R>* reply, X&&... x)
      : ProcessRequest<A>(core, id, reply), args_(std::forward<X>(x)...) {}

  ActorRef<ProcMsg> spawn(ProcessManagerActor<A>& mgr, const SpawnOptions& o, ProcessHandle<R>& h) override {
    return std::apply(
        [&](Args&... a) { return mgr.template spawn_process<ProcessActorOf<A>>(o, h, std::move(a)...); },
        args_);
  }

 private:
  std::tuple<Args...> args_;
};

// Messages into the manager actor.
template <class A>
struct ProcessSubmit {
  std::unique_ptr<ProcessRequest<A>> request;
};
struct ProcessEnded {
  ProcessId id = 0;
  ExitReason reason = ExitReason::normal;
  std::string detail;
};
struct ProcessTick {};
template <class A>
using ProcessManagerMsg = std::variant<ProcessSubmit<A>, ProcessEnded, ProcessTick>;

// What the handles, the manager actor and its requests share. Lives as long
// as any handle or the manager actor (which keeps it as a constructor
// argument); requests point to it without owning it, which is safe because
// a request dies in the manager actor (at the latest when its cell drains
// its mailbox) or in the caller that built it, which holds the core.
template <class A>
class ProcessManagerCore {
 public:
  using R = typename A::result_type;
  using Settings = ProcessManagerSettings<R>;
  using Outcome = typename ProcessRequest<A>::Outcome;

  explicit ProcessManagerCore(Settings s)
      : settings(std::move(s)),
        capacity(settings.max_running + settings.buffer),
        start_interval(settings.starts_per_second > 0 ? process_start_interval(settings.starts_per_second)
                                                      : Duration::zero()),
        overflow_message(process_overflow_message(settings.name, settings.max_running, settings.buffer)),
        process_prefix(
            (settings.process_options.name.empty() ? settings.name : settings.process_options.name) + "/") {}

  // P1: takes one of the max_running + buffer admissions, or refuses.
  // A compare-and-swap loop rather than add-then-undo, so the count itself
  // never passes the bound, not even for an instant.
  bool admit() noexcept {
    auto cur = counters.outstanding.load(std::memory_order_relaxed);
    do {
      if (cur >= capacity) return false;
    } while (!counters.outstanding.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed));
    return true;
  }
  void unadmit() noexcept { counters.outstanding.fetch_sub(1, std::memory_order_relaxed); }

  // Frees the request's admission, counts its outcome and answers it. The
  // admission is freed first: whoever is answered may submit again at once.
  void finish(ProcessRequest<A>& req, Result<R>&& r, Outcome o) noexcept {
    unadmit();
    auto& c = o == Outcome::completed ? counters.completed
              : o == Outcome::failed  ? counters.failed
                                      : counters.cancelled;
    c.fetch_add(1, std::memory_order_relaxed);
    req.answer(std::move(r), settings.on_outcome);
  }

  std::string stopped_message() const {
    return "process manager '" + settings.name + "' stopped before the process finished";
  }
  std::string closed_message() const {
    return "process manager '" + settings.name + "' no longer takes requests (stopped or shutting down)";
  }

  const Settings settings;
  const std::size_t capacity;
  const Duration start_interval;  // zero: no throttle
  const std::string overflow_message;
  const std::string process_prefix;
  ProcessCounters counters;
  std::atomic<bool> closed{false};
};

inline void raise_peak(std::atomic<std::uint64_t>& peak, std::uint64_t v) noexcept {
  auto p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

// The manager: a FIFO of waiting requests, a table of running processes
// (its children, each watched), and the start throttle.
template <class A>
class ProcessManagerActor final : public Actor<ProcessManagerMsg<A>> {
 public:
  using R = typename A::result_type;
  using Msg = ProcessManagerMsg<A>;
  using ProcMsg = typename A::message_type;
  using Request = ProcessRequest<A>;
  using Outcome = typename Request::Outcome;

  explicit ProcessManagerActor(std::shared_ptr<ProcessManagerCore<A>> core)
      : core_(std::move(core)),
        max_running_(core_->settings.max_running),
        slack_(burst_slack(core_->start_interval, core_->settings.burst)) {}

  void on_start() { next_start_ = this->now(); }

  void receive(Msg& m) {
    match(
        m, [&](ProcessSubmit<A>& s) { on_submit(std::move(s.request)); },
        [&](ProcessEnded& e) { on_ended(e); }, [&](ProcessTick&) { pump(); });
  }

  // P2: whatever is still here is answered; the runtime stops the process
  // actors (our children) right after.
  void on_stop() {
    core_->closed.store(true, std::memory_order_release);
    auto& c = core_->counters;
    while (!queue_.empty()) {
      auto req = std::move(queue_.front());
      queue_.pop_front();
      core_->finish(*req,
                    Error(ErrorCode::shutting_down, "process manager '" + core_->settings.name +
                                                        "' stopped before the process started"),
                    Outcome::cancelled);
    }
    c.buffered.store(0, std::memory_order_relaxed);
    for (auto& [id, run] : running_) {
      // A process that finished just before (its end not seen yet) still
      // gets its own outcome through.
      if (auto r = run.state->close()) {
        Outcome o = r->ok() ? Outcome::completed : Outcome::failed;
        core_->finish(*run.request, std::move(*r), o);
      } else {
        core_->finish(*run.request, Error(ErrorCode::shutting_down, core_->stopped_message()),
                      Outcome::cancelled);
      }
    }
    running_.clear();
    c.running.store(0, std::memory_order_relaxed);
  }

  // For ProcessRequestWith: spawns a child process actor.
  template <class S, class... X>
  ActorRef<ProcMsg> spawn_process(const SpawnOptions& o, X&&... x) {
    return this->template spawn<S>(o, std::forward<X>(x)...);
  }

 private:
  struct Running {
    std::unique_ptr<Request> request;
    std::shared_ptr<ProcessState<R>> state;
  };

  static Duration burst_slack(Duration interval, std::size_t burst) noexcept {
    if (interval <= Duration::zero() || burst <= 1) return Duration::zero();
    // Saturate: a burst this large means "no limit on bursts" anyway.
    constexpr auto kMax = std::chrono::duration_cast<Duration>(std::chrono::hours(24 * 365 * 100)).count();
    auto n = static_cast<std::uint64_t>(burst - 1);
    auto per = static_cast<std::uint64_t>(interval.count());
    if (n > static_cast<std::uint64_t>(kMax) / per) return Duration(kMax);
    return Duration(static_cast<Duration::rep>(n * per));
  }

  void on_submit(std::unique_ptr<Request> req) {
    if (core_->closed.load(std::memory_order_acquire)) {
      core_->finish(*req, Error(ErrorCode::shutting_down, core_->stopped_message()), Outcome::cancelled);
      return;
    }
    if (queue_.empty() && running_.size() < max_running_ && take_token()) {
      start(std::move(req));
      return;
    }
    queue_.push_back(std::move(req));
    auto& c = core_->counters;
    c.buffered.store(queue_.size(), std::memory_order_relaxed);
    raise_peak(c.peak_buffered, queue_.size());
    pump();
  }

  void on_ended(ProcessEnded& e) {
    auto it = running_.find(e.id);
    if (it == running_.end()) return;
    Running run = std::move(it->second);
    running_.erase(it);
    core_->counters.running.store(running_.size(), std::memory_order_relaxed);
    std::string name = process_name(e.id);
    Result<R> r = run.state->outcome(name, e.reason, e.detail);
    Outcome o = r.ok()                                         ? Outcome::completed
                : r.error().code() == ErrorCode::shutting_down ? Outcome::cancelled
                                                               : Outcome::failed;
    core_->finish(*run.request, std::move(r), o);
    pump();
  }

  // Starts waiting requests while there are free slots and start tokens;
  // if only a token is missing, wakes up when the next one is due.
  void pump() {
    auto& c = core_->counters;
    while (!queue_.empty() && running_.size() < max_running_) {
      if (!take_token()) {
        if (!this->timer_active("throttle"))
          this->start_timer("throttle", next_start_ - slack_ - this->now(), Msg{ProcessTick{}});
        break;
      }
      auto req = std::move(queue_.front());
      queue_.pop_front();
      c.buffered.store(queue_.size(), std::memory_order_relaxed);
      start(std::move(req));
    }
  }

  // P3: a token bucket kept as its "theoretical arrival time" (GCRA):
  // integer nanoseconds, so the manual clock decides starts exactly.
  bool take_token() {
    if (core_->start_interval <= Duration::zero()) return true;
    TimePoint t = this->now();
    if (t < next_start_ - slack_) return false;
    next_start_ = std::max(next_start_, t) + core_->start_interval;
    return true;
  }

  std::string process_name(ProcessId id) const { return core_->process_prefix + std::to_string(id); }

  void start(std::unique_ptr<Request> req) {
    const ProcessId id = req->id();
    auto state = std::make_shared<ProcessState<R>>(id);
    ProcessHandle<R> handle(state);
    SpawnOptions o = core_->settings.process_options;
    o.name = process_name(id);
    ActorRef<ProcMsg> ref;
    try {
      ref = req->spawn(*this, o, handle);
    } catch (...) {
      core_->finish(
          *req,
          Error::from_exception(std::current_exception(), "process '" + o.name + "' could not be built"),
          Outcome::failed);
      return;
    }
    if (!ref) {
      core_->finish(*req,
                    Error(ErrorCode::shutting_down,
                          "process '" + o.name + "' refused: the actor system is shutting down"),
                    Outcome::cancelled);
      return;
    }
    running_.emplace(id, Running{std::move(req), state});
    auto& c = core_->counters;
    c.running.store(running_.size(), std::memory_order_relaxed);
    raise_peak(c.peak_running, running_.size());
    this->watch(ref, [id](const Down& d) { return Msg{ProcessEnded{id, d.reason, d.detail}}; });
    state->attach(ref.cell());
  }

  std::shared_ptr<ProcessManagerCore<A>> core_;
  std::size_t max_running_;
  Duration slack_;          // (burst - 1) start intervals
  TimePoint next_start_{};  // GCRA: starts are allowed from next_start_ - slack_
  std::deque<std::unique_ptr<Request>> queue_;
  std::unordered_map<ProcessId, Running> running_;
};

template <class T>
Future<T> ready_future(Result<T> r) {
  auto* st = new FutureAsk<T>();
  Future<T> f(st);
  st->complete(std::move(r));
  return f;
}

}  // namespace detail

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
