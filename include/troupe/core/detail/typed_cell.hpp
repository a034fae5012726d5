#pragma once
// Typed cells: the part of an actor's heap block that knows its message type.
//
// TypedCell<Msg> unwraps a user envelope and hands the message to the
// actor's behaviour (the per-message hot path, kept inline), and stashes the
// message being handled. CellImpl<A, Args...> adds the user's actor object
// and its constructor arguments, so that a restart can build a fresh one.
// Not part of the public API: names and layout change without notice.

#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "troupe/core/clock.hpp"
#include "troupe/core/detail/cell.hpp"
#include "troupe/core/detail/coroutine.hpp"
#include "troupe/core/result.hpp"

namespace troupe {
class ActorSystem;
}  // namespace troupe

namespace troupe::detail {

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
    } else if constexpr (requires(A& a) {
                           { a.receive(std::move(m)) } -> std::same_as<Task<>>;
                         }) {
      start_handler(*this, obj().receive(std::move(m)), RethrowFailure{});
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
void count_mailbox_full(SystemImpl& s) noexcept;
void count_stale_timer(SystemImpl& s) noexcept;
SystemImpl& impl_of(ActorSystem& s) noexcept;

}  // namespace troupe::detail
