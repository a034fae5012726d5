#pragma once
// The PostgreSQL journal's outbox (outbox.hpp): what its writer lanes send
// with an append, and how its readers' results are read. The SQL is in
// pg_outbox.cpp (Sql::outbox_sql); the layout in doc/journal.md ("The
// outbox"). Internal to src/persist/postgres.

#include <optional>
#include <vector>

#include "pg_support.hpp"

namespace troupe::pg {

// The kOutboxAppend arguments: every outbox record of `batches`; nullopt
// when none has any.
std::optional<Params> outbox_rows(const std::vector<const AppendBatch*>& batches);
// The journal_conflict of a batch whose outbox key is already stored.
Error outbox_conflict(const AppendBatch& batch);
// kOutboxCounts: (status, count) rows.
Result<OutboxView> parse_outbox_counts(const PGresult* r);
// kOutboxEntries and kOutboxClaim: entry rows, returned oldest first.
Result<std::vector<OutboxEntry>> parse_outbox_entries(const PGresult* r);

}  // namespace troupe::pg
