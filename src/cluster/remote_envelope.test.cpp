// The remoting envelope parser (remote_envelope.hpp) on frames as senders
// write them (doc/wire.md, "Remoting inside DATA frames") and on frames cut
// short or of no known kind. Pure: no sockets, no actors.

#include "remote_envelope.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::cluster::detail {
namespace {

std::uint32_t type_of(RemoteKind k) { return static_cast<std::uint32_t>(k); }

// proves: X1
TEST(RemoteEnvelope, EveryKindAsSendersWriteItParsesToItsFields) {
  ByteWriter tell;
  tell.str("lock/accounts").u32(0xa1b2c3d4).bytes().append("body");
  auto t = parse_envelope(type_of(RemoteKind::actor_tell), tell.bytes());
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->kind, RemoteKind::actor_tell);
  EXPECT_EQ(t->name, "lock/accounts");
  ASSERT_TRUE(t->msg_id.has_value());
  EXPECT_EQ(*t->msg_id, 0xa1b2c3d4u);
  EXPECT_EQ(t->body, "body");

  ByteWriter ask;
  ask.u64(42).str("jobs/mail").u32(7);
  auto a = parse_envelope(type_of(RemoteKind::actor_ask), ask.bytes());
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->req, 42u);
  EXPECT_EQ(a->name, "jobs/mail");
  ASSERT_TRUE(a->msg_id.has_value());
  EXPECT_EQ(*a->msg_id, 7u);
  EXPECT_TRUE(a->body.empty());

  // An entity frame: the region reads what follows its name.
  ByteWriter entity;
  entity.u64(9).str("region/account").u32(17).u8(0).str("acct-42");
  auto en = parse_envelope(type_of(RemoteKind::entity_ask), entity.bytes());
  ASSERT_TRUE(en.ok()) << en.error().message();
  EXPECT_EQ(en->req, 9u);
  EXPECT_EQ(en->name, "region/account");
  EXPECT_FALSE(en->msg_id.has_value());
  EXPECT_EQ(en->body, std::string_view(entity.bytes()).substr(8 + 4 + 14));

  ByteWriter answer;
  answer.u64(42).u8(0).bytes().append("yes");
  auto r = parse_envelope(type_of(RemoteKind::reply), answer.bytes());
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->req, 42u);
  EXPECT_FALSE(r->failed);
  EXPECT_EQ(r->body, "yes");

  ByteWriter failure;
  failure.u64(43).u8(1).u32(static_cast<std::uint32_t>(ErrorCode::dead_letter)).str("nothing there");
  auto f = parse_envelope(type_of(RemoteKind::reply), failure.bytes());
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->req, 43u);
  EXPECT_TRUE(f->failed);
  EXPECT_EQ(f->code, ErrorCode::dead_letter);
  EXPECT_EQ(f->message, "nothing there");

  auto c = parse_envelope(type_of(RemoteKind::shard_control), "leaving");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->body, "leaving");
}

// proves: X1
TEST(RemoteEnvelope, FramesCutShortOrOfNoKnownKindAreProtocolErrorsSayingWhy) {
  auto refused = [](RemoteKind kind, std::string_view payload, std::string_view why) {
    auto e = parse_envelope(type_of(kind), payload);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().code(), ErrorCode::protocol_error);
    EXPECT_EQ(e.error().message(), why);
  };
  ByteWriter name_cut;
  name_cut.u32(20).bytes().append("lock/");
  refused(RemoteKind::actor_tell, name_cut.bytes(), "frame ends inside its header");
  refused(RemoteKind::entity_tell, name_cut.bytes(), "frame ends inside its header");
  refused(RemoteKind::actor_ask, "1234567", "frame ends inside its header");
  ByteWriter ask_cut;
  ask_cut.u64(77).bytes().append(name_cut.bytes());
  refused(RemoteKind::entity_ask, ask_cut.bytes(), "frame ends inside its header");
  // The ask is answered with the error at the request id it does carry.
  EXPECT_EQ(ask_request_id(ask_cut.bytes()), 77u);
  EXPECT_EQ(ask_request_id("1234567"), 0u);

  refused(RemoteKind::reply, "", "malformed reply");
  ByteWriter bad_status;
  bad_status.u64(1).u8(2);
  refused(RemoteKind::reply, bad_status.bytes(), "malformed reply");
  ByteWriter error_cut;
  error_cut.u64(1).u8(1).u32(3).u32(50).bytes().append("short");
  refused(RemoteKind::reply, error_cut.bytes(), "malformed error reply");

  refused(static_cast<RemoteKind>(0), "anything", "frame of unknown kind 0");
  refused(static_cast<RemoteKind>(9), "", "frame of unknown kind 9");
}

// An actor frame that ends inside its message id still names its inbox, so
// that a name nothing is published under is answered dead_letter before the
// id is missed.
// proves: X1
TEST(RemoteEnvelope, AnActorFrameEndingInsideItsMessageIdParsesWithoutOne) {
  ByteWriter w;
  w.u64(5).str("jobs/mail").u8(1).u8(2);
  auto e = parse_envelope(type_of(RemoteKind::actor_ask), w.bytes());
  ASSERT_TRUE(e.ok()) << e.error().message();
  EXPECT_EQ(e->req, 5u);
  EXPECT_EQ(e->name, "jobs/mail");
  EXPECT_FALSE(e->msg_id.has_value());
  EXPECT_TRUE(e->body.empty());
}

// A tell or ask sent under a trace carries it first; taken off, what is
// left parses as the untraced frame would (doc/wire.md, "Traced frames").
// proves: X4, X1
TEST(RemoteEnvelope, ATracedFrameGivesItsTraceAndThenParsesAsTheUntracedOne) {
  auto ctx = TraceContext::generate();
  ByteWriter tell;
  tell.str("echo").u32(7).bytes().append("body");
  std::string traced;
  put_trace(traced, ctx);
  EXPECT_EQ(traced.size(), kTraceBytes);
  traced += tell.bytes();

  std::uint32_t type = type_of(RemoteKind::actor_tell) | kTracedKind;
  std::string_view payload = traced;
  auto t = take_trace(type, payload);
  ASSERT_TRUE(t.ok()) << t.error().message();
  ASSERT_TRUE(t->has_value());
  EXPECT_EQ(**t, ctx);
  EXPECT_EQ(type, type_of(RemoteKind::actor_tell));
  EXPECT_EQ(payload, tell.bytes());
  auto e = parse_envelope(type, payload);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->name, "echo");
  EXPECT_EQ(e->body, "body");

  // Untraced frames pass unchanged.
  type = type_of(RemoteKind::reply);
  payload = "anything";
  auto none = take_trace(type, payload);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(payload, "anything");

  // An all-zero trace id is no trace; the frame is still read.
  std::string zero(kTraceBytes, '\0');
  zero += tell.bytes();
  type = type_of(RemoteKind::entity_tell) | kTracedKind;
  payload = zero;
  auto z = take_trace(type, payload);
  ASSERT_TRUE(z.ok());
  EXPECT_FALSE(z->has_value());
  EXPECT_EQ(payload, tell.bytes());
}

// proves: X1
TEST(RemoteEnvelope, ATraceOnAReplyOrCutShortIsAProtocolError) {
  auto refused = [](std::uint32_t type, std::string_view payload, std::string_view why) {
    auto t = take_trace(type, payload);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code(), ErrorCode::protocol_error);
    EXPECT_EQ(t.error().message(), why);
  };
  refused(type_of(RemoteKind::reply) | kTracedKind, std::string(40, 'x'), "a trace on a frame of kind 3");
  refused(type_of(RemoteKind::shard_control) | kTracedKind, std::string(40, 'x'), "a trace on a frame of kind 6");
  refused(type_of(RemoteKind::actor_ask) | kTracedKind, std::string(24, 'x'), "frame ends inside its trace context");
  refused(kTracedKind, std::string(40, 'x'), "a trace on a frame of kind 0");
}

}  // namespace
}  // namespace troupe::cluster::detail
