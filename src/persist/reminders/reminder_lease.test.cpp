// Several reminder services on one store (reminder_service.hpp, SPEC R2):
// what one takes is claimed for its lease, so two services on one
// PostgreSQL schema or one SQLite file deliver each reminder once between
// them; a claim left by a service that stopped without recording is
// delivered again once the lease has passed; a page whose claim runs short
// in the queue is let go rather than delivered late. Manual clock.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../journal_test_support.hpp"
#include "../postgres/postgres_test_server.hpp"
#include "troupe/core.hpp"
#include "troupe/persist/reminder_service.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Future;
using troupe::Promise;
using troupe::Reminder;
using troupe::ReminderService;
using troupe::ReminderSettings;
using troupe::ReminderStore;

// Deliveries that wait to be answered: every service has taken (and
// claimed) its page before any of it is recorded.
class Held {
 public:
  troupe::ReminderDeliver deliver(int service) {
    return [this, service](const Reminder& r) -> Future<void> {
      Promise<void> p;
      Future<void> f = p.future();
      std::lock_guard lk(mu_);
      ++count_[r.name];
      ++by_service_[service];
      pending_.push_back(std::move(p));
      return f;
    };
  }
  // Answers every delivery waiting; how many there were.
  std::size_t answer_all() {
    std::vector<Promise<void>> now;
    {
      std::lock_guard lk(mu_);
      now.swap(pending_);
    }
    for (auto& p : now) p.set_value();
    return now.size();
  }
  std::map<std::string, int> count() const {
    std::lock_guard lk(mu_);
    return count_;
  }
  int by_service(int s) const {
    std::lock_guard lk(mu_);
    auto it = by_service_.find(s);
    return it == by_service_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, int> count_;
  std::map<int, int> by_service_;
  std::vector<Promise<void>> pending_;
};

class Lease : public troupe::testkit::ManualClockTest {
 protected:
  Lease() {
    settings.log = false;
    settings.max_per_second = 1e6;
    settings.burst = 50;
    settings.page_size = 50;
    settings.max_in_flight = 50;
  }
  std::int64_t wall() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(clock->wall_now().time_since_epoch()).count();
  }

  // Two services, each on a store of its own over one database (as two
  // nodes would be), deliver kCount due reminders.
  void two_services_deliver_each_once(const std::function<std::shared_ptr<ReminderStore>()>& open) {
    constexpr int kCount = 1000;
    auto writer = open();
    for (int i = 0; i < kCount; ++i)
      ASSERT_TRUE(writer->set({"pay|p" + std::to_string(i % 97), "r" + std::to_string(i), wall() - 1000 + i % 100, 0, {}})
                      .ok());
    Held held;
    auto a = ReminderService::start(system, open(), settings, held.deliver(0));
    auto b = ReminderService::start(system, open(), settings, held.deliver(1));
    ASSERT_TRUE(a.ok() && b.ok());
    settle();
    EXPECT_GT(held.by_service(0), 0) << "each took a page of its own";
    EXPECT_GT(held.by_service(1), 0);
    for (int round = 0; round < 200 && held.count().size() < static_cast<std::size_t>(kCount); ++round) {
      if (held.answer_all() == 0) advance_settled(settings.poll_interval);
      settle();
    }
    held.answer_all();
    settle();
    auto count = held.count();
    ASSERT_EQ(count.size(), static_cast<std::size_t>(kCount));
    int twice = 0;
    for (const auto& [name, n] : count) twice += n > 1 ? 1 : 0;
    EXPECT_EQ(twice, 0) << "reminders delivered by both services";
    EXPECT_EQ(a->stats().delivered + b->stats().delivered, static_cast<std::uint64_t>(kCount));
    EXPECT_FALSE(writer->summary(wall())->next_try_ms.has_value()) << "every firing recorded";
    a->stop();
    b->stop();
    settle();
  }

  ReminderSettings settings;
};

// proves: R2
TEST_F(Lease, two_services_on_one_postgres_schema_deliver_each_of_1000_reminders_exactly_once) {
  const std::string schema = troupe::test::fresh_schema();
  two_services_deliver_each_once([&] {
    return *troupe::open_postgres_reminder_store({.conninfo = troupe::test::shared_postgres_conninfo(), .schema = schema});
  });
}

// proves: R2
TEST_F(Lease, two_services_on_one_sqlite_file_deliver_each_of_1000_reminders_exactly_once) {
  troupe::test::TempDir dir;
  const std::string path = dir.file("r.db");
  two_services_deliver_each_once([&] { return *troupe::open_sqlite_reminder_store({.path = path, .full_sync = false}); });
}

// proves: R2
TEST_F(Lease, a_claim_left_by_a_service_that_stopped_without_recording_is_delivered_again_after_the_lease) {
  troupe::test::TempDir dir;
  const std::string path = dir.file("r.db");
  auto open = [&] { return *troupe::open_sqlite_reminder_store({.path = path, .full_sync = false}); };
  settings.attempt_timeout = 2s;
  settings.lease = 5s;
  ASSERT_TRUE(open()->set({"pay|p1", "expire", wall(), 0, {}}).ok());
  Held first;
  auto a = ReminderService::start(system, open(), settings, first.deliver(0));
  ASSERT_TRUE(a.ok());
  settle();
  ASSERT_EQ(first.count()["expire"], 1);
  a->stop();  // stopped mid-delivery: nothing recorded
  settle();
  first.answer_all();

  Held second;
  auto b = ReminderService::start(system, open(), settings, second.deliver(1));
  ASSERT_TRUE(b.ok());
  advance_settled(4999ms);
  EXPECT_EQ(second.count().size(), 0u) << "claimed by the stopped service until its lease ends";
  advance_settled(1ms);
  EXPECT_EQ(second.count()["expire"], 1) << "the lapsed claim is taken again";
  second.answer_all();
  settle();
  EXPECT_TRUE(open()->list("pay|p1")->empty());
  b->stop();
  settle();
}

// A page that waits in the queue (a slow rate) past the point where its
// claim could still cover a try is let go, not delivered late: the rest is
// taken again once the claim ends, and each reminder is delivered once.
// proves: R2
TEST_F(Lease, queued_reminders_whose_claim_runs_short_are_let_go_and_taken_again_after_it) {
  settings.max_per_second = 1;
  settings.burst = 1;
  settings.page_size = 10;
  settings.attempt_timeout = 2s;
  settings.lease = 5s;
  auto store = troupe::make_memory_reminder_store();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(store->set({"o", "r" + std::to_string(i), wall(), 0, {}}).ok());
  std::map<std::string, int> count;
  std::mutex mu;
  auto svc = ReminderService::start(system, store, settings, [&](const Reminder& r) {
    {
      std::lock_guard lk(mu);
      ++count[r.name];
    }
    Promise<void> p;
    Future<void> f = p.future();
    p.set_value();
    return f;
  });
  ASSERT_TRUE(svc.ok());
  advance_settled(3s);
  // At 0, 1 and 2 s one each; at 3 s only 2 s of the claim are left.
  EXPECT_EQ(svc->stats().delivered, 3u);
  EXPECT_EQ(svc->stats().lapsed, 7u);
  EXPECT_EQ(store->summary(wall())->due, 0u) << "still claimed until 5 s";
  advance_settled(30s);
  std::lock_guard lk(mu);
  ASSERT_EQ(count.size(), 10u);
  for (const auto& [name, n] : count) EXPECT_EQ(n, 1) << name;
  EXPECT_TRUE(store->list("o")->empty());
  svc->stop();
  settle();
}

}  // namespace
