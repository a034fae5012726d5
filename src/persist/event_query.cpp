// Queries across entities (event_query.hpp): offsets, selectors, the checks
// every back end applies, the Journal defaults for journals without the
// global order, and the listener set the back ends notify.

#include "troupe/persist/event_query.hpp"

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "append_listeners.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

std::string JournalOffset::to_string() const { return std::to_string(tx) + ":" + std::to_string(ordering); }

Result<JournalOffset> parse_offset(std::string_view text) {
  auto bad = [&] {
    return Error(ErrorCode::invalid_argument, "offset '" + std::string(text.substr(0, 64)) +
                                                  "' is not <transaction>:<ordering> (two unsigned numbers)");
  };
  auto colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) return bad();
  JournalOffset o;
  auto number = [](std::string_view s, std::uint64_t& v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc{} && p == s.data() + s.size();
  };
  if (!number(text.substr(0, colon), o.tx) || !number(text.substr(colon + 1), o.ordering)) return bad();
  return o;
}

std::string EventSelector::to_string() const {
  return entity_type.empty() ? "tag:" + tag : "type:" + entity_type;
}

std::string_view entity_type_of(std::string_view persistence_id) noexcept {
  return persistence_id.substr(0, persistence_id.find('|'));
}

Result<void> validate_tag(std::string_view tag) {
  if (tag.empty()) return Error(ErrorCode::invalid_argument, "an empty tag");
  if (tag.size() > max_tag_length)
    return Error(ErrorCode::invalid_argument, "tag '" + std::string(tag.substr(0, 32)) + "...' is longer than " +
                                                  std::to_string(max_tag_length) + " bytes");
  for (unsigned char c : tag)
    if (c < 0x20 || c == 0x7f)
      return Error(ErrorCode::invalid_argument, "tag '" + std::string(tag) + "' holds a control character");
  return {};
}

Result<void> validate_query(const EventQuery& q) {
  const auto& s = q.select;
  if (s.entity_type.empty() == s.tag.empty())
    return Error(ErrorCode::invalid_argument, "a query selects by exactly one of entity type and tag");
  if (!s.tag.empty()) {
    if (auto t = validate_tag(s.tag); !t) return t;
  } else {
    if (auto t = validate_tag(s.entity_type); !t)
      return Error(ErrorCode::invalid_argument, "entity type: " + t.error().message());
    if (s.entity_type.find('|') != std::string::npos)
      return Error(ErrorCode::invalid_argument, "entity type '" + s.entity_type + "' holds a '|'");
  }
  if (q.limit == 0 || q.limit > max_query_limit)
    return Error(ErrorCode::invalid_argument, "query limit " + std::to_string(q.limit) + " is not 1 to " +
                                                  std::to_string(max_query_limit));
  return {};
}

void Journal::query_events(EventQuery, Callback<EventPage> done) {
  done(Error(ErrorCode::invalid_argument, "the " + std::string(name()) + " journal keeps no global order to query"));
}

std::uint64_t Journal::add_append_listener(std::function<void()>) { return 0; }

void Journal::remove_append_listener(std::uint64_t) {}

namespace detail {

std::uint64_t AppendListeners::add(std::function<void()> f) {
  std::lock_guard lk(mu_);
  std::uint64_t id = ++next_id_;
  listeners_.emplace(id, std::move(f));
  size_.store(listeners_.size(), std::memory_order_relaxed);
  return id;
}

void AppendListeners::remove(std::uint64_t id) {
  std::lock_guard lk(mu_);
  listeners_.erase(id);
  size_.store(listeners_.size(), std::memory_order_relaxed);
}

void AppendListeners::notify() {
  // Appends without listeners pay one relaxed load. A listener added while
  // this races with it may miss this commit; it queries once it is added.
  if (size_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lk(mu_);
  for (auto& [id, f] : listeners_) f();
}

}  // namespace detail
}  // namespace troupe
