#pragma once
// The side effects an entity's behaviour derives from its events (its
// optional side_effects member; troupe/persist/outbox.hpp), as the outbox
// records of the append that stores the events, and the tags it gives them
// (its optional tags member; troupe/persist/event_query.hpp). Not part of
// the public API.

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "troupe/core/result.hpp"
#include "troupe/persist/detail/entity_behaviour.hpp"
#include "troupe/persist/event_query.hpp"
#include "troupe/persist/outbox.hpp"

namespace troupe::detail {

template <class B>
concept HasSideEffects = requires(const B& b, const EventOf<B>& e) {
  { b.side_effects(e) } -> std::convertible_to<std::vector<SideEffect>>;
};

// A behaviour that tags its events for queries across entities
// (event_query.hpp): `std::vector<std::string> tags(const Event&) const`.
template <class B>
concept HasTags = requires(const B& b, const EventOf<B>& e) {
  { b.tags(e) } -> std::convertible_to<std::vector<std::string>>;
};

// The tags of `e` (none for a behaviour without tags). A tags() that throws
// or gives a tag validate_tag refuses is invalid_argument: the append must
// not go out.
template <class B>
Result<std::vector<std::string>> tags_of(const B& b, const EventOf<B>& e) {
  if constexpr (HasTags<B>) {
    std::vector<std::string> tags;
    try {
      tags = b.tags(e);
    } catch (const std::exception& ex) {
      return Error(ErrorCode::invalid_argument, std::string("tags() threw: ") + ex.what());
    }
    if (tags.size() > max_tags_per_event)
      return Error(ErrorCode::invalid_argument, "tags() gave " + std::to_string(tags.size()) + " tags, more than " +
                                                    std::to_string(max_tags_per_event));
    for (const auto& t : tags)
      if (auto v = validate_tag(t); !v) return Error(ErrorCode::invalid_argument, "tags(): " + v.error().message());
    return tags;
  } else {
    (void)b;
    (void)e;
    return std::vector<std::string>{};
  }
}

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
