#pragma once
// Typed actors.
//
// An actor is a class deriving from `Actor<Msg>` with a `void receive(Msg&)`
// member; `Msg` is any movable type, usually a std::variant protocol. The
// runtime guarantees that one actor handles one message at a time, so an
// actor's members need no locks. Everything else reaches it only through an
// `ActorRef<Msg>`.
//
//   struct Counter : troupe::Actor<CounterMsg> {
//     int n = 0;
//     void receive(CounterMsg& m) { ... }
//   };
//   auto ref = system.spawn<Counter>(troupe::SpawnOptions{.name = "counter"});
//   ref.tell(Inc{});
//
// Inside a handler an actor may change its behaviour (`become`), start keyed
// timers, stash, watch other actors, ask with a continuation, spawn children
// and stop itself. Those members may be called only from the actor's own
// handlers and hooks (they touch state owned by the running activation).

#include <algorithm>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "troupe/core/clock.hpp"
#include "troupe/core/detail/cell.hpp"
#include "troupe/core/detail/timer_service.hpp"
#include "troupe/core/result.hpp"

namespace troupe {

template <class Msg>
class ActorRef;
template <class Msg>
class Actor;
class ActorSystem;

// ---------------------------------------------------------------------------
// Spawn options and supervision

// Restart with exponential back-off: the k-th restart within the window
// waits min(max_backoff, min_backoff * factor^(k-1)). More than
// `max_restarts` failures within `within` stop the actor instead.
struct RestartPolicy {
  Duration min_backoff = Duration::zero();
  Duration max_backoff = std::chrono::seconds(10);
  double factor = 2.0;
  std::uint32_t max_restarts = 10;
  Duration within = std::chrono::seconds(60);
};

// What happens to an actor whose handler throws. The message that failed is
// dropped in every case; nothing else in its mailbox is lost.
class Supervision {
 public:
  enum class Directive : std::uint8_t { stop, resume, restart };
  using Restart = RestartPolicy;

  static Supervision stop() { return Supervision(Directive::stop, {}); }
  static Supervision resume() { return Supervision(Directive::resume, {}); }
  static Supervision restart(Restart policy = {}) {
    return Supervision(Directive::restart, policy);
  }

  Directive directive() const noexcept { return directive_; }
  const Restart& policy() const noexcept { return policy_; }

 private:
  Supervision(Directive d, Restart p) : directive_(d), policy_(p) {}
  Directive directive_;
  Restart policy_;
};

// How to spawn an actor. Defaults: unnamed, unbounded mailbox, stash bound
// 1000, stop on failure (a failing actor does not spin).
struct SpawnOptions {
  std::string name{};
  std::uint32_t mailbox_capacity = 0;  // 0 = unbounded
  std::size_t stash_capacity = 1000;
  Supervision supervision = Supervision::stop();
};

// ---------------------------------------------------------------------------
// Untyped identity and termination notices

// A reference to an actor of any message type: identity, name and liveness,
// but no tell. Value type; thread-safe like ActorRef.
class AnyRef {
 public:
  AnyRef() = default;
  explicit AnyRef(detail::CellRef c) : cell_(std::move(c)) {}
  template <class M>
  AnyRef(const ActorRef<M>& r);  // NOLINT: identity conversion
  const std::string& name() const;
  bool terminated() const noexcept { return !cell_ || cell_->closed(); }
  explicit operator bool() const noexcept { return static_cast<bool>(cell_); }
  friend bool operator==(const AnyRef& a, const AnyRef& b) noexcept {
    return a.cell_.get() == b.cell_.get();
  }
  detail::CellBase* cell() const noexcept { return cell_.get(); }

 private:
  detail::CellRef cell_;
};

// Sent to a watcher when a watched actor terminates.
struct Down {
  AnyRef actor;
  ExitReason reason = ExitReason::normal;
  std::string detail;  // the failure's what() for ExitReason::failure
};

// ---------------------------------------------------------------------------
// Ask: reply targets and futures

namespace detail {

void system_hold(SystemImpl& s) noexcept;
void system_release(SystemImpl& s) noexcept;
TimerService& timers_of(SystemImpl& s) noexcept;

template <class R>
class AskBase : public TimerService::Node {
 public:
  // First completion wins; later ones (late reply, timeout after reply,
  // dropped reply target) are ignored.
  void complete(Result<R>&& r) noexcept {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    result_.emplace(std::move(r));
    if (sys_) timers_of(*sys_).cancel(this);
    deliver();
  }
  // Arms the timeout. The ask keeps the system's state alive until it is
  // freed, so a reply from a thread outside the system, even after the
  // system is gone, finds a valid timer queue.
  // False if refused (the system is shutting down): the ask is then
  // complete with shutting_down and the request must not be sent.
  bool arm(SystemImpl& s, TimePoint deadline) {
    sys_ = &s;
    system_hold(s);
    if (timers_of(s).schedule(this, deadline)) return true;
    complete(Error(ErrorCode::shutting_down, "the actor system is shutting down"));
    return false;
  }
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

 protected:
  ~AskBase() override {
    if (sys_) system_release(*sys_);
  }
  virtual void deliver() noexcept = 0;
  void fire() noexcept override {
    complete(Error(ErrorCode::timeout, "no reply within the ask timeout"));
  }
  std::optional<Result<R>> result_;

 private:
  std::atomic<bool> done_{false};
  SystemImpl* sys_ = nullptr;
};

}  // namespace detail

// The right to answer one request with an R. Move-only; put it in the
// request message. Dropping it without replying answers the asker at once
// with ErrorCode::no_reply, so a forgotten reply is never a silent timeout.
// Thread-safe to use from any thread, once.
template <class R>
class ReplyTo {
 public:
  ReplyTo() = default;
  explicit ReplyTo(detail::AskBase<R>* st) noexcept : st_(st) { st_->retain(); }
  ReplyTo(ReplyTo&& o) noexcept : st_(std::exchange(o.st_, nullptr)) {}
  ReplyTo& operator=(ReplyTo&& o) noexcept {
    if (this != &o) {
      if (st_) reset(Error(ErrorCode::no_reply, "reply target replaced without a reply"));
      st_ = std::exchange(o.st_, nullptr);
    }
    return *this;
  }
  ReplyTo(const ReplyTo&) = delete;
  ReplyTo& operator=(const ReplyTo&) = delete;
  ~ReplyTo() {
    if (st_) reset(Error(ErrorCode::no_reply, "request dropped without a reply"));
  }

  // Answers with a value. Later replies are no-ops.
  template <class V = R>
    requires(!std::is_void_v<V>)
  void reply(std::type_identity_t<V> value) {
    reset(Result<R>(std::move(value)));
  }
  template <class V = R>
    requires(!std::is_void_v<V>)
  void operator()(std::type_identity_t<V> value) {
    reply(std::move(value));
  }
  // For ReplyTo<void>: answers "done".
  void reply()
    requires std::is_void_v<R>
  {
    reset(Result<void>());
  }
  // Answers with an error value.
  void fail(Error e) { reset(Result<R>(std::move(e))); }
  // False once answered (or for a default-constructed target).
  bool pending() const noexcept { return st_ && !st_->done(); }

 private:
  void reset(Result<R>&& r) noexcept {
    if (auto* s = std::exchange(st_, nullptr)) {
      // (callers check st_ first so that the common path builds no Error)
      s->complete(std::move(r));
      s->release();
    }
  }
  detail::AskBase<R>* st_ = nullptr;
};

namespace detail {

// A move-only callable for continuations (they may own move-only things such
// as a Promise or a ReplyTo, which std::function cannot hold).
template <class Sig>
class UniqueFunction;
template <class Ret, class... A>
class UniqueFunction<Ret(A...)> {
 public:
  UniqueFunction() = default;
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, UniqueFunction> && std::is_invocable_r_v<Ret, F&, A...>)
  UniqueFunction(F&& f) : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(f))) {}  // NOLINT
  explicit operator bool() const noexcept { return static_cast<bool>(impl_); }
  Ret operator()(A... a) { return impl_->call(std::forward<A>(a)...); }

 private:
  struct Base : Pooled {
    virtual ~Base() = default;
    virtual Ret call(A... a) = 0;
  };
  template <class F>
  struct Impl final : Base {
    template <class G>
    explicit Impl(G&& g) : fn(std::forward<G>(g)) {}
    Ret call(A... a) override { return fn(std::forward<A>(a)...); }
    F fn;
  };
  std::unique_ptr<Base> impl_;
};

// Where a thread that must not run continuations sends them. A transport's
// io thread completes the futures of remote asks, but it serves every
// connection: a continuation that blocked or ran long there would stall
// them all. While a ContinuationsElsewhere is alive on a thread, a future
// completed on that thread hands its continuation to the executor instead
// of running it (a blocked get() is only woken: no user code runs).
class ContinuationExecutor {
 public:
  // Runs `task` once, on a thread of the executor's choosing; never on the
  // calling thread unless the executor has no other left (shutdown). Must
  // not throw.
  virtual void execute(UniqueFunction<void()> task) noexcept = 0;
  virtual ~ContinuationExecutor() = default;
};

inline thread_local ContinuationExecutor* t_continuation_executor = nullptr;

// For its lifetime, continuations completed on this thread go to `ex`.
// Nests; thread-local, so it must end on the thread it began on.
class ContinuationsElsewhere {
 public:
  explicit ContinuationsElsewhere(ContinuationExecutor* ex) noexcept
      : previous_(std::exchange(t_continuation_executor, ex)) {}
  ~ContinuationsElsewhere() { t_continuation_executor = previous_; }
  ContinuationsElsewhere(const ContinuationsElsewhere&) = delete;
  ContinuationsElsewhere& operator=(const ContinuationsElsewhere&) = delete;

 private:
  ContinuationExecutor* previous_;
};

template <class R>
class FutureAsk final : public AskBase<R>, public Pooled {
 public:
  Result<R> wait() {
    if (!(state_.load(std::memory_order_acquire) & kReady)) {
      std::unique_lock lk(mu_);
      state_.fetch_or(kWaiter, std::memory_order_acq_rel);
      cv_.wait(lk, [&] { return (state_.load(std::memory_order_acquire) & kReady) != 0; });
    }
    return std::move(*this->result_);
  }
  bool wait_for(Duration d) {
    if (state_.load(std::memory_order_acquire) & kReady) return true;
    std::unique_lock lk(mu_);
    state_.fetch_or(kWaiter, std::memory_order_acq_rel);
    return cv_.wait_for(lk, d, [&] { return (state_.load(std::memory_order_acquire) & kReady) != 0; });
  }
  bool ready() const noexcept { return (state_.load(std::memory_order_acquire) & kReady) != 0; }
  // Runs k with the result exactly once: here and now if it is already
  // there, else on the thread that completes it (or where that thread's
  // ContinuationExecutor says). Whichever of the two comes second (seen
  // through one atomic word) runs it; no lock is taken.
  void on_complete(UniqueFunction<void(Result<R>)> k) {
    k_ = std::move(k);
    if (state_.fetch_or(kHasContinuation, std::memory_order_acq_rel) & kReady) run();
  }

 private:
  static constexpr std::uint8_t kReady = 1, kHasContinuation = 2, kWaiter = 4;

  void deliver() noexcept override {
    std::uint8_t before = state_.fetch_or(kReady, std::memory_order_acq_rel);
    if (before & kWaiter) {
      // A blocked get() checks kReady under the mutex: taking it here means
      // it either saw kReady or is asleep and gets this notification.
      { std::lock_guard lk(mu_); }
      cv_.notify_all();
    }
    if (before & kHasContinuation) {
      if (ContinuationExecutor* ex = t_continuation_executor) {
        this->retain();
        ex->execute([this] {
          run();
          this->release();
        });
      } else {
        run();
      }
    }
  }
  void run() noexcept {
    try {
      k_(std::move(*this->result_));
    } catch (...) {
      // A continuation has nobody to report to; its exception is dropped
      // rather than taking down the thread that completed the future.
    }
  }
  std::atomic<std::uint8_t> state_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  UniqueFunction<void(Result<R>)> k_;
};

}  // namespace detail

// The outcome of an asynchronous operation: an ask made from outside any
// actor, a keyed-lock block, a process, a job. Move-only, single consumer:
// either block for it with get() (never inside a handler: use Actor::ask or
// then() there), or hand it a continuation with then(). Completed from any
// thread.
template <class R>
class Future {
 public:
  using value_type = R;
  explicit Future(detail::FutureAsk<R>* st) : st_(st) {}
  Future(Future&& o) noexcept : st_(std::exchange(o.st_, nullptr)) {}
  Future& operator=(Future&& o) noexcept {
    std::swap(st_, o.st_);
    return *this;
  }
  ~Future() {
    if (st_) st_->release();
  }
  // Blocks until the reply, the timeout or an error; call once.
  Result<R> get() { return st_->wait(); }
  bool wait_for(Duration d) { return st_->wait_for(d); }
  bool ready() { return st_->ready(); }
  // Runs k(Result<R>) once with the outcome: at once on this thread if it is
  // already there, else on the thread that completes it, except a
  // transport's io thread: a remote ask's answer arrives there, and k then
  // runs on a worker of the actor system instead (ContinuationsElsewhere).
  // Keep k short and non-blocking (it may run on a runtime thread); to
  // continue inside an actor, have k tell that actor a message. An
  // exception thrown by k is dropped. Consumes the future.
  template <class K>
    requires std::is_invocable_v<K&, Result<R>>
  void then(K&& k) && {
    auto* st = std::exchange(st_, nullptr);
    st->on_complete(detail::UniqueFunction<void(Result<R>)>(std::forward<K>(k)));
    st->release();
  }

 private:
  detail::FutureAsk<R>* st_;
};

// The producing side of a Future: complete it once with a value, an error or
// an exception. Dropping a promise that was never completed completes its
// future with no_reply, so a forgotten completion is never a silent hang.
// Move-only; completion is thread-safe and the first one wins.
template <class R>
class Promise {
 public:
  Promise() : st_(new detail::FutureAsk<R>()) {}
  Promise(Promise&& o) noexcept : st_(std::exchange(o.st_, nullptr)) {}
  Promise& operator=(Promise&& o) noexcept {
    if (this != &o) {
      drop();
      st_ = std::exchange(o.st_, nullptr);
    }
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { drop(); }

  // The future of this promise; call at most once.
  Future<R> future() {
    st_->retain();
    return Future<R>(st_);
  }
  template <class V = R>
    requires(!std::is_void_v<V>)
  void set_value(std::type_identity_t<V> value) {
    st_->complete(Result<R>(std::move(value)));
  }
  // For Promise<void>: completes with "done".
  void set_value()
    requires std::is_void_v<R>
  {
    st_->complete(Result<void>());
  }
  void set_error(Error e) { st_->complete(Result<R>(std::move(e))); }
  void set_result(Result<R> r) { st_->complete(std::move(r)); }
  // Completes with Error::from_exception(e, context), from which the
  // consumer can rethrow the original exception.
  void set_exception(std::exception_ptr e, std::string_view context = "the operation threw") {
    st_->complete(Result<R>(Error::from_exception(std::move(e), context)));
  }
  // False once completed (by anyone) or after a move.
  bool pending() const noexcept { return st_ && !st_->done(); }
  // Turns the promise into a ReplyTo, for code that answers through a
  // request message's reply target (a command decoded from the network, for
  // instance). Take future() first; the promise is empty afterwards.
  ReplyTo<R> into_reply_to() && {
    ReplyTo<R> r(st_);
    std::exchange(st_, nullptr)->release();
    return r;
  }

 private:
  void drop() noexcept {
    if (auto* s = std::exchange(st_, nullptr)) {
      if (!s->done()) s->complete(Error(ErrorCode::no_reply, "promise dropped without a result"));
      s->release();
    }
  }
  detail::FutureAsk<R>* st_;
};

// ---------------------------------------------------------------------------
// Runtime plumbing for typed cells

namespace detail {

// The message handled right now on this thread, for stash().
struct CurrentMessage {
  Envelope* env = nullptr;  // its own envelope, if it arrived as a user message
  void* msg = nullptr;
  bool kept = false;  // stashed: the envelope now belongs to the stash
};
inline thread_local CurrentMessage t_current{};
inline thread_local CellBase* t_constructing = nullptr;

template <class Msg>
struct MsgEnvelope final : Envelope {
  template <class... A>
  explicit MsgEnvelope(A&&... a) : msg(std::forward<A>(a)...) {}
  Msg msg;
};

// A cell that handles messages of type Msg.
template <class Msg>
class TypedCell : public CellBase {
 public:
  using CellBase::CellBase;

  // Delivers a message that does not sit in its own MsgEnvelope (timer fires,
  // Down notices). Runs in the activation.
  void deliver_loose(Msg& m) {
    CurrentMessage saved = t_current;
    t_current = {nullptr, &m, false};
    struct Restore {
      TypedCell* cell;
      CurrentMessage s;
      int unwinding = std::uncaught_exceptions();
      ~Restore() {
        // A handler that stashed its message and then threw: the failing
        // message is dropped, as any failing message is.
        if (t_current.kept && std::uncaught_exceptions() > unwinding && cell->unstash_last(t_current.env)) {
          delete static_cast<MsgEnvelope<Msg>*>(t_current.env);
        }
        t_current = s;
      }
    } restore{this, saved};
    note_activity();
    dispatch(m);
  }

  // Stashes the message being handled.
  Result<void> stash_current() {
    auto& cur = t_current;
    if (!cur.msg) return Error(ErrorCode::invalid_argument, "stash() outside a message handler");
    if (cur.kept) return Result<void>{};
    Envelope* e = cur.env;
    bool fresh = false;
    if (!e) {
      e = new MsgEnvelope<Msg>(std::move(*static_cast<Msg*>(cur.msg)));
      fresh = true;
    }
    auto r = stash_envelope(e);
    if (r.ok()) {
      if (fresh) cur.msg = &static_cast<MsgEnvelope<Msg>*>(e)->msg;
      cur.env = e;
      cur.kept = true;
    } else if (fresh) {
      // give the message back untouched: the handler still owns it
      *static_cast<Msg*>(cur.msg) = std::move(static_cast<MsgEnvelope<Msg>*>(e)->msg);
      delete static_cast<MsgEnvelope<Msg>*>(e);
    }
    return r;
  }

 protected:
  virtual void dispatch(Msg& m) = 0;

  void invoke_user(Envelope* e) final {
    auto* me = static_cast<MsgEnvelope<Msg>*>(e);
    CurrentMessage saved = t_current;
    t_current = {e, &me->msg, false};
    struct Guard {
      TypedCell* cell;
      MsgEnvelope<Msg>* me;
      CurrentMessage saved;
      int unwinding = std::uncaught_exceptions();
      ~Guard() {
        bool failed = std::uncaught_exceptions() > unwinding;
        if (!t_current.kept || (failed && cell->unstash_last(me))) delete me;
        t_current = saved;
      }
    } guard{this, me, saved};
    note_activity();
    dispatch(me->msg);
  }
  void destroy_user(Envelope* e) noexcept final { delete static_cast<MsgEnvelope<Msg>*>(e); }
  const char* message_type_name() const noexcept final { return typeid(Msg).name(); }
};

// One heap block per actor: header + the user's object + its constructor
// arguments (kept so that a restart can build a fresh object).
template <class A, class... Args>
class CellImpl final : public TypedCell<typename A::message_type> {
  using Msg = typename A::message_type;

 public:
  template <class... CArgs>
  CellImpl(SystemImpl* sys, CellBase* parent, std::uint16_t opts, CArgs&&... args)
      : TypedCell<Msg>(sys, parent, opts), args_(std::forward<CArgs>(args)...) {}

  // Builds the user object; exceptions propagate to the spawner.
  void construct() {
    CellBase* saved = t_constructing;
    t_constructing = this;
    struct Restore {
      CellBase* s;
      ~Restore() { t_constructing = s; }
    } restore{saved};
    std::apply([this](auto&... a) { ::new (static_cast<void*>(storage_)) A(a...); }, args_);
    this->set_object_live(true);
  }

  A& obj() noexcept { return *std::launder(reinterpret_cast<A*>(storage_)); }

 protected:
  ~CellImpl() override { destroy_obj(); }

  void dispatch(Msg& m) override {
    if (void* b = this->behavior()) [[unlikely]] {
      (*static_cast<std::function<void(Msg&)>*>(b))(m);
    } else {
      obj().receive(m);
    }
  }
  void on_start_hook() override {
    if (this->object_live()) obj().on_start();
  }
  void on_stop_hook() noexcept override {
    if (!this->object_live()) return;
    try {
      obj().on_stop();
    } catch (...) {
      // on_stop failures are logged by the caller's contract: nothing to undo
    }
    destroy_obj();
  }
  bool recreate() noexcept override {
    destroy_obj();
    if constexpr ((std::is_copy_constructible_v<Args> && ...)) {
      try {
        construct();
        return true;
      } catch (...) {
        return false;
      }
    } else {
      return false;
    }
  }
  const char* type_name() const noexcept override { return typeid(A).name(); }

 private:
  void destroy_obj() noexcept {
    if (this->object_live()) {
      this->set_object_live(false);
      obj().~A();
    }
  }
  [[no_unique_address]] std::tuple<Args...> args_;
  alignas(A) unsigned char storage_[sizeof(A)];
};

// Runtime services the typed front end needs (src/core/system.cpp).
Clock& clock_of(SystemImpl& s) noexcept;
// Links a constructed cell into its parent and schedules its start. Returns
// false (and frees nothing) if the system no longer accepts actors.
bool start_cell(SystemImpl& s, CellBase* cell, CellBase* parent);
void count_mailbox_full(SystemImpl& s) noexcept;
void count_stale_timer(SystemImpl& s) noexcept;
void apply_spawn_options(CellBase* cell, const SpawnOptions& o);
SystemImpl& impl_of(ActorSystem& s) noexcept;

// A keyed-timer fire in the mailbox. Delivers only if its generation is still
// the one in the timer table (cancel/restart/replace remove or change it).
template <class Msg>
struct TimerFire final : SysEnvelope<TimerFire<Msg>> {
  TimerFire(std::uint64_t g, Msg&& m) : gen(g), msg(std::move(m)) {}
  void run(CellBase& c) {
    std::unique_ptr<TimerFire> self(this);
    auto& ts = c.extras().timers;
    for (auto it = ts.begin(); it != ts.end(); ++it) {
      if (it->gen != gen) continue;
      if (!it->periodic) {
        it->node->release();
        ts.erase(it);
      }
      static_cast<TypedCell<Msg>&>(c).deliver_loose(msg);
      return;
    }
    count_stale_timer(c.system());
  }
  void drop(CellBase&) { delete this; }
  std::uint64_t gen;
  Msg msg;
};

template <class Msg>
class ActorTimerNode final : public TimerService::Node {
 public:
  ActorTimerNode(CellBase* c, std::uint64_t g, Msg m, bool periodic)
      : cell_(c), gen_(g), msg_(std::move(m)), periodic_(periodic) {}

 private:
  void fire() noexcept override {
    TimerFire<Msg>* f = nullptr;
    try {
      if (periodic_) {
        if constexpr (std::is_copy_constructible_v<Msg>) {
          Msg copy(msg_);
          f = new TimerFire<Msg>(gen_, std::move(copy));
        }
      } else {
        f = new TimerFire<Msg>(gen_, std::move(msg_));
      }
    } catch (...) {
      return;  // out of memory or a throwing copy: this fire is lost, not the process
    }
    if (f && cell_->push_system(f) != Delivery::delivered) delete f;
  }
  CellRef cell_;
  std::uint64_t gen_;
  Msg msg_;
  bool periodic_;
};

// Receive-timeout plumbing: the node fires at last_activity + d; the fire
// re-checks activity in the actor and either delivers or re-arms.
template <class Msg>
class ReceiveTimeoutNode;

template <class Msg>
struct ReceiveTimeoutFire final : SysEnvelope<ReceiveTimeoutFire<Msg>> {
  ReceiveTimeoutFire(std::uint64_t g, TimerService::Node* n) : gen(g), node(n) { node->retain(); }
  ~ReceiveTimeoutFire() { node->release(); }
  void run(CellBase& c);
  void drop(CellBase&) { delete this; }
  std::uint64_t gen;
  TimerService::Node* node;
};

template <class Msg>
class ReceiveTimeoutNode final : public TimerService::Node {
 public:
  ReceiveTimeoutNode(CellBase* c, std::uint64_t g, Msg m) : cell_(c), gen_(g), msg_(std::move(m)) {}
  Msg& msg() noexcept { return msg_; }

 private:
  void fire() noexcept override {
    auto* f = new (std::nothrow) ReceiveTimeoutFire<Msg>(gen_, this);
    if (f && cell_->push_system(f) != Delivery::delivered) delete f;
  }
  CellRef cell_;
  std::uint64_t gen_;
  Msg msg_;
};

template <class Msg>
void ReceiveTimeoutFire<Msg>::run(CellBase& c) {
  std::unique_ptr<ReceiveTimeoutFire> self(this);
  auto& x = c.extras();
  if (x.rt_gen != gen || x.rt_node != node) {
    count_stale_timer(c.system());
    return;
  }
  auto& svc = timers_of(c.system());
  TimePoint now = c.now();
  if (now - x.last_activity >= x.rt_duration) {
    svc.schedule(node, deadline_after(now, x.rt_duration));
    Msg copy(static_cast<ReceiveTimeoutNode<Msg>*>(node)->msg());
    static_cast<TypedCell<Msg>&>(c).deliver_loose(copy);
  } else {
    svc.schedule(node, deadline_after(x.last_activity, x.rt_duration));
  }
}

// Continuation of an ask made by an actor: completes in the asker's mailbox.
template <class R>
class ActorAsk final : public AskBase<R>, public SysEnvelope<ActorAsk<R>> {
 public:
  ActorAsk(CellBase* asker, std::function<void(Result<R>)> k) : asker_(asker), k_(std::move(k)) {}
  void run(CellBase&) {
    struct Rel {
      ActorAsk* a;
      ~Rel() { a->release(); }
    } rel{this};
    auto k = std::move(k_);
    k(std::move(*this->result_));
  }
  void drop(CellBase&) { this->release(); }

 private:
  void deliver() noexcept override {
    this->retain();
    if (asker_->push_system(this) != Delivery::delivered) this->release();
  }
  CellRef asker_;
  std::function<void(Result<R>)> k_;
};

template <class Msg, class F>
class DownNotifierImpl;

template <class Msg, class F>
struct DownEnvelope final : SysEnvelope<DownEnvelope<Msg, F>> {
  DownEnvelope(Down d, F f) : down(std::move(d)), fn(std::move(f)) {}
  void run(CellBase& c) {
    std::unique_ptr<DownEnvelope> self(this);
    auto& w = c.extras().watching;
    auto it = std::find(w.begin(), w.end(), down.actor.cell());
    if (it == w.end()) return;  // unwatched meanwhile: no notice after unwatch
    (*it)->release();
    w.erase(it);
    Msg m = fn(down);
    static_cast<TypedCell<Msg>&>(c).deliver_loose(m);
  }
  void drop(CellBase&) { delete this; }
  Down down;
  F fn;
};

template <class Msg, class F>
class DownNotifierImpl final : public DownNotifier {
 public:
  DownNotifierImpl(CellBase* w, F f) : fn_(std::move(f)) {
    watcher = w;
    w->retain();
  }
  ~DownNotifierImpl() override { watcher->release(); }
  void notify(CellBase& dead, ExitReason reason, const std::string& detail) override {
    auto* e = new DownEnvelope<Msg, F>(Down{AnyRef(CellRef(&dead)), reason, detail}, fn_);
    if (watcher->push_system(e) != Delivery::delivered) delete e;
  }

 private:
  F fn_;
};

// Asks the target to add a watcher; if the target is already gone the notice
// is sent at once.
struct WatchEnvelope final : SysEnvelope<WatchEnvelope> {
  explicit WatchEnvelope(std::unique_ptr<DownNotifier> n) : notifier(std::move(n)) {}
  void run(CellBase& c) {
    std::unique_ptr<WatchEnvelope> self(this);
    c.add_watcher(std::move(notifier));
  }
  void drop(CellBase& c);  // target terminated: notify now (src/core/cell.cpp)
  std::unique_ptr<DownNotifier> notifier;
};

struct UnwatchEnvelope final : SysEnvelope<UnwatchEnvelope> {
  explicit UnwatchEnvelope(CellBase* w) : watcher(w) {}
  void run(CellBase& c);
  void drop(CellBase&) { delete this; }
  CellRef watcher;
};

template <class... Args>
struct FirstIsOptions : std::false_type {};
template <class First, class... Rest>
struct FirstIsOptions<First, Rest...> : std::is_same<std::decay_t<First>, SpawnOptions> {};
template <class... Args>
inline constexpr bool first_is_spawn_options = FirstIsOptions<Args...>::value;

template <class A>
concept ActorType = requires(A& a, typename A::message_type& m) {
  { a.receive(m) };
} && std::derived_from<A, Actor<typename A::message_type>>;

template <class A, class... Args>
ActorRef<typename A::message_type> spawn_cell(SystemImpl& sys, CellBase* parent,
                                              const SpawnOptions& opts, Args&&... args);

template <class R, class M, class Make>
void send_ask(SystemImpl& sys, AskBase<R>* st, const ActorRef<M>& target, Make&& make,
              Duration timeout);

}  // namespace detail

// ---------------------------------------------------------------------------
// ActorRef

// A typed handle to an actor. Cheap to copy (one reference count); holding
// one keeps the actor's 80-byte header alive, not the actor itself. All
// members are thread-safe. A default-constructed ref is empty: tell() on it
// is a dead letter.
template <class Msg>
class ActorRef {
 public:
  using message_type = Msg;
  ActorRef() = default;
  explicit ActorRef(detail::CellRef c) : cell_(std::move(c)) {}

  // Enqueues `m` (anything Msg can be built from, e.g. one alternative of a
  // variant protocol). Never blocks, never throws on a full or dead mailbox:
  // the outcome says what happened, and a refused message is counted.
  template <class M>
    requires std::constructible_from<Msg, M&&>
  Delivery tell(M&& m) const {
    if (!cell_) return Delivery::dead_letter;
    auto* e = new detail::MsgEnvelope<Msg>(std::forward<M>(m));
    Delivery d = cell_->push_user(e);
    if (d != Delivery::delivered) [[unlikely]] {
      refused(d, e);
    }
    return d;
  }

  // Asks the actor to stop once it has handled what is already queued
  // (like a poison pill). Harmless on a stopped actor.
  void stop() const {
    if (cell_) cell_->request_stop();
  }

  const std::string& name() const;
  bool terminated() const noexcept { return !cell_ || cell_->closed(); }
  explicit operator bool() const noexcept { return static_cast<bool>(cell_); }
  friend bool operator==(const ActorRef& a, const ActorRef& b) noexcept {
    return a.cell_ == b.cell_;
  }

  const detail::CellRef& cell() const noexcept { return cell_; }

 private:
  void refused(Delivery d, detail::MsgEnvelope<Msg>* e) const {
    if (d == Delivery::mailbox_full) {
      detail::count_mailbox_full(cell_->system());
    } else {
      cell_->count_dead_letter(typeid(Msg).name());
    }
    delete e;
  }
  detail::CellRef cell_;
};

template <class M>
AnyRef::AnyRef(const ActorRef<M>& r) : cell_(r.cell()) {}

inline const std::string& AnyRef::name() const {
  static const std::string empty;
  return cell_ ? cell_->name() : empty;
}

template <class Msg>
const std::string& ActorRef<Msg>::name() const {
  static const std::string empty;
  return cell_ ? cell_->name() : empty;
}

// ---------------------------------------------------------------------------
// Actor

// Base of every actor class. Holds only a pointer to the runtime cell; the
// members below are the actor's view of the runtime and may be called only
// from its own handlers and hooks (on_start, receive, continuations, on_stop).
//
// Hooks, found by name on the derived class (not virtual):
//   void on_start();  // before the first message of each incarnation
//   void on_stop();   // after the last message; timers already cancelled
template <class Msg>
class Actor {
 public:
  using message_type = Msg;
  using behavior_type = std::function<void(Msg&)>;

  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  void on_start() {}
  void on_stop() {}

 protected:
  Actor() noexcept : cell_(static_cast<detail::TypedCell<Msg>*>(detail::t_constructing)) {}
  ~Actor() = default;

  ActorRef<Msg> self() const { return ActorRef<Msg>(detail::CellRef(cell_)); }
  const std::string& name() const { return cell_->name(); }
  TimePoint now() const { return cell_->now(); }
  // now() to within a clock tick (a few ms), cheaper: see Clock::coarse_now.
  TimePoint coarse_now() const { return cell_->coarse_now(); }
  WallTime wall_now() const { return detail::clock_of(cell_->system()).wall_now(); }

  // Stops this actor after the current message. Queued messages become dead
  // letters; watchers get Down{normal}; children are stopped.
  void stop() { cell_->stop_self(); }

  // Handles later messages with `b` instead of receive() (or the previous
  // become). The switch takes effect from the next message.
  void become(behavior_type b) {
    auto* p = new behavior_type(std::move(b));
    cell_->set_behavior(p, [](void* q) { delete static_cast<behavior_type*>(q); });
  }
  // become(&Self::state) for a member function void Self::state(Msg&).
  template <class Self>
  void become(void (Self::*fn)(Msg&)) {
    auto* s = static_cast<Self*>(this);
    become([s, fn](Msg& m) { (s->*fn)(m); });
  }
  // Back to receive().
  void unbecome() { cell_->set_behavior(nullptr, nullptr); }

  // Keyed timers. Starting a key that is running replaces it. A cancelled or
  // replaced timer's fire is never delivered, even if it is already queued.
  // Timers are cancelled when the actor stops or restarts.
  void start_timer(std::string key, Duration delay, Msg msg) {
    arm_timer(std::move(key), delay, std::move(msg), false);
  }
  // Fires every `interval` (first after one interval). Msg must be copyable.
  // A zero or negative interval is refused with invalid_argument.
  Result<void> start_periodic_timer(std::string key, Duration interval, Msg msg) {
    static_assert(std::is_copy_constructible_v<Msg>, "periodic timers copy their message");
    if (interval <= Duration::zero())
      return Error(ErrorCode::invalid_argument, "periodic timer interval must be positive");
    arm_timer(std::move(key), interval, std::move(msg), true);
    return {};
  }
  bool cancel_timer(std::string_view key) {
    auto* x = cell_->extras_if();
    if (!x) return false;
    for (auto it = x->timers.begin(); it != x->timers.end(); ++it) {
      if (it->key == key) {
        detail::timers_of(cell_->system()).cancel(it->node);
        it->node->release();
        x->timers.erase(it);
        return true;
      }
    }
    return false;
  }
  bool timer_active(std::string_view key) const {
    auto* x = cell_->extras_if();
    if (!x) return false;
    for (auto& s : x->timers)
      if (s.key == key) return true;
    return false;
  }

  // Stashes the message being handled; unstash_all() puts every stashed
  // message back at the front of the mailbox, in order. Past the stash bound
  // (SpawnOptions::stash_capacity) stash() fails with stash_overflow and the
  // message stays with the handler.
  Result<void> stash() { return cell_->stash_current(); }
  void unstash_all() { cell_->unstash_all(); }
  std::size_t stash_size() const { return cell_->stash_size(); }

  // After `d` without any message, `msg` is delivered; again every `d` while
  // quiet. Replaces an earlier setting. A zero or negative `d` is refused
  // with invalid_argument (it would flood the actor).
  Result<void> set_receive_timeout(Duration d, Msg msg) {
    static_assert(std::is_copy_constructible_v<Msg>, "receive timeout copies its message");
    if (d <= Duration::zero())
      return Error(ErrorCode::invalid_argument, "receive timeout must be positive");
    if (cell_->terminated_flag()) return Error(ErrorCode::dead_letter, "the actor is stopping");
    cancel_receive_timeout();
    auto& x = cell_->extras();
    cell_->set_receive_timeout_flag(true);
    x.rt_duration = d;
    x.last_activity = now();
    auto* n = new detail::ReceiveTimeoutNode<Msg>(cell_, ++x.rt_gen, std::move(msg));
    x.rt_node = n;
    detail::timers_of(cell_->system()).schedule(n, deadline_after(x.last_activity, d));
    return {};
  }
  void cancel_receive_timeout() {
    auto* x = cell_->extras_if();
    if (!x || !x->rt_node) return;
    detail::timers_of(cell_->system()).cancel(x->rt_node);
    x->rt_node->release();
    x->rt_node = nullptr;
    ++x->rt_gen;
    cell_->set_receive_timeout_flag(false);
  }

  // Watch: when `target` terminates, `to_msg(Down)` is delivered here, once.
  // Watching a terminated actor delivers at once. After unwatch() no notice
  // for that target is delivered.
  template <class M, class F>
    requires std::is_invocable_r_v<Msg, F, const Down&>
  void watch(const ActorRef<M>& target, F to_msg) {
    watch_cell(target.cell().get(), std::move(to_msg));
  }
  template <class M>
    requires std::constructible_from<Msg, Down>
  void watch(const ActorRef<M>& target) {
    watch(target, [](const Down& d) { return Msg(d); });
  }
  template <class M>
  void unwatch(const ActorRef<M>& target) {
    auto* tc = target.cell().get();
    auto* x = cell_->extras_if();
    if (!tc || !x) return;
    auto& w = x->watching;
    auto it = std::find(w.begin(), w.end(), tc);
    if (it == w.end()) return;
    (*it)->release();
    w.erase(it);
    auto* e = new detail::UnwatchEnvelope(cell_);
    if (tc->push_system(e) != Delivery::delivered) delete e;
  }

  // Request/response without blocking: `make(ReplyTo<R>)` builds the request;
  // `k(Result<R>)` runs later in this actor (like a message) with the reply,
  // or timeout / dead_letter / mailbox_full / no_reply. Exactly once.
  template <class R, class M, class Make, class K>
  void ask(const ActorRef<M>& target, Make&& make, Duration timeout, K&& k) {
    auto* st = new detail::ActorAsk<R>(cell_, std::function<void(Result<R>)>(std::forward<K>(k)));
    struct Release {
      detail::ActorAsk<R>* st;
      ~Release() { st->release(); }
    } release{st};
    detail::send_ask<R>(cell_->system(), st, target, std::forward<Make>(make), timeout);
  }

  // Spawns a child: it stops when this actor stops.
  template <class A, class... Args>
  ActorRef<typename A::message_type> spawn(Args&&... args);

 private:
  template <class F>
  void watch_cell(detail::CellBase* tc, F to_msg) {
    if (!tc) return;
    auto& w = cell_->extras().watching;
    if (std::find(w.begin(), w.end(), tc) != w.end()) return;  // already watching
    tc->retain();
    w.push_back(tc);
    auto n = std::make_unique<detail::DownNotifierImpl<Msg, F>>(cell_, std::move(to_msg));
    auto* e = new detail::WatchEnvelope(std::move(n));
    if (tc->push_system(e) != Delivery::delivered) e->drop(*tc);
  }

  void arm_timer(std::string key, Duration delay, Msg msg, bool periodic) {
    if (cell_->terminated_flag()) return;  // armed from on_stop: would outlive the actor
    auto& x = cell_->extras();
    auto& svc = detail::timers_of(cell_->system());
    std::uint64_t gen = ++x.timer_gen;
    auto* n = new detail::ActorTimerNode<Msg>(cell_, gen, std::move(msg), periodic);
    if (periodic) n->set_interval(delay);
    detail::TimerSlot* slot = nullptr;
    for (auto& s : x.timers)
      if (s.key == key) slot = &s;
    if (slot) {
      svc.cancel(slot->node);
      slot->node->release();
    } else {
      x.timers.push_back(detail::TimerSlot{std::move(key), 0, nullptr, false});
      slot = &x.timers.back();
    }
    slot->gen = gen;
    slot->node = n;
    slot->periodic = periodic;
    svc.schedule(n, deadline_after(now(), delay));
  }

  template <class, class...>
  friend class detail::CellImpl;
  detail::TypedCell<Msg>* cell_;
};

namespace detail {

template <class R, class M, class Make>
void send_ask(SystemImpl& sys, AskBase<R>* st, const ActorRef<M>& target, Make&& make,
              Duration timeout) {
  // Even if the timeout fires before the push, the request is still sent:
  // its ReplyTo then simply answers a completed ask.
  if (!st->arm(sys, deadline_after(clock_of(sys).now(), timeout))) return;
  if (!target) {
    st->complete(Error(ErrorCode::dead_letter, "ask to an empty actor reference"));
    return;
  }
  auto* e = new MsgEnvelope<M>(std::forward<Make>(make)(ReplyTo<R>(st)));
  Delivery d = target.cell()->push_user(e);
  if (d == Delivery::delivered) return;
  if (d == Delivery::mailbox_full) {
    count_mailbox_full(sys);
    st->complete(Error(ErrorCode::mailbox_full, "ask refused: '" + target.name() + "' mailbox full"));
  } else {
    target.cell()->count_dead_letter(typeid(M).name());
    st->complete(Error(ErrorCode::dead_letter, "ask to stopped actor '" + target.name() + "'"));
  }
  delete e;
}

template <class A, class... Args>
ActorRef<typename A::message_type> spawn_cell(SystemImpl& sys, CellBase* parent,
                                              const SpawnOptions& opts, Args&&... args) {
  using Cell = CellImpl<A, std::decay_t<Args>...>;
  auto* c = new Cell(&sys, parent, 0, std::forward<Args>(args)...);
  struct Guard {
    Cell* c;
    ~Guard() {
      if (c) {
        c->abandon();  // messages and timers its constructor made go with it
        c->release();
      }
    }
  } guard{c};
  c->construct();                       // user constructor may throw: nothing leaks
  apply_spawn_options(c, opts);  // name, bound, supervision
  guard.c = nullptr;
  ActorRef<typename A::message_type> ref{CellRef(c)};
  // From here the first reference is the parent link's; start_cell abandons
  // the cell and releases it itself if the system no longer takes actors.
  if (!start_cell(sys, c, parent)) return ActorRef<typename A::message_type>{};
  return ref;
}

}  // namespace detail

namespace detail {

// spawn<A>(args...) or spawn<A>(SpawnOptions{...}, args...), under `parent`.
template <class A, class... Args>
ActorRef<typename A::message_type> spawn_under(SystemImpl& sys, CellBase* parent, Args&&... args) {
  static_assert(ActorType<A>, "A must derive from Actor<Msg> and have receive(Msg&)");
  if constexpr (first_is_spawn_options<Args...>) {
    return [&]<class O, class... Rest>(O&& o, Rest&&... rest) {
      return spawn_cell<A>(sys, parent, o, std::forward<Rest>(rest)...);
    }(std::forward<Args>(args)...);
  } else {
    return spawn_cell<A>(sys, parent, SpawnOptions{}, std::forward<Args>(args)...);
  }
}

}  // namespace detail

template <class Msg>
template <class A, class... Args>
ActorRef<typename A::message_type> Actor<Msg>::spawn(Args&&... args) {
  return detail::spawn_under<A>(cell_->system(), cell_, std::forward<Args>(args)...);
}

// Calls the alternative of `v` that matches: troupe::match(msg, [](A&){}, [](B&){}).
template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

template <class V, class... Fs>
decltype(auto) match(V&& v, Fs&&... fs) {
  return std::visit(overloaded{std::forward<Fs>(fs)...}, std::forward<V>(v));
}

}  // namespace troupe
