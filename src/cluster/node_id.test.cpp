#include "troupe/cluster/node_id.hpp"

#include <gtest/gtest.h>

#include <string>

namespace troupe::cluster {
namespace {

TEST(NodeId, AcceptsLettersDigitsDotsDashesAndUnderscores) {
  EXPECT_TRUE(validate_node_id("node-1").ok());
  EXPECT_TRUE(validate_node_id("a.b_C-9").ok());
  EXPECT_TRUE(validate_node_id(std::string(max_node_id_length, 'x')).ok());
}

TEST(NodeId, RefusesEmptyTooLongAndOddCharactersWithAReason) {
  auto empty = validate_node_id("");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code(), ErrorCode::invalid_argument);
  auto longer = validate_node_id(std::string(max_node_id_length + 1, 'x'));
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.error().message().find("65 characters"), std::string::npos);
  for (const std::string& bad : {std::string("a b"), std::string("a{b}"), std::string("a:b"), std::string("n\n"), std::string("a\0b", 3)}) {
    auto r = validate_node_id(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("outside"), std::string::npos);
  }
}

}  // namespace
}  // namespace troupe::cluster
