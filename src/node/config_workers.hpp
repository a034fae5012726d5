#pragma once
// Parsing of the node's roles, [[workers]], [log] and [admin] tables, for config.cpp.
// Private to the node.

#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "troupe/node/config.hpp"

namespace troupe::node::detail {

// Ok, or invalid_argument "<setting>: ..." for a role name that is not 1 to
// 64 of A-Z a-z 0-9 . _ -, or one named twice.
Result<void> check_roles(const std::vector<std::string>& roles, const std::string& setting);

// The [[workers]] array of tables (`n` may be null: none). Errors name the
// setting as "workers[<i>].<key>" (and the group once it is known).
Result<std::vector<WorkerGroupConfig>> parse_worker_groups(const toml::node* n);

// The [log] table (`n` may be null: the defaults). Errors name the setting
// ("log.level: ...", "log.levels.clusterr: unknown component").
Result<LogConfig> parse_log(const toml::node* n);

// The [admin] table (`t` may be null: the defaults; config_admin.cpp).
// A token_file that cannot be read or holds no token is an error.
Result<AdminConfig> parse_admin(const toml::table* t);

}  // namespace troupe::node::detail
