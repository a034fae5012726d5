// The entity frame header parser (cluster/detail/shard_header.hpp) on
// headers as regions write them and on headers cut short, out of range or
// without an id. Pure: no sockets, no actors.

#include "troupe/cluster/detail/shard_header.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "troupe/cluster/messages.hpp"

namespace troupe::cluster::detail {
namespace {

std::string header(std::uint32_t shard, std::uint8_t hops, const std::string& id, std::string_view body = {}) {
  ByteWriter w;
  w.u32(shard).u8(hops).str(id).u32(message_id("Deposit")).bytes().append(body);
  return w.take();
}

TEST(ShardHeader, AHeaderAsRegionsWriteItParsesToItsFieldsAndTheCommandsBytes) {
  const std::string frame = header(17, 2, "acct-42", std::string("\x64\0\0\0\0\0\0\0", 8));
  auto h = parse_shard_header(frame, 128, "node-2");
  ASSERT_TRUE(h.ok()) << h.error().message();
  EXPECT_EQ(h->shard, 17u);
  EXPECT_EQ(h->hops, 2u);
  EXPECT_EQ(h->id, "acct-42");
  EXPECT_EQ(h->msg_id, message_id("Deposit"));
  EXPECT_EQ(h->body, std::string_view(frame).substr(frame.size() - 8));
  auto empty = parse_shard_header(header(127, 0, "a"), 128, "node-2");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->body.empty());
}

TEST(ShardHeader, ACutShortOutOfRangeOrIdlessHeaderIsAProtocolErrorNamingTheNode) {
  const std::string good = header(5, 0, "acct-42");
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    auto h = parse_shard_header(std::string_view(good).substr(0, cut), 128, "node-2");
    ASSERT_FALSE(h.ok()) << "cut at " << cut;
    EXPECT_EQ(h.error().code(), ErrorCode::protocol_error);
    EXPECT_EQ(h.error().message(), "entity frame from node 'node-2' with a bad header");
  }
  EXPECT_FALSE(parse_shard_header(header(128, 0, "acct-42"), 128, "node-2").ok());
  EXPECT_TRUE(parse_shard_header(header(127, 0, "acct-42"), 128, "node-2").ok());
  EXPECT_FALSE(parse_shard_header(header(5, 0, ""), 128, "node-2").ok());
}

}  // namespace
}  // namespace troupe::cluster::detail
