#pragma once
// Awaiting inside an actor: the awaitable `co_await ask<R>(...)` returns in
// a coroutine handler, whose reply resumes the handler in the asker's
// mailbox, and running a coroutine handler (receive() returning Task<>,
// Actor::start_task). Included at the end of troupe/core/actor.hpp (include
// that instead); not part of the public API.

#include <coroutine>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "troupe/core/actor.hpp"

namespace troupe {
namespace detail {

// An ask made by a coroutine handler: the completion slot and the mailbox
// message that resumes the handler, in one object (as ActorAsk is for a
// continuation). References: the awaiter's, the reply target's and the
// timer's; the mailbox holds one while it is queued.
template <class R>
class HandlerAsk final : public AskBase<R>, public SysEnvelope<HandlerAsk<R>> {
 public:
  HandlerAsk(HandlerFrame* home, std::coroutine_handle<> h) : home_(home), h_(h), asker_(&home->cell()) {}
  void run(CellBase&) {
    struct Rel {
      HandlerAsk* a;
      ~Rel() { a->release(); }
    } rel{this};
    if (!h_) return;  // the handler was destroyed: the reply is dropped
    HandlerFrame* home = home_;
    h_.resume();
    home->after_resume();
  }
  void drop(CellBase&) { this->release(); }
  void detach() noexcept { h_ = {}; }
  Result<R> take() { return std::move(*this->result_); }

 private:
  void deliver() noexcept override {
    this->retain();
    if (asker_->push_system(this) != Delivery::delivered) this->release();
  }
  HandlerFrame* home_;
  std::coroutine_handle<> h_;
  CellRef asker_;
};

// What Actor::ask(target, make, timeout) returns: awaited by a coroutine
// handler of the asking actor, it sends the request and yields Result<R>.
// Awaited anywhere else it yields invalid_argument and sends nothing (its
// reply would resume a coroutine the actor does not own).
template <class R, class M, class Make>
class [[nodiscard]] AskAwaitable {
 public:
  AskAwaitable(CellBase* asker, const ActorRef<M>& target, Make make, Duration timeout)
      : asker_(asker), target_(target), make_(std::move(make)), timeout_(timeout) {}
  AskAwaitable(AskAwaitable&& o) noexcept
      : asker_(o.asker_), target_(std::move(o.target_)), make_(std::move(o.make_)), timeout_(o.timeout_),
        st_(std::exchange(o.st_, nullptr)), refused_(std::move(o.refused_)) {}
  AskAwaitable& operator=(AskAwaitable&&) = delete;
  ~AskAwaitable() {
    if (st_) {
      st_->detach();
      st_->release();
    }
  }

  bool await_ready() const noexcept { return false; }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> h) {
    HandlerFrame* home = home_of(h);
    if (!home || &home->cell() != asker_) {
      refused_.emplace(Error(ErrorCode::invalid_argument,
                             "co_await ask(): awaited outside a coroutine handler of the asking actor "
                             "(receive() returning Task<>, or start_task())"));
      return false;
    }
    st_ = new HandlerAsk<R>(home, h);
    // The reply resumes the handler through this actor's mailbox, so it
    // cannot run before this returns, whatever send_ask does.
    send_ask<R>(asker_->system(), st_, target_, std::move(make_), timeout_);
    return true;
  }
  Result<R> await_resume() {
    if (st_) return st_->take();
    return std::move(*refused_);
  }

 private:
  CellBase* asker_;
  ActorRef<M> target_;
  Make make_;
  Duration timeout_;
  HandlerAsk<R>* st_ = nullptr;
  std::optional<Result<R>> refused_;
};

}  // namespace detail

template <class Msg>
template <class R, class M, class Make>
auto Actor<Msg>::ask(const ActorRef<M>& target, Make&& make, Duration timeout)
    -> detail::AskAwaitable<R, M, std::decay_t<Make>> {
  return detail::AskAwaitable<R, M, std::decay_t<Make>>(cell_, target, std::forward<Make>(make), timeout);
}

template <class Msg>
void Actor<Msg>::start_task(Task<> task) {
  if (task) detail::start_handler(*cell_, std::move(task), detail::RethrowFailure{});
}

}  // namespace troupe
