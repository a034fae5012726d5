#pragma once
// What every journal's outbox shares (outbox.cpp): the checks of records,
// claims and settlements, the back-off of a retry, and the answer of a
// journal that keeps no outbox. Internal to the persist layer.

#include <string>

#include "troupe/persist/journal.hpp"

namespace troupe::detail {

// Records with an empty key or kind, or two with one key: invalid_argument.
Result<void> validate_outbox_records(const AppendBatch& batch);
// invalid_argument naming `journal`, which keeps no outbox.
Error no_outbox(std::string_view journal);
// The journal_conflict of an append whose outbox key is already stored.
Error outbox_key_taken(const std::string& persistence_id, const std::string& key);

}  // namespace troupe::detail
