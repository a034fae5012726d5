// The memory journal's global order (memory_journal.hpp): queries by entity
// type or tag over the arrival order, and the listeners told of appends.

#include <algorithm>
#include <string>

#include "append_listeners.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe {

void MemoryJournal::query_events(EventQuery query, Callback<EventPage> done) {
  if (auto v = validate_query(query); !v) return done(std::move(v).error());
  EventPage page;
  {
    std::lock_guard lk(mu_);
    // Memory orderings have no transaction part: an offset with one was
    // made by another journal and starts after everything here.
    if (query.after.tx != 0) return done(std::move(page));
    const auto& sel = query.select;
    for (auto it = ordered_.upper_bound(query.after.ordering);
         it != ordered_.end() && page.events.size() < query.limit; ++it) {
      const Placed& p = it->second;
      if (!sel.entity_type.empty() && entity_type_of(p.persistence_id) != sel.entity_type) continue;
      auto log = logs_.find(p.persistence_id);
      if (log == logs_.end()) continue;
      auto ev = log->second.events.find(p.seq);
      if (ev == log->second.events.end()) continue;  // deleted
      if (!sel.tag.empty() && std::find(ev->second.tags.begin(), ev->second.tags.end(), sel.tag) == ev->second.tags.end())
        continue;
      page.events.push_back(StreamEvent{JournalOffset{0, it->first}, p.persistence_id, ev->second});
    }
  }
  done(std::move(page));
}

std::uint64_t MemoryJournal::add_append_listener(std::function<void()> listener) {
  return listeners_->add(std::move(listener));
}

void MemoryJournal::remove_append_listener(std::uint64_t id) { listeners_->remove(id); }

}  // namespace troupe
