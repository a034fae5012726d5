// Redis ACL users: a coordinator logs in as the user doc/redis.md tells
// operators to create (the rule is read from that page), a wrong password is
// a clear error without the password, and credentials that stop working
// while a node runs fence it until they work again.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

constexpr const char* kPassword = "troupe-pw-7f3a";
constexpr const char* kOtherPassword = "rotated-pw-91c2";

// The ACL SETUSER line of doc/redis.md, as the words after "user " of an
// aclfile line, with kPassword in place of CHANGE-ME.
std::string documented_acl_rule() {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/doc/redis.md");
  std::string line;
  const std::string head = "ACL SETUSER ";
  while (std::getline(in, line)) {
    if (line.rfind(head + "troupe ", 0) != 0) continue;
    std::string rule = line.substr(head.size());
    auto at = rule.find(">CHANGE-ME");
    if (at == std::string::npos) throw std::runtime_error("doc/redis.md: the ACL rule has no >CHANGE-ME");
    return rule.replace(at, 10, std::string(">") + kPassword);
  }
  throw std::runtime_error("doc/redis.md has no line starting 'ACL SETUSER troupe '");
}

// Every node logs in as "troupe" on a Redis whose default user is off.
class RedisAcl : public RedisCoordinatorTest {
 protected:
  void SetUp() override {
    redis = std::make_unique<RedisTestServer>(RedisTestServer::Options{.acl_users = {documented_acl_rule()}});
  }
  CoordinatorSettings acl_settings(const std::string& id) {
    auto s = settings(id);
    s.redis_user = "troupe";
    s.redis_password = kPassword;
    return s;
  }
  bool logged_a_secret(NodeRecord& rec) {
    return rec.log_has(kPassword) || rec.log_has(kOtherPassword);
  }
};

TEST_F(RedisAcl, ACoordinatorLogsInAsTheDocumentedUserAndWorks) {
  auto& a = start_node(make_node(acl_settings("node-a")));
  auto& b = start_node(make_node(acl_settings("node-b")));
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 2; }));
  auto placed = await(a->assign("workers", "w1", "spec-1"));
  ASSERT_TRUE(placed.ok()) << placed.error().to_string();
  TestNode& owner = placed->assignment.owner == "node-a" ? a : b;
  TestNode& other = &owner == &a ? b : a;
  ASSERT_TRUE(wait_until([&] { return owner.rec->running_now().count("w1") == 1; }));
  // A move: the notice reaches the new owner through the subscription the
  // rule allows, and the old owner's release goes through.
  auto moved = await(a->relocate("workers", "w1", true));
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  ASSERT_TRUE(wait_until([&] {
    return other.rec->running_now().count("w1") == 1 && owner.rec->running_now().count("w1") == 0;
  }));
  // sync() publishes outside scripts; groups() is SMEMBERS; placements() is
  // MULTI, two HGETALLs, EXEC.
  auto synced = await(a->sync("workers", [] { return Result<cluster::DesiredSet>(cluster::DesiredSet{{"w1", ""}, {"w3", ""}}); }, false));
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  auto groups = await(a->groups());
  ASSERT_TRUE(groups.ok()) << groups.error().to_string();
  EXPECT_EQ(*groups, std::vector<std::string>{"workers"});
  auto table = await(a->placements("workers"));
  ASSERT_TRUE(table.ok()) << table.error().to_string();
  EXPECT_EQ(table->size(), 2u);
  // A flushed script cache: EVAL instead of EVALSHA.
  client()->cmd({"SCRIPT", "FLUSH"});
  ASSERT_TRUE(await(a->assign("workers", "w2", "")).ok());
  EXPECT_FALSE(a->is_fenced());
  EXPECT_FALSE(b->is_fenced());
  // Nothing was refused: a command missing from the rule shows up here.
  auto acl_log = client()->cmd({"ACL", "LOG"});
  EXPECT_TRUE(acl_log.elements.empty()) << "ACL LOG has " << acl_log.elements.size() << " entries";
  // The default user is really off.
  RedisTestClient anonymous(redis->port());
  EXPECT_TRUE(anonymous.cmd({"GET", "{troupe}:epoch"}).is_error());
}

TEST_F(RedisAcl, AWrongPasswordFailsStartNamingAuthWithoutThePassword) {
  auto s = acl_settings("node-a");
  s.redis_password = kOtherPassword;
  auto& n = make_node(s);
  auto r = await(n->start());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::coordination_failed);
  EXPECT_NE(r.error().message().find("AUTH refused for user 'troupe'"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("WRONGPASS"), std::string::npos) << r.error().message();
  EXPECT_EQ(r.error().message().find(kOtherPassword), std::string::npos) << r.error().message();
  EXPECT_FALSE(logged_a_secret(*n.rec));
  // Without a user, the default user (off) is asked: refused as well.
  auto d = settings("node-d");
  d.redis_password = kPassword;
  auto& dn = make_node(d);
  auto dr = await(dn->start());
  ASSERT_FALSE(dr.ok());
  EXPECT_NE(dr.error().message().find("AUTH refused:"), std::string::npos) << dr.error().message();
  // A user without a password is refused before anything is sent.
  auto bare = settings("node-c");
  bare.redis_user = "troupe";
  auto created = Coordinator::create(bare);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.error().code(), ErrorCode::invalid_argument);
}

TEST_F(RedisAcl, ANodeWhosePasswordStopsWorkingFencesLogsAndComesBack) {
  auto& a = start_node(make_node(acl_settings("node-a")));
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }));
  auto admin = client();
  // The operator changes the password; Redis keeps the open connections,
  // so cut them as a restart or failover would.
  ASSERT_FALSE(admin->cmd({"ACL", "SETUSER", "troupe", "resetpass", std::string(">") + kOtherPassword}).is_error());
  ASSERT_FALSE(admin->cmd({"CLIENT", "KILL", "USER", "troupe"}).is_error());
  // Fenced as when Redis is unreachable: its unit stops.
  ASSERT_TRUE(wait_until([&] { return a.rec->fenced_count() == 1; }, 10s));
  EXPECT_TRUE(a.rec->running_now().empty());
  auto call = await(a->assignment("workers", "w1"));
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.error().code(), ErrorCode::coordination_failed);
  ASSERT_TRUE(wait_until([&] { return a.rec->log_has("AUTH refused for user 'troupe'"); }, 5s));
  EXPECT_EQ(a.rec->level_of("AUTH refused for user 'troupe'"), CoordinatorLogLevel::error);
  // Reconnects go on every few hundred ms; the error line is written once a minute.
  std::this_thread::sleep_for(1500ms);
  {
    std::lock_guard lk(a.rec->mu);
    auto lines = std::count_if(a.rec->log.begin(), a.rec->log.end(), [](const std::string& l) {
      return l.find("AUTH refused") != std::string::npos;
    });
    EXPECT_EQ(lines, 1) << "AUTH refusals logged " << lines << " times in 1.5 s";
  }
  EXPECT_GE(calls_of(*admin, "auth"), 5) << "the node stopped trying";
  // The password works again: unfenced, registered, running its unit.
  ASSERT_FALSE(admin->cmd({"ACL", "SETUSER", "troupe", "resetpass", std::string(">") + kPassword}).is_error());
  ASSERT_TRUE(wait_until([&] { return a.rec->unfenced_count() == 1; }, 10s));
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1 && !a->is_fenced(); }, 10s));
  EXPECT_TRUE(a.rec->log_has("accepts this node's AUTH again"));
  EXPECT_FALSE(logged_a_secret(*a.rec));
}

}  // namespace
}  // namespace troupe::test
