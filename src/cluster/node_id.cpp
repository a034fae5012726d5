#include "troupe/cluster/node_id.hpp"

#include <string>

namespace troupe::cluster {

Result<void> validate_node_id(std::string_view id) {
  if (id.empty()) return Error(ErrorCode::invalid_argument, "node id is empty");
  if (id.size() > max_node_id_length)
    return Error(ErrorCode::invalid_argument, "node id is " + std::to_string(id.size()) + " characters long; at most " +
                                                  std::to_string(max_node_id_length) + " allowed");
  for (std::size_t i = 0; i < id.size(); ++i) {
    char c = id[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-';
    if (!ok) {
      return Error(ErrorCode::invalid_argument, "node id '" + std::string(id) + "' has a character outside [A-Za-z0-9._-] at " +
                                                    std::to_string(i));
    }
  }
  return {};
}

Result<void> validate_app_version(std::string_view version) {
  if (version.size() > max_app_version_length)
    return Error(ErrorCode::invalid_argument, "app version is " + std::to_string(version.size()) +
                                                  " characters long; at most " +
                                                  std::to_string(max_app_version_length) + " allowed");
  for (std::size_t i = 0; i < version.size(); ++i) {
    const char c = version[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '+' || c == '-';
    if (!ok)
      return Error(ErrorCode::invalid_argument, "app version '" + std::string(version) +
                                                    "' has a character outside [A-Za-z0-9._+-] at " + std::to_string(i));
  }
  return {};
}

Result<void> validate_role(std::string_view role) {
  if (role.empty()) return Error(ErrorCode::invalid_argument, "a role is empty");
  if (role.size() > max_role_length)
    return Error(ErrorCode::invalid_argument, "role '" + std::string(role.substr(0, 80)) + "' is " +
                                                  std::to_string(role.size()) + " characters long; at most " +
                                                  std::to_string(max_role_length) + " allowed");
  for (std::size_t i = 0; i < role.size(); ++i) {
    const char c = role[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok)
      return Error(ErrorCode::invalid_argument,
                   "role '" + std::string(role) + "' has a character outside [A-Za-z0-9._-] at " + std::to_string(i));
  }
  return {};
}

}  // namespace troupe::cluster
