// Bad input on the wire (SPEC X1): a raw socket sends a running transport
// something that is not the protocol. That connection, and only that one,
// is closed with a logged reason and a counter; the node goes on serving a
// well-behaved peer over the connection it already had.
//
// The fixture runs "a" and "b" (a dials b) plus, known to b, a node id
// "a0" that the raw sockets use when they need a valid HELLO, so that they
// never disturb a's connection.

#include <gtest/gtest.h>

#include <string>

#include "transport_test_support.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using testing::both_connected;
using testing::data;
using testing::eventually;
using testing::hello;
using testing::introduce;
using testing::Node;
using testing::raw_frame;
using testing::RawConn;
using testing::RawServer;
using testing::test_settings;
using tcp::FrameKind;

class TransportBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    TransportSettings sb = test_settings("b");
    sb.handshake_timeout = 1s;
    sb.accept_unknown_nodes = false;
    b_ = Node::start(sb);
    a_ = Node::start("a");
    ASSERT_TRUE(b_.t && a_.t);
    introduce(a_, b_);
    b_->set_peer("a0", "127.0.0.1", 9);  // never dialled: a0 < b, so b accepts from it
    ASSERT_TRUE(both_connected(a_, b_));
  }

  // Sends `bytes` on a fresh connection to b and expects b to close it for
  // `reason` (the counter field and the tag in the log line), and nothing else.
  void expect_closed_for(const std::string& bytes, std::uint64_t BadInputCounts::*reason, std::string_view tag,
                         bool then_eof = false) {
    auto raw = RawConn::connect(b_.port());
    raw->write(bytes);
    if (then_eof) raw->shutdown_send();
    ASSERT_TRUE(raw->wait_closed()) << "b kept the connection open";
    expect_closed_by_b(reason, tag);
    // b says nothing to a connection it has not accepted, and nothing but
    // its HELLO to one it had.
    const auto frames = raw->frames();
    EXPECT_LE(frames.size(), 1u);
    for (const auto& f : frames) {
      EXPECT_EQ(f.kind, FrameKind::hello);
      EXPECT_EQ(f.node_id, "b");
    }
  }

  void expect_closed_by_b(std::uint64_t BadInputCounts::*reason, std::string_view tag) {
    ASSERT_TRUE(eventually([&] { return b_->stats().closed_for_bad_input.*reason == 1; }))
        << "counter not set; log:\n" << b_.log->all();
    EXPECT_EQ(b_->stats().closed_for_bad_input.total(), 1u);
    EXPECT_TRUE(b_.log->wait_for("[" + std::string(tag) + "]")) << b_.log->all();
    EXPECT_TRUE(b_.log->contains("closed connection from ")) << b_.log->all();
    expect_a_and_b_still_talk();
  }

  // The well-behaved pair still exchanges frames both ways, over the
  // connection it had before: nothing of it was closed.
  void expect_a_and_b_still_talk() {
    const std::string ping = "after " + std::to_string(++round_);
    ASSERT_TRUE(a_->send("b", 1, ping).ok());
    ASSERT_TRUE(b_->send("a", 1, ping).ok());
    EXPECT_TRUE(b_.inbox->wait_payload(ping));
    EXPECT_TRUE(a_.inbox->wait_payload(ping));
    EXPECT_EQ(a_->stats().connections_closed, 0u);
    EXPECT_EQ(a_->stats().handshakes, 1u);
    EXPECT_EQ(a_.inbox->events(), (std::vector<std::string>{"b up"})) << "a:\n" << a_.log->all() << "b:\n" << b_.log->all();
  }

  Node b_;
  Node a_;
  int round_ = 0;
};

// proves: X1
TEST_F(TransportBadInput, GarbageBytesCloseThatConnectionOnly) {
  // What a stray HTTP client sends: "GET " read as a length is over 1 GB.
  expect_closed_for("GET / HTTP/1.1\r\nHost: b\r\n\r\n", &BadInputCounts::oversized, "oversized");
}

// proves: X1
TEST_F(TransportBadInput, AnOversizedLengthClosesTheConnectionBeforeItsBodyArrives) {
  expect_closed_for(testing::be32((16u << 20) + 1) + "\x01\x02", &BadInputCounts::oversized, "oversized");
}

// proves: X1
TEST_F(TransportBadInput, ALengthTooShortForVersionAndKindClosesTheConnection) {
  expect_closed_for(testing::be32(1) + "\x01", &BadInputCounts::undersized, "undersized");
}

// proves: X1
TEST_F(TransportBadInput, AnUnknownVersionClosesTheConnection) {
  expect_closed_for(raw_frame(6, 2, 2, std::string(4, '\0')), &BadInputCounts::bad_version, "bad_version");
}

// proves: X1
TEST_F(TransportBadInput, AnUnknownKindClosesTheConnection) {
  expect_closed_for(hello("a0") + raw_frame(2, 1, 9, ""), &BadInputCounts::unknown_kind, "unknown_kind");
}

// proves: X1
TEST_F(TransportBadInput, ADataFrameShorterThanItsHeaderClosesTheConnection) {
  expect_closed_for(hello("a0") + raw_frame(4, 1, 2, "ab"), &BadInputCounts::short_body, "short_body");
}

// proves: X1
TEST_F(TransportBadInput, APingWithABodyClosesTheConnection) {
  expect_closed_for(hello("a0") + raw_frame(4, 1, 3, "ab"), &BadInputCounts::bad_body, "bad_body");
}

// proves: X1
TEST_F(TransportBadInput, ATruncatedFrameFollowedByEndOfStreamClosesTheConnection) {
  const std::string frame = data(1, "twenty bytes of text");
  expect_closed_for(hello("a0") + frame.substr(0, frame.size() / 2), &BadInputCounts::truncated, "truncated",
                    /*then_eof=*/true);
  EXPECT_EQ(b_.inbox->frames().size(), 1u);  // only the fixture's own frame from a
}

// proves: X1
TEST_F(TransportBadInput, AFirstFrameThatIsNotAHelloClosesTheConnection) {
  expect_closed_for(data(1, "no introduction"), &BadInputCounts::missing_hello, "missing_hello");
  EXPECT_EQ(b_.inbox->count(), 1u);  // the DATA frame was not delivered
}

// proves: X1
TEST_F(TransportBadInput, ALargeFirstFrameThatIsNotAHelloIsRefusedByItsHeader) {
  // Only the header is sent: b must not wait for (or make room for) the body.
  expect_closed_for(raw_frame(8u << 20, 1, 2, ""), &BadInputCounts::missing_hello,
                    "missing_hello");
}

// proves: X1
TEST_F(TransportBadInput, ASecondHelloClosesTheConnection) {
  expect_closed_for(hello("a0") + hello("a0"), &BadInputCounts::second_hello, "second_hello");
}

// proves: X1
TEST_F(TransportBadInput, AHelloThatDoesNotComeInTimeClosesTheConnection) {
  auto raw = RawConn::connect(b_.port());
  ASSERT_TRUE(raw->wait_closed()) << "b kept a silent connection open";
  expect_closed_by_b(&BadInputCounts::handshake_timeout, "handshake_timeout");
  EXPECT_TRUE(b_.log->contains("no HELLO within 1000 ms")) << b_.log->all();
}

// proves: X1
TEST_F(TransportBadInput, AHelloClaimingTheReceiversOwnIdClosesTheConnection) {
  expect_closed_for(hello("b"), &BadInputCounts::own_node_id, "own_node_id");
}

// proves: X1
TEST_F(TransportBadInput, AHelloFromANodeThatShouldAcceptClosesTheConnection) {
  // "c" > "b": b dials c, never the other way round.
  b_->set_peer("c", "127.0.0.1", 9);
  expect_closed_for(hello("c"), &BadInputCounts::wrong_direction, "wrong_direction");
}

// proves: X1
TEST_F(TransportBadInput, AHelloWithAnInvalidNodeIdClosesTheConnection) {
  expect_closed_for(hello("a b"), &BadInputCounts::invalid_node_id, "invalid_node_id");
}

// proves: X1
TEST_F(TransportBadInput, AHelloWhoseIdLengthDisagreesWithItsBodyClosesTheConnection) {
  std::string body(8, '\0');
  body.push_back(9);
  body += "a0";
  expect_closed_for(raw_frame(static_cast<std::uint32_t>(2 + body.size()), 1, 1, body), &BadInputCounts::bad_body,
                    "bad_body");
}

// proves: X1
TEST_F(TransportBadInput, AHelloFromANodeOutsideTheAddressBookClosesTheConnection) {
  expect_closed_for(hello("a1"), &BadInputCounts::unknown_node, "unknown_node");
}

// proves: X1
TEST_F(TransportBadInput, ANodeThatAnswersADialWithAnotherIdIsClosedByTheDialer) {
  RawServer server;
  a_->set_peer("m", "127.0.0.1", server.port());
  auto conn = server.accept();
  ASSERT_TRUE(conn);
  conn->write(hello("x"));
  ASSERT_TRUE(conn->wait_closed());
  ASSERT_TRUE(eventually([&] { return a_->stats().closed_for_bad_input.unexpected_node == 1; }));
  EXPECT_TRUE(a_.log->wait_for("answered as 'x' [unexpected_node]")) << a_.log->all();
  a_->remove_peer("m");
  // a's own count of closes includes this one; b's side is untouched.
  const std::string ping = "after the impostor";
  ASSERT_TRUE(a_->send("b", 1, ping).ok());
  ASSERT_TRUE(b_->send("a", 1, ping).ok());
  EXPECT_TRUE(b_.inbox->wait_payload(ping));
  EXPECT_TRUE(a_.inbox->wait_payload(ping));
  EXPECT_EQ(b_->stats().connections_closed, 0u);
}

TEST_F(TransportBadInput, ANewConnectionFromAKnownNodeReplacesTheOldOne) {
  auto first = RawConn::connect(b_.port());
  first->write(hello("a0", 1));
  ASSERT_TRUE(eventually([&] { return b_->connected("a0"); }));
  auto second = RawConn::connect(b_.port());
  second->write(hello("a0", 2) + data(4, "from the second"));
  ASSERT_TRUE(first->wait_closed()) << "the old connection was kept";
  EXPECT_TRUE(b_.inbox->wait_payload("from the second"));
  EXPECT_TRUE(b_.log->wait_for("replaced by a new connection")) << b_.log->all();
  EXPECT_EQ(b_->stats().closed_for_bad_input.total(), 0u);
  EXPECT_EQ(b_->stats().peer_restarts, 1u);  // the incarnation changed
  EXPECT_FALSE(second->wait_closed(200ms));
  expect_a_and_b_still_talk();
}

TEST_F(TransportBadInput, ARawPeerThatSpeaksTheProtocolIsServedLikeAnyOther) {
  auto raw = RawConn::connect(b_.port());
  raw->write(hello("a0") + data(7, "hand made"));
  ASSERT_TRUE(b_.inbox->wait_payload("hand made"));
  ASSERT_TRUE(b_->send("a0", 8, "answer").ok());
  ASSERT_TRUE(raw->wait_frames(2));
  auto frames = raw->frames();
  EXPECT_EQ(frames[1].kind, FrameKind::data);
  EXPECT_EQ(frames[1].type, 8u);
  EXPECT_EQ(frames[1].payload, "answer");
  // A PING is answered with a PONG.
  std::string ping;
  tcp::append_ping(ping);
  raw->write(ping);
  ASSERT_TRUE(eventually([&] {
    raw->wait_frames(3, 10ms);
    return raw->count(FrameKind::pong) == 1;
  }));
  EXPECT_EQ(b_->stats().closed_for_bad_input.total(), 0u);
}

}  // namespace
}  // namespace troupe::cluster
