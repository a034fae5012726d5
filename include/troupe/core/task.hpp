#pragma once
// Coroutines: troupe::Task<T>, and how to run one.
//
// A Task<T> is a coroutine that produces a T. It is lazy: nothing runs until
// it is awaited (`co_await std::move(task)`, or `co_await f()` on a call),
// started as an actor's handler, or handed to into_future / sync_wait /
// detach. Inside it, `co_await` works on:
//   - another Task<U>: yields the U (an exception thrown in it is rethrown);
//   - a Future<U> (an ask from outside, a keyed lock, a job, a process):
//     yields Result<U>; an error is a value, never an exception;
//   - inside an actor, `co_await ask<R>(target, make, timeout)`: yields
//     Result<R> (see Actor::ask).
//
// Where a coroutine resumes. A task that runs as a handler of an actor
// (receive() returning Task<>, Actor::start_task, an entity's
// Effect::await) resumes in that actor, as a message of its own: never
// concurrently with the actor's other handlers, and never after the actor
// stopped (its frame is destroyed then; what it awaited is dropped). Every
// other task resumes on the thread that completes what it awaits (as
// Future::then does, so never on a transport's io thread).
//
//   troupe::Task<int> twice(troupe::ActorSystem& sys, ActorRef<Get> counter) {
//     auto n = co_await sys.ask<int>(counter, [](ReplyTo<int> r) { return Get{std::move(r)}; }, 1s);
//     co_return n.ok() ? 2 * *n : -1;
//   }
//   troupe::Result<int> r = troupe::sync_wait(twice(sys, counter));  // outside actors only
//
// Task is move-only; destroying one that never started frees its frame and
// runs nothing. Frames come from troupe's small-object pool. Not
// thread-safe: a task is awaited or started once, by one owner.

#include <coroutine>
#include <utility>

#include "troupe/core/detail/coroutine.hpp"
#include "troupe/core/future.hpp"
#include "troupe/core/result.hpp"

namespace troupe {

template <class T>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::TaskPromise<T>;
  using value_type = T;

  Task() noexcept = default;
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (h_) h_.destroy();
  }
  // False for a default-constructed or moved-from task.
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

  // Starts the task and suspends the awaiting coroutine until it is done;
  // yields its value or rethrows its exception. The task inherits where the
  // awaiting coroutine resumes (its actor, if any).
  auto operator co_await() && noexcept { return detail::TaskAwaiter<T>{h_}; }

  // The runtime's side: takes the coroutine out of the task.
  std::coroutine_handle<promise_type> release() noexcept { return std::exchange(h_, {}); }

 private:
  friend promise_type;
  explicit Task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

// Starts `task` now, on this thread (it runs until its first suspension),
// and returns a Future of its outcome: its value, or handler_failed carrying
// the exception it threw (Error::rethrow_if_exception). Outside actors:
// inside an actor use Actor::start_task, so that the task resumes there.
template <class T>
Future<T> into_future(Task<T> task) {
  auto* st = new detail::FutureAsk<T>();
  Future<T> f(st);
  st->retain();  // the task's reference, released when it completes
  auto h = task.release();
  h.promise().detach_into(st);
  h.resume();
  return f;
}

// Runs `task` and blocks the calling thread until it is done. Never call it
// inside an actor's handler (the actor's thread would wait for itself).
template <class T>
Result<T> sync_wait(Task<T> task) {
  return into_future(std::move(task)).get();
}

// Starts `task` and lets it run on its own; its frame is freed when it
// ends, and an exception it throws is dropped (as a continuation's is).
// Outside actors; inside one, use Actor::start_task.
template <class T>
void detach(Task<T> task) {
  (void)into_future(std::move(task));
}

// `co_await std::move(future)` in a Task: yields the future's Result<T>.
// Consumes the future.
template <class T>
detail::FutureAwaiter<T> operator co_await(Future<T>&& f) noexcept {
  return detail::FutureAwaiter<T>(std::move(f));
}

}  // namespace troupe
