#pragma once
// Calls into an entity's behaviour class B (see troupe/persist/entity.hpp):
// its member types, both forms of on_event, its optional members
// (initial_state, processing, on_processing_timeout), and the reply target a
// command alternative may carry. Not part of the public API: names change
// without notice.

#include <concepts>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "troupe/core/actor.hpp"
#include "troupe/persist/codec.hpp"
#include "troupe/persist/effect.hpp"

namespace troupe {

template <class B>
class EntityContext;

namespace detail {

// src/persist/entity.cpp
std::string demangle(const char* mangled);

template <class B>
using CommandOf = typename B::Command;
template <class B>
using EventOf = typename B::Event;
template <class B>
using StateOf = typename B::State;

// The reply target of a command alternative, if it has one.
template <class T>
concept HasReplyTo = requires(T& t) {
  { t.reply_to.pending() } -> std::convertible_to<bool>;
};

// Calls f(reply_to) for the command's reply target, if any; else f().
template <class C, class F>
void with_reply_target(C& c, F&& f) {
  auto one = [&](auto& alt) {
    if constexpr (HasReplyTo<std::remove_cvref_t<decltype(alt)>>) {
      f(&alt.reply_to);
    } else {
      f(static_cast<ReplyTo<int>*>(nullptr));
    }
  };
  if constexpr (IsVariant<C>::value) {
    std::visit(one, c);
  } else {
    one(c);
  }
}

template <class C>
std::string command_name(const C& c) {
  if constexpr (IsVariant<C>::value) {
    return std::visit([](const auto& alt) { return demangle(typeid(alt).name()); }, c);
  } else {
    return demangle(typeid(C).name());
  }
}

// The optional members of a behaviour.
template <class B>
concept HasInitialState = requires(B& b) {
  { b.initial_state() } -> std::convertible_to<StateOf<B>>;
};
template <class B>
concept HasProcessing = requires(B& b, const StateOf<B>& st) { b.processing(st); };
template <class B>
concept HasProcessingTimeout = requires(B& b, const StateOf<B>& st, EntityContext<B>& c) {
  b.on_processing_timeout(st, c);
};
// void on_event(State&, const Event&), rather than State on_event(const State&, const Event&).
template <class B>
concept FoldsInPlace = requires(B& b, StateOf<B>& s, const EventOf<B>& ev) {
  { b.on_event(s, ev) } -> std::same_as<void>;
};

// B::initial_state() if B has one, else State{}.
template <class B>
StateOf<B> initial_state_of(B& b) {
  if constexpr (HasInitialState<B>) {
    return b.initial_state();
  } else {
    (void)b;
    return StateOf<B>{};
  }
}

// B::processing(s) if B has one: whether `s` is a processing state.
template <class B>
std::optional<Processing<EventOf<B>>> declared_processing(B& b, const StateOf<B>& s) {
  if constexpr (HasProcessing<B>) {
    return b.processing(s);
  } else {
    (void)b;
    (void)s;
    return std::nullopt;
  }
}

// Folds `e` into `s` with whichever form of on_event B has.
template <class B>
void fold_event(B& b, StateOf<B>& s, const EventOf<B>& e) {
  if constexpr (FoldsInPlace<B>) {
    b.on_event(s, e);
  } else {
    s = b.on_event(std::as_const(s), e);
  }
}

}  // namespace detail
}  // namespace troupe
