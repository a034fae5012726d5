// A chunked body's framing followed ahead of Beast: what it accepts, what
// it refuses and where, fed whole and one byte at a time.

#include "chunk_framing.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>

namespace troupe::http::detail {
namespace {

struct Looked {
  std::size_t body_bytes = 0;  // how many of the bytes belong to the body
  std::optional<ChunkFraming::Bad> bad;
  bool done = false;
};

// Feeds `bytes` whole and byte by byte; the two must agree.
Looked look(std::string_view bytes, std::uint64_t max_body = 1024, std::size_t max_trailer = 256) {
  ChunkFraming whole_framing(max_body, max_trailer);
  Looked whole;
  whole.body_bytes = whole_framing.look(bytes, whole.bad);
  whole.done = whole_framing.done();

  ChunkFraming split_framing(max_body, max_trailer);
  Looked split;
  for (std::size_t i = 0; i < bytes.size() && !split.bad && !split_framing.done(); ++i)
    split.body_bytes += split_framing.look(bytes.substr(i, 1), split.bad);
  split.done = split_framing.done();

  EXPECT_EQ(split.body_bytes, whole.body_bytes) << bytes;
  EXPECT_EQ(split.done, whole.done) << bytes;
  EXPECT_EQ(split.bad.has_value(), whole.bad.has_value()) << bytes;
  if (split.bad && whole.bad) {
    EXPECT_EQ(split.bad->status, whole.bad->status) << bytes;
  }
  return whole;
}

TEST(ChunkFraming, EndsAtTheEmptyLineAfterTheLastChunkAndLeavesWhatFollows) {
  const std::string body = "4\r\nabcd\r\n3;name=value;flag\r\nxyz\r\n0\r\nX-Sum: 7\r\n\r\n";
  const Looked r = look(body + "GET / HTTP/1.1\r\n");
  EXPECT_FALSE(r.bad);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.body_bytes, body.size());
}

TEST(ChunkFraming, AcceptsAQuotedExtensionValueWithEscapes) {
  const Looked r = look("3;a=\"x y\\\"z\";b = c\r\nabc\r\n0\r\n\r\n");
  EXPECT_FALSE(r.bad) << r.bad->reason;
  EXPECT_TRUE(r.done);
}

TEST(ChunkFraming, RefusesAQuotedExtensionValueThatRunsPastItsLine) {
  const Looked r = look("5;ext=\"\r\nabcd\"\r\n0\r\n\r\n");
  ASSERT_TRUE(r.bad);
  EXPECT_EQ(r.bad->status, 400);
  EXPECT_EQ(r.body_bytes, 8u) << "refused at the line's LF, before its data";
}

TEST(ChunkFraming, RefusesMalformedSizesLineEndsAndData) {
  for (const char* bad : {"\r\n", "x\r\n", "4 \r\nabcd\r\n", "4;\r\nabcd\r\n", "4\nabcd\r\n", "4\r\nabcde\r\n",
                          "4\r\nabcd\n", "4\r\nabcd\r\n0\r\nX: y\n", "11111111111111111\r\n"}) {
    const Looked r = look(bad);
    ASSERT_TRUE(r.bad) << bad;
    EXPECT_EQ(r.bad->status, 400) << bad;
    EXPECT_FALSE(r.bad->reason.empty());
  }
}

TEST(ChunkFraming, RefusesABodyOverItsLimitAtTheChunkSizeThatPassesIt) {
  Looked r = look("400\r\n", 1024);
  EXPECT_FALSE(r.bad) << "exactly the limit";
  r = look("3ff\r\n", 1024);
  EXPECT_FALSE(r.bad);
  r = look("200\r\n" + std::string(0x200, 'a') + "\r\n201\r\n", 1024);
  ASSERT_TRUE(r.bad);
  EXPECT_EQ(r.bad->status, 413);
}

TEST(ChunkFraming, RefusesATrailerSectionOverItsLimit) {
  const Looked r = look("0\r\nX-Long: " + std::string(300, 'a') + "\r\n\r\n", 1024, 256);
  ASSERT_TRUE(r.bad);
  EXPECT_EQ(r.bad->status, 431);
}

}  // namespace
}  // namespace troupe::http::detail
