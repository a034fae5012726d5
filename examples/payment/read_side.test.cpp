// The payment service's read side (read_side.hpp) against a fold of the
// journal: payments created, settled (approved or declined), cancelled and
// refunded through the payment entity; every customer's list and the daily
// totals equal what the journal's events say, after a restart of the read
// side too (nothing applied twice: the totals would double). Bad inputs
// are refused. Each test runs twice: on an SQLite read model, and on a node
// whose journal is PostgreSQL (the read model in the journal's schema, as
// ReadSide::start opens it).

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../../src/persist/journal_test_support.hpp"
#include "../../src/persist/postgres/postgres_test_server.hpp"
#include "read_side.hpp"

namespace {

using namespace std::chrono_literals;
using namespace payment;
using troupe::ErrorCode;

constexpr std::uint32_t kSlices = 3;

// What the journal says, folded here independently of the read side.
struct Fold {
  std::map<std::string, std::map<std::string, CustomerPayment>> by_customer;  // customer -> id -> row
  std::map<std::string, DayTotals> days;
  std::size_t events = 0;
};

enum class Backend { sqlite, postgres };
void PrintTo(Backend b, std::ostream* os) { *os << (b == Backend::sqlite ? "sqlite" : "postgres"); }

class ReadSideTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    // SQLite: a memory journal, the read model in a file of its own
    // (ReadSide::open). PostgreSQL: the journal in a fresh schema of the
    // run's server, the read model beside it (ReadSide::start).
    std::string journal = "[journal]\nbackend = \"memory\"\n";
    if (GetParam() == Backend::postgres)
      journal = "[journal]\nbackend = \"postgres\"\npostgres = \"" + troupe::test::shared_postgres_conninfo() +
                "\"\nschema = \"" + troupe::test::fresh_schema() + "\"\n";
    auto cfg = troupe::node::NodeConfig::parse("[node]\nid = \"rs\"\ndata_dir = \"" + dir.path().string() +
                                                   "\"\nthreads = 2\n[admin]\nport = 0\n" + journal,
                                               "test.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    node = std::move(troupe::node::Node::start(std::move(*cfg)).value());
    GatewaySettings gs;
    gs.latency_mean = 1ms;
    gs.latency_jitter = 0ms;
    gs.decline_rate = 0.3;
    gs.hang_rate = 0;
    gs.seed = 7;
    auto gateway = node->system().spawn<SettlementGateway>(gs, std::make_shared<GatewayCounters>());
    troupe::node::EntityTypeOptions<Payment> opts;
    opts.type = "payment";
    opts.events = payment_codecs();
    opts.factory = [gateway](const std::string& id) { return Payment(gateway, 5s, slice_tag(id, kSlices)); };
    payments.emplace(node->serve_entities<Payment>(std::move(opts)).value());
  }
  void TearDown() override {
    side.reset();
    payments.reset();
    node.reset();
  }
  void open_side() {
    auto s = GetParam() == Backend::postgres ? ReadSide::start(*node, kSlices)
                                             : ReadSide::open(*node, node->journal(), dir.file("read.db"), kSlices);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    side = std::move(*s);
  }
  PaymentStatus ask(const std::string& id, auto make) {
    auto r = payments->ask<PaymentStatus>(id, make, 10s).get();
    EXPECT_TRUE(r.ok()) << id << ": " << r.error().to_string();
    return r.ok() ? *r : PaymentStatus{};
  }
  void create(const std::string& id, const std::string& customer, std::int64_t amount) {
    ask(id, [&](troupe::ReplyTo<PaymentStatus> r) { return Create{customer, "o-" + id, amount, std::move(r)}; });
  }
  PaymentStatus settle(const std::string& id) {
    return ask(id, [](troupe::ReplyTo<PaymentStatus> r) { return Settle{"", 0, std::move(r), ""}; });
  }
  void cancel(const std::string& id) {
    ask(id, [](troupe::ReplyTo<PaymentStatus> r) { return Cancel{std::move(r)}; });
  }
  // Creates, settles, cancels and refunds payments n0 .. n0+count-1.
  void traffic(int n0, int count) {
    for (int i = n0; i < n0 + count; ++i) {
      std::string id = "p" + std::to_string(i);
      create(id, "c" + std::to_string(i % 4), 100 + i);
      if (i % 3 == 1) {
        cancel(id);  // before settling: nothing to refund
        continue;
      }
      auto st = settle(id);
      if (i % 3 == 2 && st.state.phase == Phase::completed) cancel(id);  // a refund
    }
  }

  Fold fold() {
    Fold f;
    auto codecs = payment_codecs();
    troupe::EventQuery q;
    q.select = troupe::EventSelector::of_type("payment");
    q.limit = 1000;
    std::map<std::string, std::string> customer_of;
    std::map<std::string, CustomerPayment> rows;
    std::map<std::string, std::int64_t> open;
    for (;;) {
      auto page = troupe::journal_sync::query_events(*node->journal(), q);
      EXPECT_TRUE(page.ok());
      if (!page.ok() || page->events.empty()) break;
      for (const auto& e : page->events) {
        ++f.events;
        std::string id = e.persistence_id.substr(e.persistence_id.find('|') + 1);
        EXPECT_EQ(e.event.tags, std::vector<std::string>{slice_tag(id, kSlices)});
        auto ev = codecs.decode(e.event.type, e.event.version, e.event.payload).value();
        auto& row = rows[id];
        std::int64_t at = e.event.timestamp_ms;
        if (row.id.empty()) row = CustomerPayment{id, "", 0, "", 0, at, at};
        row.updated_ms = at;
        std::string day = utc_day(at);
        troupe::match(
            ev,
            [&](const PaymentCreated& x) {
              customer_of[id] = x.customer;
              row.order_id = x.order_id;
              row.amount = open[id] = x.amount;
              row.status = "WaitingForRequest";
            },
            [&](const SettlementAccepted& x) {
              if (!x.customer.empty()) customer_of[id] = x.customer;
              row.order_id = x.order_id;
              row.amount = open[id] = x.amount;
              row.status = "Settling";
            },
            [&](const SettlementSucceeded&) {
              row.status = "Completed";
              auto& d = f.days[day];
              d.day = day;
              d.settled_count += 1;
              d.settled_amount += open.at(id);
            },
            [&](const SettlementDeclined&) { row.status = "Failed"; },
            [&](const SettlementFailed&) { row.status = "Failed"; },
            [&](const SettlementTimedOut&) { row.status = "Failed"; },
            [&](const PaymentCancelled& x) {
              row.status = "Cancelled";
              row.refunded = x.refunded;
              if (x.refunded > 0) {
                auto& d = f.days[day];
                d.day = day;
                d.refunded_count += 1;
                d.refunded_amount += x.refunded;
              }
            },
            [&](const LegacyRefundStep&) {});
      }
      q.after = page->events.back().offset;
    }
    for (auto& [id, row] : rows) f.by_customer[customer_of[id]][id] = row;
    return f;
  }

  // Waits until every projection of the side applied `events` in all and
  // caught up.
  void wait_caught_up(std::size_t events) {
    auto done = [&] {
      std::uint64_t by_customer = 0, totals = 0;
      for (const auto& s : side->statuses()) {
        if (!s.caught_up || s.state != troupe::ProjectionState::running) return false;
        (s.key.starts_with("payments_by_customer/") ? by_customer : totals) += s.events_applied;
      }
      return by_customer == events && totals == events;
    };
    for (int i = 0; i < 1000 && !done(); ++i) std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(done());
  }

  void expect_matches(const Fold& f) {
    std::size_t customers = 0;
    for (const auto& [customer, rows] : f.by_customer) {
      ++customers;
      auto got = side->customer_payments(customer, 1000);
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      std::vector<CustomerPayment> want;
      for (const auto& [id, row] : rows) want.push_back(row);
      std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
        return std::tie(a.created_ms, a.id) < std::tie(b.created_ms, b.id);
      });
      ASSERT_EQ(got->size(), want.size()) << customer;
      for (std::size_t i = 0; i < want.size(); ++i) {
        const auto& g = (*got)[i];
        const auto& w = want[i];
        EXPECT_EQ(std::tie(g.id, g.order_id, g.amount, g.status, g.refunded, g.created_ms, g.updated_ms),
                  std::tie(w.id, w.order_id, w.amount, w.status, w.refunded, w.created_ms, w.updated_ms))
            << customer << " row " << i;
      }
    }
    EXPECT_EQ(customers, 4u);
    ASSERT_FALSE(f.days.empty());
    auto got = side->daily_totals(f.days.begin()->first, f.days.rbegin()->first);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    ASSERT_EQ(got->size(), f.days.size());
    std::size_t i = 0;
    for (const auto& [day, w] : f.days) {
      const auto& g = (*got)[i++];
      EXPECT_EQ(std::tie(g.day, g.settled_count, g.settled_amount, g.refunded_count, g.refunded_amount),
                std::tie(w.day, w.settled_count, w.settled_amount, w.refunded_count, w.refunded_amount));
    }
  }

  troupe::test::TempDir dir;
  std::unique_ptr<troupe::node::Node> node;
  std::optional<troupe::node::Entities<Payment>> payments;
  std::unique_ptr<ReadSide> side;
};

TEST_P(ReadSideTest, CustomerListsAndDailyTotalsEqualAFoldOfTheJournalAcrossARestart) {
  open_side();
  traffic(0, 30);
  Fold f = fold();
  wait_caught_up(f.events);
  expect_matches(f);
  ASSERT_GT(f.days.begin()->second.settled_count, 0);
  ASSERT_GT(f.days.begin()->second.refunded_count, 0);

  // The node reports every slice of both projections.
  auto listed = node->overview()["projections"];
  EXPECT_EQ(listed.size(), 2 * kSlices);

  // Stopped, more traffic, started again on the same file: it resumes from
  // its stored offsets, so nothing is applied twice (the totals would
  // double) and nothing is missed.
  side.reset();
  EXPECT_EQ(node->overview()["projections"].size(), 0u);
  traffic(30, 15);
  open_side();
  Fold g = fold();
  wait_caught_up(g.events - f.events);
  expect_matches(g);
}

TEST_P(ReadSideTest, AnUnknownCustomerHasNoPaymentsAndBadInputsAreRefused) {
  open_side();
  auto none = side->customer_payments("nobody", 10);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  for (std::string bad : {std::string(), std::string("a\x01"), std::string(129, 'x'), std::string("a\x7f")})
    EXPECT_EQ(side->customer_payments(bad, 10).error().code(), ErrorCode::invalid_argument) << bad;
  EXPECT_EQ(side->customer_payments("c", 0).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(side->customer_payments("c", 1001).error().code(), ErrorCode::invalid_argument);
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{{"2026-02-30", "2026-03-01"},
                                                                          {"2026-1-01", "2026-01-02"},
                                                                          {"2026-01-02", "2026-01-01"},
                                                                          {"2025-01-01", "2026-01-02"},
                                                                          {"2026-01-01", "tomorrow"},
                                                                          {"20260101xx", "2026-01-01"}})
    EXPECT_EQ(side->daily_totals(from, to).error().code(), ErrorCode::invalid_argument) << from << " " << to;
  auto year = side->daily_totals("2024-01-01", "2024-12-31");  // a leap year: 366 days
  ASSERT_TRUE(year.ok()) << year.error().to_string();
  EXPECT_TRUE(year->empty());
  EXPECT_EQ(ReadSide::open(*node, node->journal(), dir.file("x.db"), 0).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(ReadSide::start(*node, kMaxReadSlices + 1).error().code(), ErrorCode::invalid_argument);
  // The memory journal's node (the SQLite run's) keeps no read model: the
  // routes then answer 503 with this reason.
  if (GetParam() == Backend::sqlite) {
    auto off = ReadSide::start(*node, kSlices);
    ASSERT_FALSE(off.ok());
    EXPECT_EQ(off.error().code(), ErrorCode::invalid_argument);
    EXPECT_NE(off.error().message().find("journal.backend is \"memory\""), std::string::npos)
        << off.error().message();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ReadSideTest, ::testing::Values(Backend::sqlite, Backend::postgres),
                         [](const auto& p) { return p.param == Backend::sqlite ? "Sqlite" : "Postgres"; });

TEST(SliceTag, IsStableAndSpreadsIds) {
  EXPECT_EQ(slice_tag("p-1", 4), slice_tag("p-1", 4));
  EXPECT_EQ(slice_tag("anything", 1), "payment-slice-0");
  std::map<std::string, int> seen;
  for (int i = 0; i < 400; ++i) seen[slice_tag("p" + std::to_string(i), 4)]++;
  EXPECT_EQ(seen.size(), 4u);
  for (const auto& [tag, n] : seen) EXPECT_GT(n, 50) << tag;
  // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c: a fixed function, not std::hash.
  EXPECT_EQ(slice_tag("a", 1000), "payment-slice-" + std::to_string(0xaf63dc4c8601ec8cull % 1000));
}

TEST(UtcDay, IsTheCalendarDayInUtc) {
  EXPECT_EQ(utc_day(0), "1970-01-01");
  EXPECT_EQ(utc_day(-1), "1969-12-31");
  EXPECT_EQ(utc_day(1'709'251'199'999), "2024-02-29");  // 23:59:59.999Z
  EXPECT_EQ(utc_day(1'709'251'200'000), "2024-03-01");
  EXPECT_TRUE(validate_day("2024-02-29").ok());
  EXPECT_FALSE(validate_day("2023-02-29").ok());
}

}  // namespace
