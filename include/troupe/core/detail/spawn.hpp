#pragma once
// Spawning: builds an actor's cell and its object on the calling thread (the
// constructor's exceptions reach the spawner and nothing leaks), applies the
// SpawnOptions and links the cell under its parent. Shared by
// ActorSystem::spawn and Actor::spawn. Included at the end of
// troupe/core/actor.hpp (include that instead); not part of the public API.

#include <type_traits>
#include <utility>

#include "troupe/core/actor.hpp"

namespace troupe {
namespace detail {

// Links a constructed cell into its parent and schedules its start. Returns
// false (and frees nothing) if the system no longer accepts actors.
bool start_cell(SystemImpl& s, CellBase* cell, CellBase* parent);
void apply_spawn_options(CellBase* cell, const SpawnOptions& o);

template <class... Args>
struct FirstIsOptions : std::false_type {};
template <class First, class... Rest>
struct FirstIsOptions<First, Rest...> : std::is_same<std::decay_t<First>, SpawnOptions> {};
template <class... Args>
inline constexpr bool first_is_spawn_options = FirstIsOptions<Args...>::value;

template <class A, class... Args>
ActorRef<typename A::message_type> spawn_cell(SystemImpl& sys, CellBase* parent, const SpawnOptions& opts,
                                              Args&&... args) {
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
  c->construct();                // user constructor may throw: nothing leaks
  apply_spawn_options(c, opts);  // name, bound, supervision
  guard.c = nullptr;
  ActorRef<typename A::message_type> ref{CellRef(c)};
  // From here the first reference is the parent link's; start_cell abandons
  // the cell and releases it itself if the system no longer takes actors.
  if (!start_cell(sys, c, parent)) return ActorRef<typename A::message_type>{};
  return ref;
}

// spawn<A>(args...) or spawn<A>(SpawnOptions{...}, args...), under `parent`.
template <class A, class... Args>
ActorRef<typename A::message_type> spawn_under(SystemImpl& sys, CellBase* parent, Args&&... args) {
  static_assert(ActorType<A>, "A must derive from Actor<Msg> and have receive(Msg&)");
  static_assert(!requires(A& a, typename A::message_type& m) {
    { a.receive(m) } -> std::same_as<Task<>>;
  } || CoroutineReceive<A>, "a coroutine receive takes its message by value: Task<> receive(Msg m)");
  if constexpr (CoroutineReceive<A> && requires { &A::receive; }) {
    static_assert(std::is_same_v<decltype(&A::receive), Task<> (A::*)(typename A::message_type)>,
                  "a coroutine receive takes its message by value: Task<> receive(Msg m) (a reference "
                  "would dangle after its first co_await)");
  }
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

}  // namespace troupe
