// Entities on Protobuf codecs: an entity recovers rows of every older
// version through its upcasters, stores new events and snapshots as their
// messages, and fails its recovery, loudly and naming the row, on a row
// that cannot be upcast or whose Protobuf type nobody registered.

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "account_test_codecs.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe::test {
namespace {

using namespace std::chrono_literals;

struct DepositCmd {
  std::int64_t cents = 0;
  ReplyTo<AccountState> reply_to;
};
struct GetAccount {
  ReplyTo<AccountState> reply_to;
};
using AccountCmd = std::variant<DepositCmd, GetAccount>;

struct Account {
  using Command = AccountCmd;
  using Event = AccountEvent;
  using State = AccountState;
  using Effect = troupe::Effect<Event, State>;

  Effect on_command(const State& s, Command& c, EntityContext<Account>&) {
    return match(
        c,
        [&](DepositCmd& d) {
          return Effect::persist(Deposit{d.cents, "cmd"}).then_reply(d.reply_to, [](const State& st) {
            return st;
          });
        },
        [&](GetAccount& g) { return Effect::reply(g.reply_to, s); });
  }
  void on_event(State& s, const Event& e) const {
    match(
        e,
        [&](const Deposit& d) {
          s.balance += d.cents;
          ++s.deposits;
        },
        [&](const Transfer& t) { s.balance -= t.cents; },
        [&](const pb::Withdrawn& w) { s.balance -= w.cents(); });
  }
};

class ProtobufRecovery : public ::testing::Test {
 protected:
  ~ProtobufRecovery() override { stop(); }

  void boot(EventCodecs<AccountEvent> codecs, std::uint64_t snapshot_every = 0) {
    stop();
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    EntitySettings s;
    s.type_name = "account";
    s.shards = 2;
    s.log = false;
    s.snapshot_every = snapshot_every;
    std::optional<StateCodec<AccountState>> snaps;
    if (snapshot_every > 0) snaps = account_snapshots();
    auto r = EntityRegistry<Account>::start(*system, journal, s, std::move(codecs), {}, std::move(snaps));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    reg.emplace(std::move(*r));
  }
  void stop() {
    if (!system) return;
    (void)reg->stop(5s);
    reg.reset();
    system.reset();
  }

  // Stores rows as they are, as an older build left them.
  void store(const std::string& pid, std::vector<EventRecord> rows) {
    std::promise<Result<void>> done;
    journal->append(AppendBatch{pid, std::move(rows), {}},
                    [&](Result<void> r) { done.set_value(std::move(r)); });
    auto r = done.get_future().get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  static EventRecord row(std::uint64_t seq, std::string type, std::uint32_t version, std::string payload) {
    return EventRecord{seq, 1'700'000'000'000, std::move(type), version, std::move(payload)};
  }
  static EventRecord row(std::uint64_t seq, const AccountEvent& e) {
    auto enc = account_codecs().encode(e);
    return row(seq, enc->type, enc->version, enc->payload);
  }
  Result<AccountState> get(const std::string& id) {
    return reg
        ->ask<AccountState>(
            id, [](ReplyTo<AccountState> r) { return GetAccount{std::move(r)}; }, 5s)
        .get();
  }
  Recovery recover(const std::string& pid) {
    std::promise<Result<Recovery>> done;
    journal->recover(pid, [&](Result<Recovery> r) { done.set_value(std::move(r)); });
    auto r = done.get_future().get();
    EXPECT_TRUE(r.ok());
    return r.ok() ? std::move(*r) : Recovery{};
  }

  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::unique_ptr<ActorSystem> system;
  std::optional<EntityRegistry<Account>> reg;
};

TEST_F(ProtobufRecovery, AnEntityRecoversRowsOfEveryOlderVersionAndStoresNewOnesAsTodaysMessage) {
  pb::Withdrawn w;
  w.set_cents(50);
  store("account|a1", {row(1, "Deposited", 1, deposited_v1(500)),
                       row(2, "Deposited", 2, deposited_v2(250, "gift")), row(3, Deposit{100, "now"}),
                       row(4, "troupe.testpb.Transferred", 1, transferred_v1(200, "bob")), row(5, w)});
  boot(account_codecs());
  auto s = get("a1");
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(s->balance, 500 + 250 + 100 - 200 - 50);
  EXPECT_EQ(s->deposits, 3u);

  auto after = reg->ask<AccountState>(
                      "a1",
                      [](ReplyTo<AccountState> r) {
                        return DepositCmd{10, std::move(r)};
                      },
                      5s)
                   .get();
  ASSERT_TRUE(after.ok()) << after.error().to_string();
  EXPECT_EQ(after->balance, 610);
  auto rec = recover("account|a1");
  ASSERT_EQ(rec.events.size(), 6u);
  EXPECT_EQ(rec.events[5].type, "troupe.testpb.Deposited");
  EXPECT_EQ(rec.events[5].version, 3u);
  EXPECT_EQ(rec.events[0].type, "Deposited");  // stored rows are never rewritten
}

// proves: X1
TEST_F(ProtobufRecovery, ARowThatCannotBeUpcastOrDecodedFailsTheRecoveryNamingEntitySeqTypeAndVersion) {
  store("account|short", {row(1, Deposit{1, ""}), row(2, "Deposited", 1, "abc")});
  store("account|unknown",
        {row(1, Deposit{1, ""}), row(2, Deposit{2, ""}), row(3, "troupe.testpb.Refunded", 1, "")});
  store("account|good", {row(1, "Deposited", 1, deposited_v1(7))});
  boot(account_codecs());
  auto a = get("short");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), ErrorCode::recovery_failed);
  EXPECT_NE(a.error().message().find(
                "entity 'account|short' cannot recover: corrupt_record: event 2: cannot upcast "
                "'Deposited' v1 to 'Deposited' v2"),
            std::string::npos)
      << a.error().message();
  auto b = get("unknown");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code(), ErrorCode::recovery_failed);
  EXPECT_NE(b.error().message().find("'account|unknown'"), std::string::npos) << b.error().message();
  EXPECT_NE(b.error().message().find("event 3: unknown event manifest 'troupe.testpb.Refunded' v1"),
            std::string::npos)
      << b.error().message();
  // The others are not touched by it.
  auto c = get("good");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->balance, 7);

  // An upcaster that throws is an error value too, not a crash.
  auto throwing = account_codecs();
  throwing.upcast("Deposited", 1,
                  [](std::string_view) -> Result<std::string> { throw std::runtime_error("boom"); });
  boot(std::move(throwing));
  auto d = get("good");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message().find("'account|good' cannot recover: corrupt_record: event 1: cannot upcast "
                                     "'Deposited' v1 to 'Deposited' v2: the upcaster threw: boom"),
            std::string::npos)
      << d.error().message();
}

TEST_F(ProtobufRecovery, SnapshotsAreStoredAsTheirMessageAndRecoveredWithoutTheEventsBeforeThem) {
  store("account|s1", {row(1, "Deposited", 1, deposited_v1(100))});
  boot(account_codecs(), 2);
  for (int i = 0; i < 3; ++i) {
    auto r = reg->ask<AccountState>(
                    "s1",
                    [](ReplyTo<AccountState> rt) {
                      return DepositCmd{10, std::move(rt)};
                    },
                    5s)
                 .get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  stop();
  auto rec = recover("account|s1");
  ASSERT_TRUE(rec.snapshot);
  EXPECT_EQ(rec.snapshot->type, "troupe.testpb.AccountSnapshot");
  EXPECT_EQ(rec.snapshot->version, 2u);
  std::promise<Result<void>> deleted;
  journal->delete_up_to("account|s1", rec.snapshot->seq,
                        [&](Result<void> r) { deleted.set_value(std::move(r)); });
  ASSERT_TRUE(deleted.get_future().get().ok());

  boot(account_codecs(), 2);
  auto s = get("s1");
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(s->balance, 130);
  EXPECT_EQ(s->deposits, 4u);
}

}  // namespace
}  // namespace troupe::test
