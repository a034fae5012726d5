// The Protobuf codecs: manifests from the messages, round trips, the
// upcasting chains from older rows, and what a bad row or message gives.

#include "troupe/protobuf/codecs.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <variant>

#include "account_test_codecs.hpp"
#include "test_required.pb.h"
#include "troupe/protobuf/messages.hpp"

namespace troupe::test {
namespace {

bool has(const Error& e, std::string_view part) { return e.message().find(part) != std::string::npos; }

TEST(ProtobufCodecs, TheManifestIsTheMessagesFullNameAndItsVersionOption) {
  auto c = account_codecs();
  auto d = c.encode(Deposit{5, "x"});
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->type, "troupe.testpb.Deposited");
  EXPECT_EQ(d->version, 3u);
  auto t = c.encode(Transfer{5, "bob"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->type, "troupe.testpb.Transferred");
  EXPECT_EQ(t->version, 2u);
  pb::Withdrawn w;
  w.set_cents(7);
  auto wd = c.encode(w);
  ASSERT_TRUE(wd.ok());
  EXPECT_EQ(wd->type, "troupe.testpb.Withdrawn");
  EXPECT_EQ(wd->version, 1u);  // no option
  // The bytes are the message's own encoding: any Protobuf reader reads them.
  pb::Deposited parsed;
  ASSERT_TRUE(parsed.ParseFromString(d->payload));
  EXPECT_EQ(parsed.amount().units(), 5);
  EXPECT_EQ(parsed.memo(), "x");
}

TEST(ProtobufCodecs, EveryEventRoundTripsWhetherConvertedOrItselfTheMessage) {
  auto c = account_codecs();
  pb::Withdrawn w;
  w.set_cents(42);
  for (const AccountEvent& e :
       {AccountEvent(Deposit{100, "gift"}), AccountEvent(Transfer{30, "bob"}), AccountEvent(w)}) {
    auto enc = c.encode(e);
    ASSERT_TRUE(enc.ok());
    auto back = c.decode(enc->type, enc->version, enc->payload);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    ASSERT_EQ(back->index(), e.index());
  }
  auto back = c.decode("troupe.testpb.Deposited", 3, c.encode(Deposit{100, "gift"})->payload);
  EXPECT_EQ(std::get<Deposit>(*back).cents, 100);
  EXPECT_EQ(std::get<Deposit>(*back).memo, "gift");
  auto wb = c.decode("troupe.testpb.Withdrawn", 1, w.SerializeAsString());
  EXPECT_EQ(std::get<pb::Withdrawn>(*wb).cents(), 42);
}

// proves: X1
TEST(ProtobufCodecs, AnUnknownTypeNameBytesThatDoNotParseAndARefusedMessageAreCorruptRecords) {
  auto c = account_codecs();
  auto unknown = c.decode("troupe.testpb.Refunded", 1, "");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(has(unknown.error(), "unknown event manifest 'troupe.testpb.Refunded' v1"))
      << unknown.error().message();

  // Field 1, length 5, but two bytes follow.
  auto torn = c.decode("troupe.testpb.Deposited", 3,
                       std::string("\x0a\x05"
                                   "ab",
                                   4));
  ASSERT_FALSE(torn.ok());
  EXPECT_EQ(torn.error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(has(torn.error(), "'troupe.testpb.Deposited' v3")) << torn.error().message();
  EXPECT_TRUE(has(torn.error(), "4 byte(s) do not parse as troupe.testpb.Deposited"))
      << torn.error().message();

  pb::Deposited usd;
  usd.mutable_amount()->set_units(5);
  usd.mutable_amount()->set_currency("USD");
  auto refused = c.decode("troupe.testpb.Deposited", 3, usd.SerializeAsString());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(has(refused.error(), "currency 'USD' is not EUR")) << refused.error().message();
}

TEST(ProtobufCodecs, OlderRowsAreUpcastStepByStepToTodaysMessage) {
  auto c = account_codecs();
  // ByteWriter v1 -> ByteWriter v2 -> Protobuf v3.
  auto v1 = c.decode("Deposited", 1, deposited_v1(500));
  ASSERT_TRUE(v1.ok()) << v1.error().to_string();
  EXPECT_EQ(std::get<Deposit>(*v1).cents, 500);
  EXPECT_EQ(std::get<Deposit>(*v1).memo, "");
  // ByteWriter v2 -> Protobuf v3.
  auto v2 = c.decode("Deposited", 2, deposited_v2(250, "gift"));
  ASSERT_TRUE(v2.ok()) << v2.error().to_string();
  EXPECT_EQ(std::get<Deposit>(*v2).cents, 250);
  EXPECT_EQ(std::get<Deposit>(*v2).memo, "gift");
  // Protobuf v1 (another message shape under the same name) -> Protobuf v2.
  auto t1 = c.decode("troupe.testpb.Transferred", 1, transferred_v1(200, "bob"));
  ASSERT_TRUE(t1.ok()) << t1.error().to_string();
  EXPECT_EQ(std::get<Transfer>(*t1).cents, 200);
  EXPECT_EQ(std::get<Transfer>(*t1).to, "bob");
  // Without its step, the old shape would not read as today's message.
  auto raw = EventCodecs<AccountEvent>();
  add_protobuf<Transfer>(raw, transfer_to_pb, transfer_from_pb);
  EXPECT_FALSE(raw.decode("troupe.testpb.Transferred", 1, transferred_v1(200, "bob")).ok());
}

// proves: X1
TEST(ProtobufCodecs, AnUpcasterThatFailsOrThrowsIsACorruptRecordNamingTheTypeAndVersions) {
  auto c = account_codecs();
  auto short_v1 = c.decode("Deposited", 1, "abc");
  ASSERT_FALSE(short_v1.ok());
  EXPECT_EQ(short_v1.error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(has(short_v1.error(), "cannot upcast 'Deposited' v1 to 'Deposited' v2: bytes end before"))
      << short_v1.error().message();
  // The second step of the chain fails: it is the one named.
  auto trailing = c.decode("Deposited", 1, deposited_v1(5) + "!");
  ASSERT_FALSE(trailing.ok());
  EXPECT_TRUE(
      has(trailing.error(), "cannot upcast 'Deposited' v1 to 'Deposited' v2: 1 unexpected trailing byte"))
      << trailing.error().message();
  auto bad_v2 = c.decode("Deposited", 2, deposited_v1(5));
  ASSERT_FALSE(bad_v2.ok());
  EXPECT_TRUE(has(bad_v2.error(), "cannot upcast 'Deposited' v2 to 'troupe.testpb.Deposited' v3"))
      << bad_v2.error().message();

  c.upcast("Deposited", 1, [](std::string_view) -> Result<std::string> { throw std::runtime_error("boom"); });
  auto threw = c.decode("Deposited", 1, deposited_v1(5));
  ASSERT_FALSE(threw.ok());
  EXPECT_EQ(threw.error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(has(threw.error(), "cannot upcast 'Deposited' v1 to 'Deposited' v2: the upcaster threw: boom"))
      << threw.error().message();

  c.upcast("Deposited", UINT32_MAX, [](std::string_view b) -> Result<std::string> { return std::string(b); });
  auto last = c.decode("Deposited", UINT32_MAX, "");
  ASSERT_FALSE(last.ok());
  EXPECT_TRUE(has(last.error(), "no version follows it")) << last.error().message();
}

TEST(ProtobufCodecs, AStateCodecStoresTheSnapshotMessageUnderItsManifest) {
  auto codec = account_snapshots();
  EXPECT_EQ(codec.type, "troupe.testpb.AccountSnapshot");
  EXPECT_EQ(codec.version, 2u);
  ByteWriter w;
  codec.encode(AccountState{-20, 3}, w);
  ByteReader r(w.bytes());
  auto back = codec.decode(codec.version, r);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->balance, -20);
  EXPECT_EQ(back->deposits, 3u);
  ByteReader bad(std::string_view("\x08", 1));  // a varint with no byte after its tag
  auto broken = codec.decode(codec.version, bad);
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().code(), ErrorCode::corrupt_record);

  auto same = protobuf_state_codec<pb::AccountSnapshot>();
  EXPECT_EQ(same.type, "troupe.testpb.AccountSnapshot");
}

struct GetBalance {
  std::string currency;
  ReplyTo<std::int64_t> reply_to;
};
using AccountMsg = std::variant<GetBalance, pb::Poke>;

cluster::MessageCodecs<AccountMsg> account_messages() {
  cluster::MessageCodecs<AccountMsg> c;
  auto ok = add_protobuf<GetBalance>(
      c,
      [](const GetBalance& g) {
        pb::GetBalance m;
        m.set_currency(g.currency);
        return m;
      },
      [](const pb::GetBalance& m) -> Result<GetBalance> {
        if (m.currency().empty()) return Error(ErrorCode::invalid_argument, "no currency");
        return GetBalance{m.currency(), {}};
      },
      [](const std::int64_t& cents) {
        pb::Balance m;
        m.set_cents(cents);
        return m;
      },
      [](const pb::Balance& m) { return m.cents(); }, {.idempotent = true});
  EXPECT_TRUE(ok.ok());
  EXPECT_TRUE(add_protobuf<pb::Poke>(c).ok());
  return c;
}

TEST(ProtobufMessageCodecs, ARequestAndItsAnswerCrossTheWireAsTheirMessages) {
  auto c = account_messages();
  Promise<std::int64_t> asker;
  Future<std::int64_t> answer = asker.future();
  AccountMsg m = GetBalance{"EUR", std::move(asker).into_reply_to()};
  EXPECT_TRUE(c.idempotent(m));
  ByteWriter w;
  std::optional<cluster::PendingReply> reply;
  auto id = c.encode(m, w, reply);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, cluster::message_id("troupe.testpb.GetBalance"));
  EXPECT_EQ(c.name_of(*id), "troupe.testpb.GetBalance");
  ASSERT_TRUE(reply);

  std::optional<cluster::ReplyBytes> sent;
  cluster::ReplySink sink = [&](cluster::ReplyBytes b) { sent = std::move(b); };
  auto req = c.decode(*id, w.bytes(), &sink);
  ASSERT_TRUE(req.ok()) << req.error().to_string();
  EXPECT_EQ(std::get<GetBalance>(*req).currency, "EUR");
  std::get<GetBalance>(*req).reply_to.reply(1234);
  ASSERT_TRUE(sent && sent->ok());
  pb::Balance on_wire;
  ASSERT_TRUE(on_wire.ParseFromString(sent->value()));
  EXPECT_EQ(on_wire.cents(), 1234);
  (*reply)(Result<std::string_view>(sent->value()));
  auto got = answer.get();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 1234);

  pb::Poke poke;
  poke.set_text("hi");
  AccountMsg p = poke;
  ByteWriter pw;
  auto pid = c.encode(p, pw);
  ASSERT_TRUE(pid.ok());
  auto pback = c.decode(*pid, pw.bytes(), nullptr);
  ASSERT_TRUE(pback.ok());
  EXPECT_EQ(std::get<pb::Poke>(*pback).text(), "hi");
}

// proves: X1
TEST(ProtobufMessageCodecs, BytesThatDoNotParseOrAreRefusedAreProtocolErrorsNamingTheMessage) {
  auto c = account_messages();
  auto id = cluster::message_id("troupe.testpb.GetBalance");
  auto torn = c.decode(id,
                       std::string("\x0a\x09"
                                   "EU",
                                   4),
                       nullptr);
  ASSERT_FALSE(torn.ok());
  EXPECT_EQ(torn.error().code(), ErrorCode::protocol_error);
  EXPECT_TRUE(has(torn.error(), "'troupe.testpb.GetBalance'")) << torn.error().message();
  auto refused = c.decode(id, "", nullptr);  // parses (all fields empty), refused by from_pb
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::protocol_error);
  EXPECT_TRUE(has(refused.error(), "no currency")) << refused.error().message();
}

// proves: X1
TEST(ProtobufCodecs, AMessageMissingARequiredFieldIsRefusedWhenStoredAndWhenReceived) {
  using troupe::testpb2::Signed;
  EventCodecs<Signed> events;
  add_protobuf<Signed>(events);
  // The entity turns the throw into "cannot encode an event" and stores nothing.
  EXPECT_THROW((void)events.encode(Signed()), std::invalid_argument);
  Signed ok;
  ok.set_signature("s");
  EXPECT_TRUE(events.encode(ok).ok());

  // On the wire nothing throws; the receiver refuses the message.
  cluster::MessageCodecs<Signed> wire;
  ASSERT_TRUE(add_protobuf<Signed>(wire).ok());
  ByteWriter w;
  auto id = wire.encode(Signed(), w);
  ASSERT_TRUE(id.ok());
  auto back = wire.decode(*id, w.bytes(), nullptr);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.error().code(), ErrorCode::protocol_error);
  EXPECT_TRUE(has(back.error(), "troupe.testpb2.Signed lacks signature")) << back.error().message();
}

}  // namespace
}  // namespace troupe::test
