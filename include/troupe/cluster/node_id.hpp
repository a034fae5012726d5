#pragma once
// Node ids: how cluster members name themselves in Redis, on the wire and in
// logs. A node id is 1 to 64 characters of [A-Za-z0-9._-]: safe inside Redis
// keys, frames and file names without escaping. One rule, checked wherever a
// node id enters the system (configuration, handshake, Redis replies).

#include <string_view>

#include "troupe/core/result.hpp"

namespace troupe::cluster {

inline constexpr std::size_t max_node_id_length = 64;

// Ok, or invalid_argument naming the first offending character or the length.
Result<void> validate_node_id(std::string_view id);

}  // namespace troupe::cluster
