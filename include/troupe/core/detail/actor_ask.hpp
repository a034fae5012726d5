#pragma once
// Asks: an actor's ask, whose continuation completes in the asker's own
// mailbox, and send_ask, which arms an ask's timeout and delivers its request
// (for Actor::ask and ActorSystem::ask alike). Included at the end of
// troupe/core/actor.hpp (include that instead); not part of the public API.

#include <functional>
#include <typeinfo>
#include <utility>

#include "troupe/core/actor.hpp"

namespace troupe {
namespace detail {

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

// Arms the ask's timeout, builds the request around a ReplyTo and delivers
// it; a refused delivery completes the ask with the reason at once.
template <class R, class M, class Make>
void send_ask(SystemImpl& sys, AskBase<R>* st, const ActorRef<M>& target, Make&& make, Duration timeout) {
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

}  // namespace detail

template <class Msg>
template <class R, class M, class Make, class K>
void Actor<Msg>::ask(const ActorRef<M>& target, Make&& make, Duration timeout, K&& k) {
  auto* st = new detail::ActorAsk<R>(cell_, std::function<void(Result<R>)>(std::forward<K>(k)));
  struct Release {
    detail::ActorAsk<R>* st;
    ~Release() { st->release(); }
  } release{st};
  detail::send_ask<R>(cell_->system(), st, target, std::forward<Make>(make), timeout);
}

}  // namespace troupe
