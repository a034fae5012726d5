#pragma once
// Keyed timers and the receive timeout of Actor<Msg>.
//
// A timer is a node on the system's timer queue; its fire travels to the
// actor as a runtime message and is delivered only if the generation it
// carries is still the one in the actor's timer table, so a cancelled or
// replaced timer is never observed even when its fire is already queued.
// The receive timeout re-checks the actor's last activity when it fires and
// either delivers or re-arms. Included at the end of troupe/core/actor.hpp
// (include that instead); not part of the public API.

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "troupe/core/actor.hpp"

namespace troupe {
namespace detail {

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

}  // namespace detail

template <class Msg>
Result<void> Actor<Msg>::start_periodic_timer(std::string key, Duration interval, Msg msg) {
  static_assert(std::is_copy_constructible_v<Msg>, "periodic timers copy their message");
  if (interval <= Duration::zero())
    return Error(ErrorCode::invalid_argument, "periodic timer interval must be positive");
  arm_timer(std::move(key), interval, std::move(msg), true);
  return {};
}

template <class Msg>
bool Actor<Msg>::cancel_timer(std::string_view key) {
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

template <class Msg>
bool Actor<Msg>::timer_active(std::string_view key) const {
  auto* x = cell_->extras_if();
  if (!x) return false;
  for (auto& s : x->timers)
    if (s.key == key) return true;
  return false;
}

template <class Msg>
Result<void> Actor<Msg>::set_receive_timeout(Duration d, Msg msg) {
  static_assert(std::is_copy_constructible_v<Msg>, "receive timeout copies its message");
  if (d <= Duration::zero()) return Error(ErrorCode::invalid_argument, "receive timeout must be positive");
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

template <class Msg>
void Actor<Msg>::cancel_receive_timeout() {
  auto* x = cell_->extras_if();
  if (!x || !x->rt_node) return;
  detail::timers_of(cell_->system()).cancel(x->rt_node);
  x->rt_node->release();
  x->rt_node = nullptr;
  ++x->rt_gen;
  cell_->set_receive_timeout_flag(false);
}

template <class Msg>
void Actor<Msg>::arm_timer(std::string key, Duration delay, Msg msg, bool periodic) {
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

}  // namespace troupe
