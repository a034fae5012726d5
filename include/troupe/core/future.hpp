#pragma once
// Futures, promises and reply targets: how an answer travels back.
//
// ReplyTo<R> is the right to answer one request; it travels inside the
// request message. Future<R> is the consumer's side of an asynchronous
// outcome (an ask from outside any actor, a keyed-lock block, a process, a
// job) and Promise<R> its producer's side. All three are move-only and share
// one completion slot (detail/future_state.hpp) whose first completion wins;
// a target or promise dropped without an answer completes with
// ErrorCode::no_reply, so a forgotten answer is never a silent hang.

#include <exception>
#include <string_view>
#include <type_traits>
#include <utility>

#include "troupe/core/clock.hpp"
#include "troupe/core/detail/future_state.hpp"
#include "troupe/core/result.hpp"

namespace troupe {

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

}  // namespace troupe
