// Inputs the cluster layer's fuzz targets (src/cluster/*_fuzz.cpp,
// src/cluster/redis/*_fuzz.cpp, scripts/fuzz) found mishandled, kept as
// tests so that each stays fixed, and what the parsers must go on reading
// when nodes of two versions share Redis. Pure parsers: no Redis, socket
// or thread.

#include <gtest/gtest.h>

#include <string>

#include "redis/redis_values.hpp"

namespace {

using troupe::ErrorCode;
using troupe::cluster::detail::RedisReply;

RedisReply text(std::string s) {
  RedisReply r;
  r.type = RedisReply::Type::string;
  r.str = std::move(s);
  return r;
}
RedisReply integer(long long v) {
  RedisReply r;
  r.type = RedisReply::Type::integer;
  r.integer = v;
  return r;
}
RedisReply array(std::vector<RedisReply> elements) {
  RedisReply r;
  r.type = RedisReply::Type::array;
  r.elements = std::move(elements);
  return r;
}

// One millisecond more than a Duration holds: age * 1'000'000 overflowed
// (undefined behaviour; in practice a negative age, so the entry counted
// as a live member with a heartbeat from the future).
constexpr long long kBeyondDuration = 9'223'372'036'855;

// proves: X1
TEST(ClusterFuzzRegressions, AHeartbeatAgeBeyondWhatADurationHoldsIsSkippedNotOverflowed) {
  RedisReply view = array({text("node-1"), integer(kBeyondDuration), text("1 ab 127.0.0.1 7101"),
                           text("node-2"), integer(-kBeyondDuration), text("1 cd 127.0.0.1 7102"),
                           text("node-3"), integer(250), text("1 ef 127.0.0.1 7103")});
  auto parsed = troupe::cluster::detail::parse_members(view, std::chrono::seconds(3));
  ASSERT_EQ(parsed.live.size(), 1u);
  EXPECT_EQ(parsed.live[0].id, "node-3");
  ASSERT_EQ(parsed.skipped.size(), 2u);
  EXPECT_NE(parsed.skipped[0].why.find("out of range"), std::string::npos) << parsed.skipped[0].why;
}

TEST(ClusterMemberView, AMemberInfoWithWordsALaterVersionAddsIsReadAndOneWithoutItsPortIsNot) {
  RedisReply view = array({text("node-1"), integer(10), text("1 ab 127.0.0.1 7101 2.0.0 role=worker"),
                           text("node-2"), integer(10), text("1 cd 127.0.0.1")});
  auto parsed = troupe::cluster::detail::parse_members(view, std::chrono::seconds(3));
  ASSERT_EQ(parsed.live.size(), 1u);
  EXPECT_EQ(parsed.live[0].id, "node-1");
  EXPECT_EQ(parsed.live[0].address.host, "127.0.0.1");
  EXPECT_EQ(parsed.live[0].address.port, 7101);
  EXPECT_EQ(parsed.live[0].app_version, "2.0.0") << "the fifth word is its app version";
  ASSERT_EQ(parsed.skipped.size(), 1u);
  EXPECT_EQ(parsed.skipped[0].id, "node-2");
  EXPECT_NE(parsed.skipped[0].why.find("<port>"), std::string::npos) << parsed.skipped[0].why;
}

// proves: X1
TEST(ClusterFuzzRegressions, AnAssignmentUpdatedBeyondWhatAWallTimeHoldsIsRefused) {
  auto assignment = [](long long updated) {
    return array({text("node-1"), integer(7), integer(updated), text("spec"), text(""), integer(0)});
  };
  auto ok = troupe::cluster::detail::parse_assignment(assignment(1'764'200'000'000), "g", "u");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->epoch, 7u);
  EXPECT_FALSE(troupe::cluster::detail::parse_assignment(assignment(kBeyondDuration), "g", "u").has_value());
  EXPECT_FALSE(troupe::cluster::detail::parse_assignment(assignment(-kBeyondDuration), "g", "u").has_value());
}

}  // namespace
