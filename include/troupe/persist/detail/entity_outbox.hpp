#pragma once
// The side effects an entity's behaviour derives from its events (its
// optional side_effects member; troupe/persist/outbox.hpp), as the outbox
// records of the append that stores the events. Not part of the public API.

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "troupe/core/result.hpp"
#include "troupe/persist/detail/entity_behaviour.hpp"
#include "troupe/persist/outbox.hpp"

namespace troupe::detail {

template <class B>
concept HasSideEffects = requires(const B& b, const EventOf<B>& e) {
  { b.side_effects(e) } -> std::convertible_to<std::vector<SideEffect>>;
};

// Adds to `out` the records of event `seq` of `pid` (nothing for a behaviour
// without side_effects). A side_effects that throws, or gives an effect
// without a kind, is invalid_argument: the append must not go out.
template <class B>
Result<void> add_side_effects(const B& b, const EventOf<B>& e, const std::string& pid, std::uint64_t seq,
                              std::vector<OutboxRecord>& out) {
  if constexpr (HasSideEffects<B>) {
    std::vector<SideEffect> effects;
    try {
      effects = b.side_effects(e);
    } catch (const std::exception& ex) {
      return Error(ErrorCode::invalid_argument, std::string("side_effects threw: ") + ex.what());
    }
    for (std::size_t n = 0; n < effects.size(); ++n) {
      if (effects[n].kind.empty()) return Error(ErrorCode::invalid_argument, "a side effect without a kind");
      out.push_back(OutboxRecord{pid + "/" + std::to_string(seq) + "/" + std::to_string(n), std::move(effects[n].kind),
                                 std::move(effects[n].payload)});
    }
  } else {
    (void)b, (void)e, (void)pid, (void)seq, (void)out;
  }
  return {};
}

}  // namespace troupe::detail
