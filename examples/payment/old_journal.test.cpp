// Payments stored by an older build replay through today's codecs: the rows
// of testdata/journal_before_protobuf.sql (ByteWriter codecs, manifests
// without a package, SettlementAccepted v1 and v2) are loaded into a SQLite
// journal and every payment recovers, through the upcasters of
// payment_codecs(), to the state that build folded them into (printed by it
// when the rows were written). New events go in as Protobuf messages.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "payment.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace payment {
namespace {

using namespace std::chrono_literals;

struct Expected {
  std::string id;
  std::uint64_t events;
  Phase phase;
  Failure failure;
  std::string customer, order_id;
  std::int64_t amount, accepted_at_ms;
  std::string detail;
  std::int64_t refunded;
};

// What the older build's codecs and Payment::on_event made of the rows
// (its refund queue's job ids, errors and attempts are no longer part of
// the state: the rows that held them replay as LegacyRefundStep).
const std::vector<Expected> kExpected = {
    {"cancelled", 2, Phase::cancelled, Failure::none, "cust-10", "order-6", 500, 0, "", 0},
    {"created-completed", 3, Phase::completed, Failure::none, "cust-7", "order-3", 4200, 1767225600040,
     "AUTH-00C0FFEE", 0},
    {"declined", 2, Phase::failed, Failure::declined, "cust-8", "order-4", 77, 1767225600020,
     "declined by issuer", 0},
    {"gateway-error", 2, Phase::failed, Failure::gateway_error, "cust-9", "order-5", 310, 1767225600020,
     "unreachable: gateway: connection refused", 0},
    {"refund-retried", 6, Phase::cancelled, Failure::none, "cust-12", "order-8", 2000, 1767225600020,
     "AUTH-87654321", 2000},
    {"refunded", 4, Phase::cancelled, Failure::none, "cust-11", "order-7", 150000, 1767225600020,
     "AUTH-12345678", 150000},
    {"v1-completed", 2, Phase::completed, Failure::none, "", "order-1", 1250, 1767225600020, "AUTH-0000A1B2",
     0},
    {"v1-timed-out", 2, Phase::failed, Failure::timed_out, "", "order-2", 990, 1767225600020,
     "no answer from the gateway within 15000 ms", 0},
};

class OldJournal : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe-old-journal-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "journal.db").string();
  }
  void TearDown() override {
    if (system_) {
      auto stopped = registry_->stop(5s);
      EXPECT_TRUE(stopped.ok()) << stopped.error().to_string();
      registry_.reset();
      system_.reset();
    }
    journal_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A journal file that holds the old rows: the schema of today's journal,
  // then the rows inserted as they were dumped.
  void load_old_rows() {
    {
      auto j = troupe::SqliteJournal::open({.path = path_});
      ASSERT_TRUE(j.ok()) << j.error().to_string();
    }
    std::ifstream in(std::string(PAYMENT_TESTDATA_DIR) + "/journal_before_protobuf.sql");
    ASSERT_TRUE(in) << "no test data in " << PAYMENT_TESTDATA_DIR;
    std::stringstream sql;
    sql << in.rdbuf();
    // The dump names no columns; today's table has more (trace_id), which
    // old rows leave empty, as the migration of an old file does.
    std::string rows = sql.str();
    const std::string dumped = "INSERT INTO events VALUES";
    const std::string named = "INSERT INTO events(persistence_id, seq, timestamp_ms, type, version, payload) VALUES";
    for (auto at = rows.find(dumped); at != std::string::npos; at = rows.find(dumped, at + named.size()))
      rows.replace(at, dumped.size(), named);
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    int rc = sqlite3_exec(db, rows.c_str(), nullptr, nullptr, &err);
    std::string msg = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    ASSERT_EQ(rc, SQLITE_OK) << msg;
  }

  void start() {
    auto j = troupe::SqliteJournal::open({.path = path_});
    ASSERT_TRUE(j.ok()) << j.error().to_string();
    journal_ = std::move(*j);
    troupe::SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_dead_letters = false;
    system_ = std::make_unique<troupe::ActorSystem>(std::move(cfg));
    troupe::EntitySettings settings;
    settings.type_name = "payment";
    settings.log = false;
    auto reg = troupe::EntityRegistry<Payment>::start(*system_, journal_, settings, payment_codecs(),
                                                      [](const std::string&) { return Payment({}, 15s); });
    ASSERT_TRUE(reg.ok()) << reg.error().to_string();
    registry_.emplace(std::move(*reg));
  }

  troupe::Result<PaymentStatus> status(const std::string& id) {
    return registry_
        ->ask<PaymentStatus>(
            id, [](troupe::ReplyTo<PaymentStatus> r) { return GetStatus{std::move(r)}; }, 10s)
        .get();
  }

  std::filesystem::path dir_;
  std::string path_;
  std::shared_ptr<troupe::SqliteJournal> journal_;
  std::unique_ptr<troupe::ActorSystem> system_;
  std::optional<troupe::EntityRegistry<Payment>> registry_;
};

TEST_F(OldJournal, EveryPaymentAnOlderBuildStoredRecoversToTheStateThatBuildFoldedItInto) {
  load_old_rows();
  start();
  for (const auto& x : kExpected) {
    SCOPED_TRACE(x.id);
    auto st = status(x.id);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    EXPECT_EQ(st->events, x.events);
    const PaymentState& s = st->state;
    EXPECT_EQ(s.phase, x.phase);
    EXPECT_EQ(s.failure, x.failure);
    EXPECT_EQ(s.customer, x.customer);
    EXPECT_EQ(s.order_id, x.order_id);
    EXPECT_EQ(s.amount, x.amount);
    EXPECT_EQ(s.accepted_at_ms, x.accepted_at_ms);
    EXPECT_EQ(s.detail, x.detail);
    EXPECT_EQ(s.refunded, x.refunded);
  }
  EXPECT_EQ(registry_->stats().recovery_failures, 0u);
  // Replaying the old refunds sends nothing again: side effects come from
  // events as they are stored, never from a replay.
  auto outbox = troupe::journal_sync::read_outbox(*journal_, {});
  ASSERT_TRUE(outbox.ok()) << outbox.error().to_string();
  EXPECT_EQ(outbox->pending + outbox->failed, 0u);
}

TEST_F(OldJournal, TheOldRefundQueuesRowsReplayAsLegacyRefundSteps) {
  load_old_rows();
  start();
  auto rows = troupe::journal_sync::recover(*journal_, "payment|refund-retried");
  ASSERT_TRUE(rows.ok()) << rows.error().to_string();
  ASSERT_EQ(rows->events.size(), 6u);
  auto codecs = payment_codecs();
  std::vector<std::string> steps;
  for (const auto& ev : rows->events) {
    auto e = codecs.decode(ev.type, ev.version, ev.payload);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    if (const auto* l = std::get_if<LegacyRefundStep>(&*e)) steps.push_back(ev.type + ": " + l->what);
  }
  EXPECT_EQ(steps,
            (std::vector<std::string>{
                "RefundNotQueued: not queued: timeout: the refund queue did not answer within 15000 ms",
                "RefundRetried: retried", "RefundQueued: queued as job 42"}));
}

TEST_F(OldJournal, NewEventsBesideTheOldRowsAreStoredAsTheirProtobufMessages) {
  load_old_rows();
  start();
  auto created = registry_
                     ->ask<PaymentStatus>(
                         "new-one",
                         [](troupe::ReplyTo<PaymentStatus> r) {
                           return Create{"cust-1", "order-9", 700, std::move(r)};
                         },
                         10s)
                     .get();
  ASSERT_TRUE(created.ok()) << created.error().to_string();
  auto rows = troupe::journal_sync::recover(*journal_, "payment|new-one");
  ASSERT_TRUE(rows.ok()) << rows.error().to_string();
  ASSERT_EQ(rows->events.size(), 1u);
  EXPECT_EQ(rows->events[0].type, "payment.pb.PaymentCreated");
  EXPECT_EQ(rows->events[0].version, 2u);
  pb::PaymentCreated m;
  ASSERT_TRUE(m.ParseFromString(rows->events[0].payload));
  EXPECT_EQ(m.order_id(), "order-9");
  // The old rows are read, never rewritten.
  auto old = troupe::journal_sync::recover(*journal_, "payment|v1-completed");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->events[0].type, "SettlementAccepted");
  EXPECT_EQ(old->events[0].version, 1u);
}

}  // namespace
}  // namespace payment
