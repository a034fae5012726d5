// The [admin] table of the node's config: address, bearer token and the
// admin port's limits (see config_workers.hpp).

#include "admin_auth.hpp"
#include "config_workers.hpp"

namespace troupe::node::detail {

namespace {
Error bad(std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); }
}  // namespace

Result<AdminConfig> parse_admin(const toml::node* n) {
  AdminConfig c;
  if (!n) return c;
  if (!n->is_table()) return bad("admin: expected a table ([admin])");
  ConfigReader r(n->as_table(), "admin");
#define TROUPE_ADMIN_TRY(var, expr)                   \
  auto var##_r = (expr);                              \
  if (!var##_r.ok()) return std::move(var##_r).error(); \
  auto var = std::move(*var##_r)
  TROUPE_ADMIN_TRY(host, r.string("host", c.host));
  if (host.empty()) return bad("admin.host: empty");
  c.host = host;
  TROUPE_ADMIN_TRY(port, r.integer("port", c.port, 0, 65535));
  c.port = static_cast<std::uint16_t>(port);
  TROUPE_ADMIN_TRY(token_file, r.string("token_file", ""));
  if (r.has("token_file") && token_file.empty()) return bad("admin.token_file: empty");
  if (!token_file.empty()) {
    if (auto t = read_token_file(token_file); !t.ok()) return std::move(t).error();
    c.token_file = token_file;
  }
  TROUPE_ADMIN_TRY(read_open, r.boolean("read_open", c.read_open));
  c.read_open = read_open;
  TROUPE_ADMIN_TRY(max_conn, r.integer("max_connections", static_cast<std::int64_t>(c.max_connections), 1, 1'000'000));
  c.max_connections = static_cast<std::size_t>(max_conn);
  TROUPE_ADMIN_TRY(per_address, r.integer("max_connections_per_address",
                                          static_cast<std::int64_t>(c.max_connections_per_address), 1, 1'000'000));
  c.max_connections_per_address = static_cast<std::size_t>(per_address);
  using std::chrono::milliseconds;
  TROUPE_ADMIN_TRY(idle, r.millis("idle_timeout_ms", c.idle_timeout, milliseconds(100), milliseconds(3'600'000)));
  c.idle_timeout = idle;
  TROUPE_ADMIN_TRY(read, r.millis("request_read_timeout_ms", c.request_read_timeout, milliseconds(100),
                                  milliseconds(600'000)));
  c.request_read_timeout = read;
#undef TROUPE_ADMIN_TRY
  if (auto f = r.finish(); !f.ok()) return std::move(f).error();
  return c;
}

}  // namespace troupe::node::detail
