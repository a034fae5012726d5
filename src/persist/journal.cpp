#include "troupe/persist/journal.hpp"

#include "outbox_support.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace troupe {

Result<void> validate_batch(const AppendBatch& batch) {
  if (batch.persistence_id.empty())
    return Error(ErrorCode::invalid_argument, "append with an empty persistence id");
  if (batch.events.empty())
    return Error(ErrorCode::invalid_argument, "append of no events to '" + batch.persistence_id + "'");
  if (batch.events.front().seq == 0)
    return Error(ErrorCode::invalid_argument,
                 "append to '" + batch.persistence_id + "': sequence numbers start at 1");
  if (batch.fence.value != 0 || !batch.fence.key.empty())
    if (auto f = validate_fence(batch.fence.key, batch.fence.value); !f)
      return Error(ErrorCode::invalid_argument, "append to '" + batch.persistence_id + "': " + f.error().message());
  for (std::size_t i = 1; i < batch.events.size(); ++i) {
    if (batch.events[i].seq != batch.events[i - 1].seq + 1)
      return Error(ErrorCode::invalid_argument,
                   "append to '" + batch.persistence_id + "': sequence numbers " +
                       std::to_string(batch.events[i - 1].seq) + " and " +
                       std::to_string(batch.events[i].seq) + " are not consecutive");
  }
  for (const EventRecord& e : batch.events) {
    if (e.tags.empty()) continue;
    if (e.tags.size() > max_tags_per_event)
      return Error(ErrorCode::invalid_argument, "append to '" + batch.persistence_id + "': event " +
                                                    std::to_string(e.seq) + " has " + std::to_string(e.tags.size()) +
                                                    " tags, more than " + std::to_string(max_tags_per_event));
    for (const std::string& t : e.tags)
      if (auto v = validate_tag(t); !v)
        return Error(ErrorCode::invalid_argument, "append to '" + batch.persistence_id + "': event " +
                                                      std::to_string(e.seq) + ": " + v.error().message());
  }
  if (!batch.outbox.empty()) return detail::validate_outbox_records(batch);
  return {};
}

Result<void> validate_fence(const std::string& key, std::uint64_t value) {
  if (key.empty()) return Error(ErrorCode::invalid_argument, "fence with an empty key");
  if (value == 0) return Error(ErrorCode::invalid_argument, "fence '" + key + "' raised to 0; fences start at 1");
  if (value > static_cast<std::uint64_t>(INT64_MAX))
    return Error(ErrorCode::invalid_argument, "fence '" + key + "' value " + std::to_string(value) +
                                                  " exceeds the largest storable, " + std::to_string(INT64_MAX));
  return {};
}

Error fence_refused(const AppendBatch& batch, std::uint64_t stored) {
  return Error(ErrorCode::journal_conflict,
               "append to '" + batch.persistence_id + "' refused: fence '" + batch.fence.key + "' is at " +
                   std::to_string(stored) + ", this writer holds it at " + std::to_string(batch.fence.value) +
                   " (a newer owner has taken over)");
}

Error fence_lowered(const std::string& key, std::uint64_t value, std::uint64_t stored) {
  return Error(ErrorCode::journal_conflict, "fence '" + key + "' is at " + std::to_string(stored) +
                                                ", cannot take it at " + std::to_string(value) +
                                                " (a newer owner has taken over)");
}

void Journal::recover(std::string persistence_id, Callback<Recovery> done) {
  // snapshot -> events after it -> highest (deletions can leave it above the
  // last event). Each step forwards an error as the whole recovery's.
  struct State {
    std::string id;
    Callback<Recovery> done;
    Recovery rec;
  };
  auto st = std::make_shared<State>(State{std::move(persistence_id), std::move(done), {}});
  load_snapshot(st->id, [this, st](Result<std::optional<SnapshotRecord>> snap) {
    if (!snap.ok()) return st->done(std::move(snap).error());
    st->rec.snapshot = std::move(*snap);
    std::uint64_t from = st->rec.snapshot ? st->rec.snapshot->seq + 1 : 1;
    replay(st->id, from, UINT64_MAX, [this, st](Result<std::vector<EventRecord>> evs) {
      if (!evs.ok()) return st->done(std::move(evs).error());
      st->rec.events = std::move(*evs);
      highest_seq(st->id, [st](Result<std::uint64_t> h) {
        if (!h.ok()) return st->done(std::move(h).error());
        st->rec.highest_seq = *h;
        st->done(std::move(st->rec));
      });
    });
  });
}

}  // namespace troupe
