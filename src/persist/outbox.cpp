// The outbox's checks and the Journal defaults for journals without one
// (outbox.hpp, journal.hpp).

#include <set>
#include <string>
#include <string_view>

#include "outbox_support.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

namespace detail {

Result<void> validate_outbox_records(const AppendBatch& batch) {
  std::set<std::string_view> keys;
  for (const OutboxRecord& r : batch.outbox) {
    if (r.key.empty() || r.kind.empty())
      return Error(ErrorCode::invalid_argument,
                   "append to '" + batch.persistence_id + "': an outbox record needs a key and a kind");
    if (!keys.insert(r.key).second)
      return Error(ErrorCode::invalid_argument,
                   "append to '" + batch.persistence_id + "': outbox key '" + r.key + "' given twice");
  }
  return {};
}

Error no_outbox(std::string_view journal) {
  return Error(ErrorCode::invalid_argument, "the " + std::string(journal) + " journal keeps no outbox");
}

Error outbox_key_taken(const std::string& persistence_id, const std::string& key) {
  return Error(ErrorCode::journal_conflict, "append to '" + persistence_id + "' refused: outbox key '" + key +
                                                "' is already stored");
}

}  // namespace detail

Result<void> validate_claim(const OutboxClaim& c) {
  if (c.owner.empty()) return Error(ErrorCode::invalid_argument, "outbox claim without an owner");
  if (c.lease_ms <= 0) return Error(ErrorCode::invalid_argument, "outbox claim with a lease of no time");
  if (c.limit == 0) return Error(ErrorCode::invalid_argument, "outbox claim of no records");
  return {};
}

Result<void> validate_settlement(const OutboxSettlement& s) {
  if (s.key.empty()) return Error(ErrorCode::invalid_argument, "outbox settlement without a key");
  if (s.owner.empty()) return Error(ErrorCode::invalid_argument, "outbox settlement without an owner");
  return {};
}

void Journal::claim_outbox(OutboxClaim, Callback<std::vector<OutboxEntry>> done) { done(detail::no_outbox(name())); }

void Journal::settle_outbox(OutboxSettlement, Callback<void> done) { done(detail::no_outbox(name())); }

void Journal::read_outbox(OutboxQuery, Callback<OutboxView> done) { done(detail::no_outbox(name())); }

}  // namespace troupe
