// The [admin] table of the node's config: address, bearer token and the
// admin port's limits (see config_workers.hpp); reading the token file
// (admin_auth.hpp).

#include <fstream>
#include <sstream>

#include "admin_auth.hpp"
#include "config_workers.hpp"

namespace troupe::node::detail {

namespace {
Error bad(std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); }
}  // namespace

std::string_view trim_space(std::string_view s) noexcept {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  const auto b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

Result<std::string> read_token_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return bad("admin.token_file: cannot read " + file.string());
  std::ostringstream all;
  all << in.rdbuf();
  if (in.bad()) return bad("admin.token_file: cannot read " + file.string());
  std::string token(trim_space(all.str()));
  if (token.empty()) return bad("admin.token_file: " + file.string() + " holds no token");
  return token;
}

Result<AdminConfig> parse_admin(const toml::table* t) {
  AdminConfig c;
  if (!t) return c;
  toml::table own = *t;
  // [admin.tls] is read here; the rest of [admin] by its reader.
  if (const toml::node* tn = own.get("tls")) {
    if (!tn->is_table()) return bad("admin.tls: expected a table ([admin.tls])");
    ConfigReader tls(tn->as_table(), "admin.tls");
    auto cert = tls.string("cert", "");
    if (!cert.ok()) return std::move(cert).error();
    auto key = tls.string("key", "");
    if (!key.ok()) return std::move(key).error();
    if (cert->empty() || key->empty()) return bad("admin.tls: needs both cert and key (PEM files)");
    auto handshake = tls.millis("handshake_timeout_ms", c.tls_handshake_timeout, std::chrono::milliseconds(100),
                                std::chrono::milliseconds(600'000));
    if (!handshake.ok()) return std::move(handshake).error();
    if (auto f = tls.finish(); !f.ok()) return std::move(f).error();
    c.tls_cert = *cert;
    c.tls_key = *key;
    c.tls_handshake_timeout = *handshake;
    own.erase("tls");
  }
  ConfigReader r(&own, "admin");
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
    if (auto read = read_token_file(token_file); !read.ok()) return std::move(read).error();
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
