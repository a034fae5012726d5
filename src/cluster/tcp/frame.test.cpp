// The frame format and its decoder, without sockets: the bytes doc/wire.md
// documents, decoding across every split of the stream, and each way a
// stream is refused (SPEC X1).

#include "frame.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "transport_test_support.hpp"

namespace troupe::cluster {
namespace {

using tcp::Frame;
using tcp::FrameDecoder;
using tcp::FrameError;
using tcp::FrameKind;
using testing::raw_frame;
using Status = FrameDecoder::Status;

std::string bytes(std::initializer_list<int> b) {
  std::string out;
  for (int v : b) out.push_back(static_cast<char>(v));
  return out;
}

// Decodes everything in `d`, copying each frame out.
std::vector<testing::RawFrame> drain(FrameDecoder& d) {
  std::vector<testing::RawFrame> out;
  Frame f;
  while (d.next(f) == Status::frame)
    out.push_back({f.kind, std::string(f.node_id), f.incarnation, f.type, std::string(f.payload)});
  return out;
}

FrameError error_of(std::string_view stream, std::size_t max_frame = 1024) {
  FrameDecoder d(max_frame);
  d.feed(stream);
  Frame f;
  while (d.next(f) == Status::frame) {
  }
  return d.error();
}

TEST(Frame, DataFrameHasTheDocumentedBytes) {
  std::string out;
  append_data_frame(out, 7, "hi");
  EXPECT_EQ(out, bytes({0x00, 0x00, 0x00, 0x08, 0x01, 0x02, 0x00, 0x00, 0x00, 0x07, 'h', 'i'}));
  EXPECT_EQ(out.size(), data_frame_size(2));
}

TEST(Frame, HelloPingAndPongHaveTheDocumentedBytes) {
  std::string out;
  tcp::append_hello(out, 0x0102030405060708ull, "a");
  EXPECT_EQ(out, bytes({0x00, 0x00, 0x00, 0x0c, 0x01, 0x01, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x01, 'a'}));
  out.clear();
  tcp::append_ping(out);
  EXPECT_EQ(out, bytes({0x00, 0x00, 0x00, 0x02, 0x01, 0x03}));
  out.clear();
  tcp::append_pong(out);
  EXPECT_EQ(out, bytes({0x00, 0x00, 0x00, 0x02, 0x01, 0x04}));
}

TEST(FrameDecoder, DecodesEveryKindBackFromItsEncoding) {
  std::string stream;
  tcp::append_hello(stream, 0xfeedfacecafebeefull, "node-7");
  append_data_frame(stream, 0xdeadbeef, "payload");
  append_data_frame(stream, 0, "");
  tcp::append_ping(stream);
  tcp::append_pong(stream);
  FrameDecoder d(1024);
  d.feed(stream);
  auto frames = drain(d);
  ASSERT_EQ(frames.size(), 5u);
  EXPECT_EQ(frames[0].kind, FrameKind::hello);
  EXPECT_EQ(frames[0].incarnation, 0xfeedfacecafebeefull);
  EXPECT_EQ(frames[0].node_id, "node-7");
  EXPECT_EQ(frames[1].kind, FrameKind::data);
  EXPECT_EQ(frames[1].type, 0xdeadbeefu);
  EXPECT_EQ(frames[1].payload, "payload");
  EXPECT_EQ(frames[2].type, 0u);
  EXPECT_EQ(frames[2].payload, "");
  EXPECT_EQ(frames[3].kind, FrameKind::ping);
  EXPECT_EQ(frames[4].kind, FrameKind::pong);
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_EQ(d.error(), FrameError::none);
}

TEST(FrameDecoder, DecodesTheSameFramesWhateverTheStreamIsSplitInto) {
  std::string stream;
  tcp::append_hello(stream, 42, "b");
  for (int i = 0; i < 20; ++i) append_data_frame(stream, static_cast<std::uint32_t>(i), std::string(i * 7, 'x'));
  tcp::append_ping(stream);
  for (std::size_t chunk = 1; chunk <= stream.size(); ++chunk) {
    FrameDecoder d(1024, 64);
    std::vector<testing::RawFrame> frames;
    for (std::size_t at = 0; at < stream.size(); at += chunk) {
      d.feed(std::string_view(stream).substr(at, chunk));
      for (auto& f : drain(d)) frames.push_back(std::move(f));
    }
    ASSERT_EQ(frames.size(), 22u) << "chunk " << chunk;
    EXPECT_EQ(frames[0].node_id, "b");
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(frames[1 + i].type, static_cast<std::uint32_t>(i));
      EXPECT_EQ(frames[1 + i].payload, std::string(i * 7, 'x'));
    }
    EXPECT_EQ(frames[21].kind, FrameKind::ping);
    EXPECT_EQ(d.error(), FrameError::none);
  }
}

TEST(FrameDecoder, DecodesManyFramesFromOneReadWithoutGrowing) {
  std::string stream;
  for (int i = 0; i < 1000; ++i) append_data_frame(stream, 1, "0123456789abcdef0123456789abcdef");
  FrameDecoder d(1024, 64u << 10);
  const std::size_t capacity = d.capacity();
  auto room = d.prepare(stream.size());
  std::copy(stream.begin(), stream.end(), room.begin());
  d.commit(stream.size());
  EXPECT_EQ(drain(d).size(), 1000u);
  EXPECT_EQ(d.capacity(), capacity);
}

TEST(FrameDecoder, MakesRoomForAFrameLargerThanItsBufferAndGivesItBackAfter) {
  const std::string big(1 << 20, 'z');
  std::string stream;
  append_data_frame(stream, 3, big);
  FrameDecoder d(2u << 20, 4096);
  // A reader asks for a little room each time; the decoder offers enough
  // for the rest of the frame once its header is in.
  std::size_t at = 0;
  std::vector<testing::RawFrame> frames;
  while (at < stream.size()) {
    auto room = d.prepare(16);
    const std::size_t n = std::min(room.size(), stream.size() - at);
    std::copy_n(stream.data() + at, n, room.data());
    d.commit(n);
    at += n;
    for (auto& f : drain(d)) frames.push_back(std::move(f));
  }
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].payload, big);
  EXPECT_GE(d.capacity(), stream.size());
  d.prepare(16);
  EXPECT_EQ(d.capacity(), 4096u);
}

TEST(FrameDecoder, KnowsTheKindOfAFrameOnceItsHeaderIsIn) {
  FrameDecoder d(1024);
  EXPECT_EQ(d.pending_kind(), -1);
  d.feed(raw_frame(500, 1, 2, ""));
  EXPECT_EQ(d.pending_kind(), 2);
  Frame f;
  EXPECT_EQ(d.next(f), Status::need_more);
}

// proves: X1
TEST(FrameDecoder, RefusesALengthTooShortForVersionAndKind) {
  EXPECT_EQ(error_of(testing::be32(1) + "\x01"), FrameError::undersized);
  EXPECT_EQ(error_of(testing::be32(0)), FrameError::undersized);
}

// proves: X1
TEST(FrameDecoder, RefusesALengthOverTheLimitFromTheLengthFieldAlone) {
  EXPECT_EQ(error_of(testing::be32(1025)), FrameError::oversized);
  EXPECT_EQ(error_of(testing::be32(0xffffffffu)), FrameError::oversized);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\n"), FrameError::oversized);
  // At the limit is fine.
  FrameDecoder d(1024);
  d.feed(raw_frame(1024, 1, 2, std::string(1022, 'x')));
  Frame f;
  EXPECT_EQ(d.next(f), Status::frame);
}

// proves: X1
TEST(FrameDecoder, RefusesAnUnknownVersionBeforeTheBodyArrives) {
  EXPECT_EQ(error_of(testing::be32(100) + "\x02"), FrameError::bad_version);
  EXPECT_EQ(error_of(raw_frame(6, 0, 2, std::string(4, '\0'))), FrameError::bad_version);
}

// proves: X1
TEST(FrameDecoder, RefusesAnUnknownKindBeforeTheBodyArrives) {
  EXPECT_EQ(error_of(raw_frame(100, 1, 0, "")), FrameError::unknown_kind);
  EXPECT_EQ(error_of(raw_frame(100, 1, 5, "")), FrameError::unknown_kind);
  EXPECT_EQ(error_of(raw_frame(100, 1, 255, "")), FrameError::unknown_kind);
}

// proves: X1
TEST(FrameDecoder, RefusesADataFrameShorterThanItsMessageType) {
  EXPECT_EQ(error_of(raw_frame(2, 1, 2, "")), FrameError::short_body);
  EXPECT_EQ(error_of(raw_frame(5, 1, 2, "abc")), FrameError::short_body);
}

// proves: X1
TEST(FrameDecoder, RefusesAHelloShorterThanItsFixedPartOrLongerThanAnyNodeId) {
  EXPECT_EQ(error_of(raw_frame(2 + 9, 1, 1, std::string(9, '\0'))), FrameError::short_body);
  EXPECT_EQ(error_of(raw_frame(2 + 9 + 65, 1, 1, "")), FrameError::bad_body);
}

// proves: X1
TEST(FrameDecoder, RefusesAHelloWhoseIdLengthDisagreesWithItsBody) {
  std::string body(8, '\0');
  body.push_back(5);  // says 5 bytes of id, carries 3
  body += "abc";
  EXPECT_EQ(error_of(raw_frame(static_cast<std::uint32_t>(2 + body.size()), 1, 1, body)), FrameError::bad_body);
}

// proves: X1
TEST(FrameDecoder, RefusesAPingOrPongWithABody) {
  EXPECT_EQ(error_of(raw_frame(3, 1, 3, "x")), FrameError::bad_body);
  EXPECT_EQ(error_of(raw_frame(3, 1, 4, "x")), FrameError::bad_body);
}

// proves: X1
TEST(FrameDecoder, AnErrorIsFinalAndTheFramesBeforeItAreKept) {
  std::string stream;
  append_data_frame(stream, 1, "good");
  stream += raw_frame(6, 9, 2, std::string(4, '\0'));
  append_data_frame(stream, 2, "never");
  FrameDecoder d(1024);
  d.feed(stream);
  Frame f;
  ASSERT_EQ(d.next(f), Status::frame);
  EXPECT_EQ(f.payload, "good");
  EXPECT_EQ(d.next(f), Status::error);
  EXPECT_EQ(d.next(f), Status::error);
  EXPECT_EQ(d.error(), FrameError::bad_version);
}

// proves: X1
TEST(FrameDecoder, ErrorMessagesNameTheOffendingValue) {
  FrameDecoder d(1024);
  d.feed(testing::be32(5000));
  Frame f;
  ASSERT_EQ(d.next(f), Status::error);
  EXPECT_NE(d.error_message().find("5000"), std::string::npos) << d.error_message();
  EXPECT_NE(d.error_message().find("1024"), std::string::npos) << d.error_message();

  FrameDecoder k(1024);
  k.feed(raw_frame(10, 1, 77, ""));
  ASSERT_EQ(k.next(f), Status::error);
  EXPECT_NE(k.error_message().find("77"), std::string::npos) << k.error_message();
}

// proves: X1
TEST(FrameDecoder, CountsEncodedDataFramesAndRefusesAnythingElse) {
  std::string frames;
  append_data_frame(frames, 1, "a");
  append_data_frame(frames, 2, std::string(100, 'b'));
  std::size_t n = 0;
  std::string why;
  ASSERT_TRUE(tcp::count_data_frames(frames, 1024, n, why)) << why;
  EXPECT_EQ(n, 2u);
  EXPECT_FALSE(tcp::count_data_frames(frames.substr(0, frames.size() - 1), 1024, n, why));
  EXPECT_FALSE(tcp::count_data_frames(frames, 50, n, why));
  std::string ping;
  tcp::append_ping(ping);
  EXPECT_FALSE(tcp::count_data_frames(ping + std::string(10, '\0'), 1024, n, why));
  ASSERT_TRUE(tcp::count_data_frames("", 1024, n, why));
  EXPECT_EQ(n, 0u);
}

}  // namespace
}  // namespace troupe::cluster
