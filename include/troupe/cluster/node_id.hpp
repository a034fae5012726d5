#pragma once
// Node ids, app versions and roles: how cluster members name themselves in Redis, on the wire and in
// logs. A node id is 1 to 64 characters of [A-Za-z0-9._-]: safe inside Redis
// keys, frames and file names without escaping. One rule, checked wherever a
// node id enters the system (configuration, handshake, Redis replies).

#include <string_view>

#include "troupe/core/result.hpp"

namespace troupe::cluster {

inline constexpr std::size_t max_node_id_length = 64;

// Ok, or invalid_argument naming the first offending character or the length.
Result<void> validate_node_id(std::string_view id);

// An application version as a member declares it (CoordinatorSettings::
// app_version): empty, or 1 to 64 characters of [A-Za-z0-9._+-] ("2.3.1",
// "2026.11.27+build5"). Ok, or invalid_argument saying what is wrong.
inline constexpr std::size_t max_app_version_length = 64;
Result<void> validate_app_version(std::string_view version);

// A role a member holds or a group names (CoordinatorSettings::roles,
// group_roles): 1 to 64 characters of [A-Za-z0-9._-] ("manager",
// "device-worker"). Ok, or invalid_argument naming the role and the fault.
inline constexpr std::size_t max_role_length = 64;
Result<void> validate_role(std::string_view role);

}  // namespace troupe::cluster
