// The admin API's security: the bearer token (the constant-time
// comparison, the token file read, refused when empty or unreadable, read
// again when rotated; a node whose routes answer 401 without it), the
// [admin] keys, and the admin API over TLS.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "../net/http/test_pki.hpp"
#include "admin_auth.hpp"
#include "troupe/net/http.hpp"
#include "troupe/node/config.hpp"
#include "troupe/node/node.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::node::Node;
using troupe::node::NodeConfig;
namespace detail = troupe::node::detail;

struct TempDir {
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("troupe-admin-auth-" + std::to_string(::getpid()) + "-" +
                                                     std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::filesystem::path write(const std::string& name, const std::string& text, mode_t mode = 0600) const {
    auto p = path / name;
    std::ofstream(p, std::ios::trunc) << text;
    ::chmod(p.c_str(), mode);
    return p;
  }
  std::filesystem::path path;
  static inline int counter = 0;
};

TEST(AdminToken, SameSecretComparesWholeValues) {
  EXPECT_TRUE(detail::same_secret("s3cret-token", "s3cret-token"));
  EXPECT_FALSE(detail::same_secret("s3cret-token", "s3cret-tokem"));
  EXPECT_FALSE(detail::same_secret("s3cret-token", "s3cret-token2")) << "a longer value";
  EXPECT_FALSE(detail::same_secret("s3cret-token", "s3cret")) << "a prefix";
  EXPECT_FALSE(detail::same_secret("s3cret-token", ""));
  EXPECT_TRUE(detail::same_secret("", ""));
}

TEST(AdminToken, TheFileIsTrimmedAndAnEmptyOrMissingOneIsRefused) {
  TempDir d;
  auto t = detail::read_token_file(d.write("t", "  abc123\n"));
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(*t, "abc123");
  auto empty = detail::read_token_file(d.write("e", " \n\n"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message().find("holds no token"), std::string::npos) << empty.error().message();
  auto missing = detail::read_token_file(d.path / "absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message().rfind("admin.token_file: cannot read ", 0), 0u) << missing.error().message();
}

TEST(AdminToken, ARotatedFileIsReadAgainAndABrokenOneKeepsTheLastToken) {
  TempDir d;
  auto file = d.write("token", "first\n");
  auto token = detail::AdminToken::open(file);
  ASSERT_TRUE(token.ok()) << token.error().to_string();
  auto& t = **token;
  EXPECT_TRUE(t.matches("first"));
  EXPECT_FALSE(t.matches("second"));

  // Rotation by rename (a new inode), as editors and `install` do.
  auto next = d.write("token.new", "second\n");
  std::filesystem::rename(next, file);
  EXPECT_TRUE(t.matches("second"));
  EXPECT_FALSE(t.matches("first")) << "the old token stops working at once";

  // Rewritten in place with a token of the same length.
  std::this_thread::sleep_for(10ms);
  d.write("token", "third!\n");
  EXPECT_TRUE(t.matches("third!"));

  d.write("token", "");
  EXPECT_TRUE(t.matches("third!")) << "an emptied file keeps the last token";
  std::filesystem::remove(file);
  EXPECT_TRUE(t.matches("third!")) << "a removed file keeps the last token";
  d.write("token", "fourth");
  EXPECT_TRUE(t.matches("fourth"));
}

TEST(AdminConfig, TokenFileReadOpenAndLimitsAreRead) {
  TempDir d;
  auto file = d.write("token", "tok\n");
  auto c = NodeConfig::parse("[admin]\ntoken_file = \"" + file.string() +
                                 "\"\nread_open = true\nmax_connections = 10\nmax_connections_per_address = 3\n"
                                 "idle_timeout_ms = 5000\nrequest_read_timeout_ms = 2000\n",
                             "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->admin.token_file, file);
  EXPECT_TRUE(c->admin.read_open);
  EXPECT_EQ(c->admin.max_connections, 10u);
  EXPECT_EQ(c->admin.max_connections_per_address, 3u);
  EXPECT_EQ(c->admin.idle_timeout, 5000ms);
  EXPECT_EQ(c->admin.request_read_timeout, 2000ms);

  auto defaults = NodeConfig::parse("", "t.toml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_TRUE(defaults->admin.token_file.empty());
  EXPECT_FALSE(defaults->admin.read_open);
}

TEST(AdminConfig, AnEmptyOrUnreadableTokenFileFailsToLoadNamingIt) {
  TempDir d;
  auto empty = d.write("empty", "\n");
  auto c = NodeConfig::parse("[admin]\ntoken_file = \"" + empty.string() + "\"\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message(), "t.toml: admin.token_file: " + empty.string() + " holds no token");
  auto gone = d.path / "gone";
  c = NodeConfig::parse("[admin]\ntoken_file = \"" + gone.string() + "\"\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message(), "t.toml: admin.token_file: cannot read " + gone.string());
  c = NodeConfig::parse("[admin]\ntoken_file = \"\"\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message(), "t.toml: admin.token_file: empty");
}

// A node on a memory journal with `admin_extra` in [admin]; its client.
struct GuardedNode {
  GuardedNode(const std::string& admin_extra) {
    auto cfg = NodeConfig::parse("[node]\ndata_dir = \"" + dir.path.string() + "\"\n[admin]\nport = 0\n" +
                                     admin_extra + "\n[journal]\nbackend = \"memory\"\n",
                                 "t.toml");
    EXPECT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto n = Node::start(std::move(*cfg));
    EXPECT_TRUE(n.ok()) << n.error().to_string();
    node = std::move(*n);
    node->mark_ready();
    troupe::http::ClientSettings cs;
    cs.port = node->admin_port();
    auto c = troupe::http::Client::create(cs);
    EXPECT_TRUE(c.ok());
    if (c.ok()) client = std::move(*c);
  }
  troupe::http::Response call(std::string method, std::string target, std::string auth = "") {
    troupe::http::ClientRequest r;
    r.method = std::move(method);
    r.target = std::move(target);
    if (!auth.empty()) r.headers.emplace_back("Authorization", std::move(auth));
    auto resp = client->request_sync(std::move(r));
    EXPECT_TRUE(resp.ok()) << resp.error().to_string();
    return resp.ok() ? *resp : troupe::http::Response{};
  }
  TempDir dir;
  std::unique_ptr<Node> node;
  std::unique_ptr<troupe::http::Client> client;
};

TEST(AdminGuard, EveryRouteButHealthNeedsTheTokenAndARefusalDoesNothing) {
  TempDir keys;
  auto file = keys.write("token", "the-right-token\n");
  GuardedNode g("token_file = \"" + file.string() + "\"");
  for (auto [method, target] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/drain"}, {"POST", "/rebalance"}, {"POST", "/workers/g/sync"}, {"GET", "/metrics"},
           {"GET", "/api/overview"}, {"GET", "/cluster"}, {"GET", "/ready"}, {"GET", "/entities/t/1"},
           {"GET", "/nowhere"}}) {
    for (std::string auth : {"", "Bearer wrong-token", "Bearer the-right-token-", "Basic dGhlLXJpZ2h0LXRva2Vu",
                             "Bearer"}) {
      auto r = g.call(method, target, auth);
      EXPECT_EQ(r.status, 401) << method << " " << target << " with '" << auth << "'";
      EXPECT_EQ(r.header("WWW-Authenticate"), "Bearer realm=\"troupe\"");
      EXPECT_EQ(r.body.find("the-right"), std::string::npos) << "never a hint of the token";
    }
  }
  EXPECT_FALSE(g.node->draining()) << "a refused POST /drain drains nothing";
  EXPECT_EQ(g.call("GET", "/health").status, 200) << "/health stays open for load balancers";
  auto page = g.call("GET", "/");
  EXPECT_EQ(page.status, 200) << "the dashboard's page loads (it holds no data) to ask for the token";
  EXPECT_EQ(g.call("GET", "/app.js").status, 200);
  EXPECT_EQ(g.call("POST", "/", "").status, 401);
  EXPECT_EQ(g.call("GET", "/metrics", "Bearer the-right-token").status, 200);
  EXPECT_EQ(g.call("GET", "/metrics", "bearer   the-right-token ").status, 200) << "the scheme is case-insensitive";
  EXPECT_EQ(g.call("POST", "/rebalance", "Bearer the-right-token").status, 409) << "runs: the node is alone";
  EXPECT_EQ(g.call("POST", "/drain", "Bearer the-right-token").status, 202);
  EXPECT_TRUE(g.node->draining());
}

TEST(AdminGuard, ReadOpenLetsReadsThroughButNotWrites) {
  TempDir keys;
  auto file = keys.write("token", "tok\n");
  GuardedNode g("token_file = \"" + file.string() + "\"\nread_open = true");
  EXPECT_EQ(g.call("GET", "/metrics").status, 200);
  EXPECT_EQ(g.call("GET", "/api/overview").status, 200);
  EXPECT_EQ(g.call("POST", "/drain").status, 401);
  EXPECT_FALSE(g.node->draining());
  // Rotated while running: the new token works, the old one no longer does.
  auto next = keys.write("token.new", "rotated\n");
  std::filesystem::rename(next, file);
  EXPECT_EQ(g.call("POST", "/drain", "Bearer tok").status, 401);
  EXPECT_EQ(g.call("POST", "/drain", "Bearer rotated").status, 202);
}

TEST(AdminGuard, WithoutATokenFileEveryRouteIsOpenAsBefore) {
  GuardedNode g("");
  EXPECT_EQ(g.call("GET", "/metrics").status, 200);
  EXPECT_EQ(g.call("POST", "/rebalance").status, 409);
}

TEST(AdminTls, TheAdminApiServesHttpsWithItsCertificateAndTheTokenOverIt) {
  const auto& pki = troupe::http::testing::Pki::get();
  ASSERT_TRUE(pki.ok) << "openssl could not make the test certificates";
  TempDir keys;
  auto token = keys.write("token", "tls-token\n");
  GuardedNode g("token_file = \"" + token.string() + "\"\n[admin.tls]\ncert = \"" + (pki / "server.crt").string() +
                "\"\nkey = \"" + (pki / "server.key").string() + "\"");
  troupe::http::ClientSettings cs;
  cs.port = g.node->admin_port();
  cs.tls = true;
  cs.tls_ca_file = (pki / "ca-a.crt").string();
  auto client = troupe::http::Client::create(cs);
  ASSERT_TRUE(client.ok());
  troupe::http::ClientRequest r;
  r.target = "/api/overview";
  r.headers.emplace_back("Authorization", "Bearer tls-token");
  auto over_tls = (*client)->request_sync(r);
  ASSERT_TRUE(over_tls.ok()) << over_tls.error().to_string();
  EXPECT_EQ(over_tls->status, 200);
  auto plain = g.client->request_sync("GET", "/health");  // g's own client speaks plain HTTP
  EXPECT_FALSE(plain.ok() && plain->status == 200) << "plain HTTP on the HTTPS port is no request";
}

TEST(AdminTls, TheTlsTableNeedsBothFilesAndAFileThatDoesNotLoadStopsTheStart) {
  auto half = NodeConfig::parse("[admin.tls]\ncert = \"a.crt\"\n", "t.toml");
  ASSERT_FALSE(half.ok());
  EXPECT_EQ(half.error().message(), "t.toml: admin.tls: needs both cert and key (PEM files)");
  auto typo = NodeConfig::parse("[admin.tls]\ncert = \"a.crt\"\nkey = \"a.key\"\nca = \"x\"\n", "t.toml");
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.error().message(), "t.toml: admin.tls.ca: unknown setting");
  auto cfg = NodeConfig::parse(
      "[admin]\nport = 0\n[admin.tls]\ncert = \"/nonexistent/a.crt\"\nkey = \"/nonexistent/a.key\"\n"
      "[journal]\nbackend = \"memory\"\n",
      "t.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  EXPECT_TRUE(cfg->admin.tls());
  auto n = Node::start(std::move(*cfg));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().message().rfind("admin.tls: TLS certificate /nonexistent/a.crt", 0), 0u) << n.error().message();
}

}  // namespace
