#pragma once
// What the read models of projections share (projection.hpp): the values a
// statement binds and a query returns, and the rule that moves a
// projection's stored offset.
//
// A read model stores a projection's offset in its own table
// (troupe_projection_offsets: projection key, tx, ordering, updated_ms) in
// the same transaction as the handler's writes. The offset moves only from
// the value the projection last read: a transaction that finds another
// value (a second instance of the same projection moved it first) applies
// nothing and fails with journal_conflict, so two instances running at once
// (a paused owner, a slice that moved) never apply an event twice.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe {

// A parameter of a statement: NULL, an integer, a real, or text/bytes (the
// caller keeps them alive for the call).
using SqlParam = std::variant<std::nullptr_t, std::int64_t, double, std::string_view>;
// A column of a returned row (text and blobs as bytes).
using SqlCell = std::variant<std::nullptr_t, std::int64_t, double, std::string>;
using SqlRow = std::vector<SqlCell>;

// The table where read models keep the offsets of their projections.
inline constexpr std::string_view projection_offsets_table = "troupe_projection_offsets";

}  // namespace troupe
