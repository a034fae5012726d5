#pragma once
// The machinery behind troupe::Task (troupe/core/task.hpp): the promise, the
// awaiters for a task and for a Future, and handler frames, which tie a
// task to the actor it runs on.
//
// A handler frame is the record of one coroutine handler of an actor: its
// outermost coroutine and the actor's cell. Every coroutine the handler
// awaits (nested tasks) points to it ("home"), so an awaiter knows where to
// resume: a completion, from any thread, stores its outcome in a wake and
// posts the wake to the actor's mailbox; the actor resumes the coroutine
// when the wake's turn comes. The actor keeps its handler frames in a list
// (Extras::handlers) and destroys those still suspended when it stops or
// restarts, before its object goes; a wake that arrives later finds its
// awaiter gone and is dropped.
// Not part of the public API: names and layout change without notice.

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "troupe/core/detail/cell.hpp"
#include "troupe/core/detail/future_state.hpp"
#include "troupe/core/detail/pool.hpp"
#include "troupe/core/detail/trace_box.hpp"
#include "troupe/core/future.hpp"
#include "troupe/core/result.hpp"

namespace troupe {

template <class T = void>
class Task;

namespace detail {

class HandlerFrame;

// --- the promise -------------------------------------------------------------------

class TaskPromiseBase {
 public:
  static void* operator new(std::size_t n) { return pool_alloc(n); }
  static void operator delete(void* p, std::size_t n) noexcept { pool_free(p, n); }

  // At its end a task resumes whoever awaited it; a task run by
  // into_future completes its future and frees itself; a handler's
  // outermost task just stops (its frame finishes it).
  struct FinalAwaiter {
    bool await_ready() const noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto& p = h.promise();
      if (p.continuation_) return p.continuation_;
      if (p.finish_detached_) p.finish_detached_(h.address());  // destroys the frame
      return std::noop_coroutine();
    }
    void await_resume() const noexcept {}
  };

  std::suspend_always initial_suspend() const noexcept { return {}; }
  FinalAwaiter final_suspend() const noexcept { return {}; }
  void unhandled_exception() noexcept { error_ = std::current_exception(); }

  std::coroutine_handle<> continuation_;  // the awaiting coroutine
  HandlerFrame* home_ = nullptr;          // the actor handler this runs in, if any
  void (*finish_detached_)(void* frame) noexcept = nullptr;
  std::exception_ptr error_;
};

// Where a task keeps what it returns: a value, or nothing for Task<void>.
template <class T>
class TaskValue : public TaskPromiseBase {
 public:
  template <class U = T>
    requires std::is_convertible_v<U&&, T>
  void return_value(U&& v) {
    value_.emplace(std::forward<U>(v));
  }
  // The value, or the exception rethrown.
  T take() {
    if (error_) std::rethrow_exception(error_);
    return std::move(*value_);
  }
  Result<T> result() {
    if (error_) return Error::from_exception(error_, "the coroutine threw");
    return Result<T>(std::move(*value_));
  }

 private:
  std::optional<T> value_;
};

template <>
class TaskValue<void> : public TaskPromiseBase {
 public:
  void return_void() noexcept {}
  void take() {
    if (error_) std::rethrow_exception(error_);
  }
  Result<void> result() {
    if (error_) return Error::from_exception(error_, "the coroutine threw");
    return {};
  }
};

template <class T>
class TaskPromise final : public TaskValue<T> {
 public:
  Task<T> get_return_object() noexcept { return Task<T>(std::coroutine_handle<TaskPromise>::from_promise(*this)); }
  // Run by into_future: at its end the task completes `out` and frees itself.
  void detach_into(FutureAsk<T>* out) noexcept {
    out_ = out;
    this->finish_detached_ = &finish_detached;
  }

 private:
  static void finish_detached(void* frame) noexcept {
    auto h = std::coroutine_handle<TaskPromise>::from_address(frame);
    FutureAsk<T>* out = h.promise().out_;
    out->complete(h.promise().result());
    out->release();
    h.destroy();
  }
  FutureAsk<T>* out_ = nullptr;
};

// The actor handler a coroutine belongs to, or null (outside actors, or a
// coroutine type that is not a troupe Task).
template <class P>
HandlerFrame* home_of(std::coroutine_handle<P> h) noexcept {
  if constexpr (std::is_base_of_v<TaskPromiseBase, P>) {
    return h.promise().home_;
  } else {
    (void)h;
    return nullptr;
  }
}

// co_await on a Task: starts it (symmetric transfer), resumes the awaiting
// coroutine at its end.
template <class T>
struct TaskAwaiter {
  std::coroutine_handle<TaskPromise<T>> h;
  bool await_ready() const noexcept { return false; }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> awaiting) noexcept {
    h.promise().continuation_ = awaiting;
    h.promise().home_ = home_of(awaiting);
    return h;
  }
  T await_resume() { return h.promise().take(); }
};

// --- handler frames ----------------------------------------------------------------

// One coroutine handler of an actor (see the top of this file). Created,
// resumed, finished and destroyed only inside the actor's activation.
class HandlerFrame : public Pooled {
 public:
  HandlerFrame(CellBase& cell, std::coroutine_handle<> root) noexcept : root_(root), cell_(&cell) {}
  HandlerFrame(const HandlerFrame&) = delete;
  HandlerFrame& operator=(const HandlerFrame&) = delete;
  virtual ~HandlerFrame() = default;

  CellBase& cell() const noexcept { return *cell_; }
  // After one of its coroutines ran: if the outermost one is done, hands
  // over its outcome and frees the frame (a plain handler's exception is
  // rethrown here, for supervision). True if it finished.
  bool after_resume() {
    if (!root_.done()) return false;
    finish();
    return true;
  }

 protected:
  // Unlinks, destroys the coroutine, deletes this, then hands the outcome on.
  virtual void finish() = 0;
  // Told when the frame is destroyed unfinished.
  virtual void dropped() noexcept = 0;
  void unlink() noexcept;

  std::coroutine_handle<> root_;
  CellBase* cell_;

 private:
  friend void link_handler(HandlerFrame& f);
  friend void cancel_handler(HandlerFrame& f) noexcept;
  friend void drop_handlers(Extras& x) noexcept;
  HandlerFrame* prev_ = nullptr;
  HandlerFrame* next_ = nullptr;
};

// src/core/coroutine.cpp. Adds a frame to its actor's list.
void link_handler(HandlerFrame& f);
// Destroys an unfinished handler: its coroutines' frames (their locals'
// destructors run), then the record. Never while it runs.
void cancel_handler(HandlerFrame& f) noexcept;
// Destroys every unfinished handler of an actor (stop, restart).
void drop_handlers(Extras& x) noexcept;

template <class T, class Done>
class HandlerFrameImpl final : public HandlerFrame {
 public:
  HandlerFrameImpl(CellBase& cell, std::coroutine_handle<TaskPromise<T>> root, Done done)
      : HandlerFrame(cell, root), done_(std::move(done)) {}

 private:
  void finish() override {
    auto h = std::coroutine_handle<TaskPromise<T>>::from_address(root_.address());
    Result<T> r = h.promise().result();
    Done done = std::move(done_);
    unlink();
    h.destroy();
    delete this;
    done(std::move(r));
  }
  void dropped() noexcept override {
    if constexpr (requires(Done& d) { d.dropped(); }) done_.dropped();
  }
  Done done_;
};

// What a plain coroutine handler's end does: an exception it threw fails the
// actor's current message, for supervision, as a handler's exception does.
struct RethrowFailure {
  void operator()(const Result<void>& r) const {
    if (!r.ok()) r.error().rethrow_if_exception();
  }
};

// Runs `task` as a handler of `cell`, whose activation this is, until its
// first suspension. `done(Result<T>)` runs in the actor when it finishes
// (here and now if it did not suspend); `done.dropped()`, if Done has it,
// when the frame is destroyed unfinished. Returns the frame while the
// handler is suspended, null once it finished.
template <class T, class Done>
HandlerFrame* start_handler(CellBase& cell, Task<T> task, Done done) {
  auto h = task.release();
  auto* f = new HandlerFrameImpl<T, Done>(cell, h, std::move(done));
  h.promise().home_ = f;
  link_handler(*f);
  h.resume();
  return f->after_resume() ? nullptr : f;
}

// --- resuming a handler in its actor -----------------------------------------------

// Resumes a coroutine handler in its actor once `complete` (from any thread)
// gave it an outcome. Two references: the awaiter's and the completion's
// (which the mailbox then holds). The awaiter detaches when its frame is
// destroyed, and a wake that runs after that resumes nothing.
template <class T>
class HandlerWake final : public SysEnvelope<HandlerWake<T>> {
 public:
  HandlerWake(HandlerFrame* home, std::coroutine_handle<> h) : home_(home), h_(h), cell_(&home->cell()) {}

  void complete(Result<T>&& r) noexcept {
    result_.emplace(std::move(r));
    if (cell_->push_system(this) != Delivery::delivered) release();  // the actor is gone
  }
  void run(CellBase&) {
    struct Rel {
      HandlerWake* w;
      ~Rel() { w->release(); }
    } rel{this};
    if (!h_) return;
    HandlerFrame* home = home_;
    h_.resume();
    home->after_resume();
  }
  void drop(CellBase&) { release(); }
  void detach() noexcept { h_ = {}; }
  Result<T> take() { return std::move(*result_); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  HandlerFrame* home_;
  std::coroutine_handle<> h_;
  CellRef cell_;
  std::optional<Result<T>> result_;
  std::atomic<std::uint32_t> refs_{2};
};

// The completion's reference to a wake, as a Future continuation; released
// unused if the continuation is destroyed without being called.
template <class T>
class WakeOnComplete {
 public:
  explicit WakeOnComplete(HandlerWake<T>* w) noexcept : w_(w) {}
  WakeOnComplete(WakeOnComplete&& o) noexcept : w_(std::exchange(o.w_, nullptr)) {}
  WakeOnComplete& operator=(WakeOnComplete&&) = delete;
  ~WakeOnComplete() {
    if (w_) w_->release();
  }
  void operator()(Result<T> r) { std::exchange(w_, nullptr)->complete(std::move(r)); }

 private:
  HandlerWake<T>* w_;
};

// co_await on a Future: yields its Result<T>. A ready future does not
// suspend. In an actor's handler the coroutine resumes in the actor (through
// a wake); elsewhere on the thread that completes the future.
template <class T>
class FutureAwaiter {
 public:
  explicit FutureAwaiter(Future<T>&& f) noexcept : f_(std::move(f)) {}
  FutureAwaiter(FutureAwaiter&& o) noexcept
      : f_(std::move(o.f_)), result_(std::move(o.result_)), wake_(std::exchange(o.wake_, nullptr)) {}
  FutureAwaiter& operator=(FutureAwaiter&&) = delete;
  ~FutureAwaiter() {
    if (wake_) {
      wake_->detach();
      wake_->release();
    }
  }

  bool await_ready() { return f_.ready(); }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    if (HandlerFrame* home = home_of(h)) {
      wake_ = new HandlerWake<T>(home, h);
      std::move(f_).then(WakeOnComplete<T>(wake_));
    } else {
      // May run at once, on this thread: nothing here touches `this` after.
      // The coroutine resumes under the trace it suspended in (SPEC X4),
      // held by the continuation until the resumption returns.
      std::move(f_).then([this, h, trace = TraceRef::current()](Result<T> r) {
        result_.emplace(std::move(r));
        BorrowedTraceScope scope(trace);
        h.resume();
      });
    }
  }
  Result<T> await_resume() {
    if (wake_) return wake_->take();
    if (result_) return std::move(*result_);
    return f_.get();  // it was ready: no wait
  }

 private:
  Future<T> f_;
  std::optional<Result<T>> result_;
  HandlerWake<T>* wake_ = nullptr;
};

}  // namespace detail
}  // namespace troupe
