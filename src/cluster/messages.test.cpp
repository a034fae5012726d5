#include "troupe/cluster/messages.hpp"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace troupe::cluster {
namespace {

struct Add {
  long n = 0;
};
struct Get {
  ReplyTo<long> reply_to;
};
struct Ping {
  ReplyTo<void> reply_to;
};
using CounterMsg = std::variant<Add, Get, Ping>;

MessageCodecs<CounterMsg> counter_codecs() {
  MessageCodecs<CounterMsg> c;
  EXPECT_TRUE(c.add<Add>(
                   "Add", [](const Add& a, ByteWriter& w) { w.i64(a.n); },
                   [](ByteReader& r) -> Result<Add> {
                     Add a;
                     a.n = r.i64();
                     return r.finish(a);
                   })
                  .ok());
  EXPECT_TRUE(c.add<Get>(
                   "Get", [](const Get&, ByteWriter&) {}, [](ByteReader& r) -> Result<Get> { return r.finish(Get{}); },
                   [](const long& v, ByteWriter& w) { w.i64(v); },
                   [](ByteReader& r) -> Result<long> {
                     long v = r.i64();
                     return r.finish(v);
                   })
                  .ok());
  EXPECT_TRUE(c.add<Ping>(
                   "Ping", [](const Ping&, ByteWriter&) {}, [](ByteReader& r) -> Result<Ping> { return r.finish(Ping{}); })
                  .ok());
  return c;
}

TEST(MessageCodecs, AMessageRoundTripsThroughItsIdAndBytes) {
  auto c = counter_codecs();
  CounterMsg m = Add{42};
  ByteWriter w;
  std::optional<PendingReply> reply;
  auto id = c.encode(m, w, reply);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id.value(), message_id("Add"));
  EXPECT_FALSE(reply);
  auto back = c.decode(id.value(), w.bytes(), nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<Add>(back.value()).n, 42);
  EXPECT_EQ(c.name_of(id.value()), "Add");
}

TEST(MessageCodecs, ARequestsAnswerTravelsBackToTheAskersReplyTarget) {
  auto c = counter_codecs();
  // The asking side: the request's reply target leaves with `reply`.
  Promise<long> asker;
  Future<long> answer = asker.future();
  CounterMsg m = Get{std::move(asker).into_reply_to()};
  ByteWriter w;
  std::optional<PendingReply> reply;
  auto id = c.encode(m, w, reply);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(reply);
  // The answering side: decoding installs a reply target whose answer
  // arrives, encoded, in the sink.
  std::optional<ReplyBytes> sent;
  ReplySink sink = [&](ReplyBytes b) { sent = std::move(b); };
  auto req = c.decode(id.value(), w.bytes(), &sink);
  ASSERT_TRUE(req.ok());
  std::get<Get>(req.value()).reply_to.reply(7);
  ASSERT_TRUE(sent && sent->ok());
  // Back on the asking side.
  (*reply)(Result<std::string_view>(sent->value()));
  auto got = answer.get();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value(), 7);
}

TEST(MessageCodecs, AnErrorAnswerAndADroppedRequestReachTheAskerAsErrors) {
  auto c = counter_codecs();
  std::optional<ReplyBytes> sent;
  ReplySink sink = [&](ReplyBytes b) { sent = std::move(b); };
  ByteWriter w;
  auto req = c.decode(message_id("Get"), w.bytes(), &sink);
  ASSERT_TRUE(req.ok());
  std::get<Get>(req.value()).reply_to.fail(Error(ErrorCode::invalid_argument, "no such counter"));
  ASSERT_TRUE(sent && !sent->ok());
  EXPECT_EQ(sent->error().code(), ErrorCode::invalid_argument);

  sent.reset();
  ReplySink sink2 = [&](ReplyBytes b) { sent = std::move(b); };
  { auto dropped = c.decode(message_id("Ping"), w.bytes(), &sink2); }
  ASSERT_TRUE(sent && !sent->ok());
  EXPECT_EQ(sent->error().code(), ErrorCode::no_reply);
}

// proves: X1
TEST(MessageCodecs, UnknownIdsAndBadBytesAreProtocolErrorsNamingTheMessage) {
  auto c = counter_codecs();
  auto unknown = c.decode(12345, "", nullptr);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code(), ErrorCode::protocol_error);
  auto shorter = c.decode(message_id("Add"), "abc", nullptr);
  ASSERT_FALSE(shorter.ok());
  EXPECT_EQ(shorter.error().code(), ErrorCode::protocol_error);
  EXPECT_NE(shorter.error().message().find("'Add'"), std::string::npos);
  // A reply whose bytes do not decode fails the asker's future.
  Promise<long> asker;
  Future<long> answer = asker.future();
  CounterMsg m = Get{std::move(asker).into_reply_to()};
  ByteWriter w;
  std::optional<PendingReply> reply;
  ASSERT_TRUE(c.encode(m, w, reply).ok());
  (*reply)(Result<std::string_view>(std::string_view("x")));
  auto got = answer.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code(), ErrorCode::protocol_error);
}

TEST(MessageCodecs, NamesWithoutCodecsOrWithCollidingIdsAreRefused) {
  MessageCodecs<CounterMsg> c;
  auto empty = c.add<Add>(
      "", [](const Add&, ByteWriter&) {}, [](ByteReader&) -> Result<Add> { return Add{}; });
  EXPECT_FALSE(empty.ok());
  static_assert(message_id("m763399") == message_id("m1109514"));
  auto enc = [](const Add&, ByteWriter&) {};
  auto dec = [](ByteReader&) -> Result<Add> { return Add{}; };
  ASSERT_TRUE(c.add<Add>("m763399", enc, dec).ok());
  auto clash = c.add<Ping>(
      "m1109514", [](const Ping&, ByteWriter&) {}, [](ByteReader&) -> Result<Ping> { return Ping{}; });
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.error().message().find("same wire id"), std::string::npos);
  CounterMsg m = Get{};
  ByteWriter w;
  std::optional<PendingReply> reply;
  auto none = c.encode(m, w, reply);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster
