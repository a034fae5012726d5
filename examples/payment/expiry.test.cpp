// Payments created and never settled expire (payment.hpp, "Expiry";
// expiry.hpp): the payment entity, its "expire" reminder in an SQLite store
// in the journal's own file, and the reminder service delivering it through
// deliver_expiry, on the manual clock. Also the expire_after parser.

#include <gtest/gtest.h>

#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "expiry.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe;
using payment::Phase;
using payment::PaymentStatus;

class PaymentExpiryTest : public ::testing::Test {
 protected:
  PaymentExpiryTest() {
    std::string pattern = (std::filesystem::temp_directory_path() / "payment-expiry-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir = pattern;
    boot();
  }
  ~PaymentExpiryTest() override {
    drop();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // A node: the journal, then the reminder store in the journal's file (the
  // order the service opens them in), the payments with a 30 min expiry, an
  // approving gateway, and the reminder service.
  void boot() {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.clock = clock;
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    std::string db = (dir / "journal.db").string();
    auto j = SqliteJournal::open({.path = db});
    ASSERT_TRUE(j.ok()) << j.error().to_string();
    auto st = open_sqlite_reminder_store({.path = db, .full_sync = false});
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    store = *st;
    payment::GatewaySettings gs;
    gs.latency_mean = 10ms;
    gs.latency_jitter = 0ms;
    gs.decline_rate = 0;
    gs.hang_rate = 0;
    auto gateway = system->spawn<payment::SettlementGateway>(gs, std::make_shared<payment::GatewayCounters>());
    policy = std::make_shared<payment::ExpiryPolicy>();
    EntitySettings s;
    s.type_name = "payment";
    s.idle_timeout = 5s;
    s.shards = 2;
    s.stop_timeout = 5s;
    s.log = false;
    auto r = EntityRegistry<payment::Payment>::start(
        *system, *j, s, payment::payment_codecs(),
        [gateway, p = policy](const std::string&) { return payment::Payment(gateway, 1500ms, {}, *p); });
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    reg.emplace(*r);
    // The clock moves in steps of 10 s (advance): an ask's timeout of 60 s
    // outlasts the journal's writes however the steps fall.
    ReminderSettings rs;
    rs.log = false;
    rs.attempt_timeout = 60s;
    rs.lease = 5min;  // above the attempt timeout
    rs.max_per_second = 100;
    auto svc = ReminderService::start(*system, store, rs, payment::deliver_expiry(*reg, 60s));
    ASSERT_TRUE(svc.ok()) << svc.error().to_string();
    service.emplace(*svc);
    *policy = payment::ExpiryPolicy{service->handle(), 30min};
    settle();
  }
  // As in a crash: nothing stops gracefully.
  void drop() {
    if (!system) return;
    *policy = {};  // the factory's handle refers to the service, whose deliver refers to the registry
    reg->abandon();
    service.reset();
    reg.reset();
    system.reset();
    store.reset();
  }
  void settle() { ASSERT_TRUE(system->wait_idle(10s)); }
  void advance(Duration total) {
    for (Duration done{}; done < total; done += 10s) {
      clock->advance(std::min<Duration>(10s, total - done));
      settle();
    }
  }
  // Asks payment `id`; the clock moves on in small steps until it answered
  // (the gateway's latency is a timer on the manual clock).
  template <class Make>
  PaymentStatus ask(const std::string& id, Make make) {
    auto f = reg->ask<PaymentStatus>(id, make, 60s);
    for (int i = 0; i < 100 && !f.ready(); ++i) {
      settle();
      if (!f.ready()) clock->advance(10ms);
    }
    auto r = std::move(f).get();
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : PaymentStatus{};
  }
  PaymentStatus create(const std::string& id) {
    return ask(id, [](ReplyTo<PaymentStatus> t) { return payment::Create{"c1", "o-" + std::string("1"), 500, std::move(t)}; });
  }
  PaymentStatus status(const std::string& id) {
    return ask(id, [](ReplyTo<PaymentStatus> t) { return payment::GetStatus{std::move(t)}; });
  }
  std::size_t reminders_of(const std::string& id) {
    auto l = store->list("payment|" + id);
    EXPECT_TRUE(l.ok());
    return l.ok() ? l->size() : 0;
  }

  std::filesystem::path dir;
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<ReminderStore> store;
  std::shared_ptr<payment::ExpiryPolicy> policy;
  std::unique_ptr<ActorSystem> system;
  std::optional<EntityRegistry<payment::Payment>> reg;
  std::optional<ReminderService> service;
};

TEST_F(PaymentExpiryTest, a_payment_created_and_never_settled_is_cancelled_as_expired_after_expire_after) {
  auto created = create("p1");
  EXPECT_EQ(created.state.phase, Phase::waiting_for_request);
  EXPECT_EQ(reminders_of("p1"), 1u);  // stored before Create was answered
  advance(29min + 50s);
  EXPECT_EQ(status("p1").state.phase, Phase::waiting_for_request);
  advance(20s);
  auto after = status("p1");
  EXPECT_EQ(after.state.phase, Phase::cancelled);
  EXPECT_EQ(after.state.detail, "expired");
  EXPECT_EQ(after.state.refunded, 0);
  EXPECT_EQ(after.events, 2u);
  settle();                           // the service records the firing once the payment answered
  EXPECT_EQ(reminders_of("p1"), 0u);  // a one-shot reminder, recorded as fired
  EXPECT_EQ(service->stats().delivered, 1u);
}

TEST_F(PaymentExpiryTest, a_settled_payment_does_not_expire_and_its_reminder_is_cancelled) {
  create("p2");
  auto done = ask("p2", [](ReplyTo<PaymentStatus> t) { return payment::Settle{"", 0, std::move(t), ""}; });
  EXPECT_EQ(done.state.phase, Phase::completed);
  settle();
  EXPECT_EQ(reminders_of("p2"), 0u);
  advance(31min);
  auto after = status("p2");
  EXPECT_EQ(after.state.phase, Phase::completed);
  EXPECT_EQ(service->stats().delivered, 0u);
}

TEST_F(PaymentExpiryTest, a_cancelled_payment_does_not_expire) {
  create("p3");
  auto cancelled = ask("p3", [](ReplyTo<PaymentStatus> t) { return payment::Cancel{std::move(t)}; });
  EXPECT_EQ(cancelled.state.phase, Phase::cancelled);
  settle();
  EXPECT_EQ(reminders_of("p3"), 0u);
  advance(31min);
  auto after = status("p3");
  EXPECT_EQ(after.state.detail, "");
  EXPECT_EQ(after.events, 2u);
}

TEST_F(PaymentExpiryTest, a_firing_that_finds_the_payment_settled_or_not_created_stores_nothing) {
  create("p4");
  ask("p4", [](ReplyTo<PaymentStatus> t) { return payment::Settle{"", 0, std::move(t), ""}; });
  auto late = ask("p4", [](ReplyTo<PaymentStatus> t) { return payment::Expire{0, std::move(t)}; });
  EXPECT_EQ(late.state.phase, Phase::completed);
  EXPECT_EQ(status("p4").events, 3u);
  auto never = ask("p5", [](ReplyTo<PaymentStatus> t) { return payment::Expire{0, std::move(t)}; });
  EXPECT_EQ(never.events, 0u);
  EXPECT_EQ(never.state.phase, Phase::waiting_for_request);
}

// proves: R2
TEST_F(PaymentExpiryTest, a_payment_created_before_a_crash_expires_after_the_restart) {
  create("p6");
  advance(10min);
  drop();  // the node dies; the journal and the reminder stay in the file
  clock->advance(30min);  // down past the due time
  boot();
  advance(10s);
  auto after = status("p6");
  EXPECT_EQ(after.state.phase, Phase::cancelled);
  EXPECT_EQ(after.state.detail, "expired");
  settle();
  EXPECT_EQ(reminders_of("p6"), 0u);
}

TEST(ExpireAfter, reads_a_number_and_a_unit_and_refuses_anything_else) {
  EXPECT_EQ(*payment::parse_expire_after("0"), 0ms);
  EXPECT_EQ(*payment::parse_expire_after("0s"), 0ms);
  EXPECT_EQ(*payment::parse_expire_after("1500ms"), 1500ms);
  EXPECT_EQ(*payment::parse_expire_after("90s"), 90s);
  EXPECT_EQ(*payment::parse_expire_after("30m"), 30min);
  EXPECT_EQ(*payment::parse_expire_after("2h"), 2h);
  EXPECT_EQ(*payment::parse_expire_after("30d"), payment::kMaxExpireAfter);
  for (const char* bad : {"", "30", "-5m", "m", "30 m", "30min", "1.5h", "31d", "99999999999999999999s", "30mm"}) {
    auto r = payment::parse_expire_after(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << bad;
    EXPECT_NE(r.error().message().find("payment.expire_after"), std::string::npos) << r.error().message();
  }
}

}  // namespace
