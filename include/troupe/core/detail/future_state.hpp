#pragma once
// The shared state behind Future, Promise and ReplyTo (troupe/core/future.hpp):
// a reference-counted completion slot whose first completion wins, armed with
// a timeout on the system's timer queue, and the move-only callable that holds
// a future's continuation. Also ContinuationsElsewhere, which a transport's io
// thread uses to hand continuations to the actor system's workers.
// Not part of the public API: names and layout change without notice.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "troupe/core/clock.hpp"
#include "troupe/core/detail/pool.hpp"
#include "troupe/core/detail/timer_service.hpp"
#include "troupe/core/result.hpp"

namespace troupe::detail {

class SystemImpl;

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

}  // namespace troupe::detail
