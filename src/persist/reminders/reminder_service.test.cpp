// The reminder service (reminder_service.hpp) on the manual clock: due
// reminders are delivered once at their time, missed periods fire once,
// cancel and replace take effect, the rate is bounded, failed deliveries are
// retried with a back-off, a new service picks up what a stopped one left,
// 100,000 reminders due during an outage are delivered once each at the
// configured rate with one page in memory, and an entity's reminder
// re-activates it after passivation.

#include "troupe/persist/reminder_service.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "../journal_test_support.hpp"
#include "../postgres/postgres_test_server.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Duration;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Future;
using troupe::Promise;
using troupe::Reminder;
using troupe::ReminderService;
using troupe::ReminderSettings;
using troupe::ReminderSpec;
using troupe::ReminderStore;
using troupe::TimePoint;

std::int64_t ms(troupe::WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// What a Deliver saw, when (the manual clock), and how it answers: the
// first `failures` deliveries fail.
class Inbox {
 public:
  struct Got {
    Reminder reminder;
    TimePoint at;
    std::int64_t wall_ms = 0;
  };

  troupe::ReminderDeliver deliver(std::shared_ptr<troupe::ManualClock> clock, int failures = 0,
                                  std::function<void()> on_call = {}) {
    return [this, clock, failures, on_call](const Reminder& r) -> Future<void> {
      Promise<void> p;
      Future<void> f = p.future();
      bool fail = false;
      {
        std::lock_guard lk(mu_);
        fail = calls_++ < failures;
        if (!fail) got_.push_back(Got{r, clock->now(), ms(clock->wall_now())});
      }
      if (on_call) on_call();
      if (fail) {
        p.set_error(Error(ErrorCode::unreachable, "the entity's node is down"));
      } else {
        p.set_value();
      }
      return f;
    };
  }
  std::vector<Got> got() const {
    std::lock_guard lk(mu_);
    return got_;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return got_.size();
  }
  int calls() const {
    std::lock_guard lk(mu_);
    return calls_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Got> got_;
  int calls_ = 0;
};

class Service : public troupe::testkit::ManualClockTest {
 protected:
  Service() {
    settings.log = false;
    settings.max_per_second = 1000;
    settings.burst = 100;
    settings.page_size = 100;
    settings.min_backoff = 1s;
    settings.max_backoff = 8s;
    settings.poll_interval = 1s;
  }
  ReminderService start(int failures = 0) {
    auto s = ReminderService::start(system, store, settings, inbox.deliver(clock, failures));
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    settle();
    return *s;
  }
  std::int64_t wall() const { return ms(clock->wall_now()); }
  void set(std::string owner, std::string name, std::int64_t due, std::int64_t period = 0, std::string payload = {}) {
    ASSERT_TRUE(store->set(ReminderSpec{std::move(owner), std::move(name), due, period, std::move(payload)}).ok());
  }

  void outage(std::shared_ptr<ReminderStore> target);
  void restart(const std::function<std::shared_ptr<ReminderStore>()>& open);

  std::shared_ptr<ReminderStore> store = troupe::make_memory_reminder_store();
  ReminderSettings settings;
  Inbox inbox;
};

// proves: R2
TEST_F(Service, a_reminder_is_delivered_at_its_due_time_once_and_then_deleted) {
  auto svc = start();
  auto handle = svc.handle();
  ASSERT_TRUE(handle.set("pay|p1", "expire", clock->wall_now() + 5s, Duration::zero(), "why").get().ok());
  advance_settled(4999ms);
  EXPECT_EQ(inbox.size(), 0u);
  advance_settled(1ms);
  ASSERT_EQ(inbox.size(), 1u);
  EXPECT_EQ(inbox.got()[0].reminder.owner, "pay|p1");
  EXPECT_EQ(inbox.got()[0].reminder.payload, "why");
  advance_settled(10s);
  EXPECT_EQ(inbox.size(), 1u);
  EXPECT_TRUE(store->list("pay|p1")->empty());
  EXPECT_EQ(svc.stats().delivered, 1u);
}

// proves: R2
TEST_F(Service, a_periodic_reminder_that_missed_many_periods_fires_once_then_on_its_boundaries) {
  const std::int64_t start_ms = wall();
  set("o", "tick", start_ms - 10'500, 1000);  // ten periods missed before the service runs
  auto svc = start();
  ASSERT_EQ(inbox.size(), 1u);
  EXPECT_EQ(inbox.got()[0].reminder.due_ms, start_ms - 10'500);
  EXPECT_EQ(store->list("o")->at(0).due_ms, start_ms + 500);
  advance_settled(499ms);
  EXPECT_EQ(inbox.size(), 1u);
  advance_settled(1ms);
  EXPECT_EQ(inbox.size(), 2u);
  advance_settled(1000ms);
  EXPECT_EQ(inbox.size(), 3u);
  EXPECT_EQ(inbox.got()[2].wall_ms, start_ms + 1500);
}

TEST_F(Service, a_cancelled_reminder_is_not_delivered_and_a_replaced_one_is_delivered_as_replaced) {
  auto svc = start();
  auto h = svc.handle();
  ASSERT_TRUE(h.set("o", "a", clock->wall_now() + 2s).get().ok());
  ASSERT_TRUE(h.set("o", "b", clock->wall_now() + 10s, Duration::zero(), "old").get().ok());
  auto cancelled = h.cancel("o", "a").get();
  ASSERT_TRUE(cancelled.ok());
  EXPECT_TRUE(*cancelled);
  EXPECT_FALSE(*h.cancel("o", "a").get());
  ASSERT_TRUE(h.set("o", "b", clock->wall_now() + 3s, Duration::zero(), "new").get().ok());
  advance_settled(3s);
  ASSERT_EQ(inbox.size(), 1u);
  EXPECT_EQ(inbox.got()[0].reminder.name, "b");
  EXPECT_EQ(inbox.got()[0].reminder.payload, "new");
  advance_settled(10s);
  EXPECT_EQ(inbox.size(), 1u);
}

TEST_F(Service, deliveries_keep_to_the_rate_after_the_burst) {
  settings.max_per_second = 10;
  settings.burst = 2;
  for (int i = 0; i < 20; ++i) set("o", "r" + std::to_string(i), wall());
  const TimePoint t0 = now();
  auto svc = start();
  advance_settled(3s);
  auto got = inbox.got();
  ASSERT_EQ(got.size(), 20u);
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double secs = std::chrono::duration<double>(got[k].at - t0).count();
    EXPECT_LE(static_cast<double>(k + 1), 2 + 10 * secs + 1e-6) << "delivery " << k << " at " << secs << " s";
  }
  const double last = std::chrono::duration<double>(got.back().at - t0).count();
  EXPECT_NEAR(last, 1.8, 0.11);  // 18 after the burst of 2, at 10 a second
}

// proves: R2
TEST_F(Service, a_failed_delivery_is_retried_with_a_growing_back_off_and_never_dropped) {
  set("o", "r", wall());
  const std::int64_t t0 = wall();
  auto svc = start(/*failures=*/3);
  EXPECT_EQ(inbox.calls(), 1);
  EXPECT_EQ(store->list("o")->at(0).attempts, 1u);
  advance_settled(1s);  // back-off 1 s
  EXPECT_EQ(inbox.calls(), 2);
  advance_settled(2s - 1ms);  // then 2 s
  EXPECT_EQ(inbox.calls(), 2);
  advance_settled(1ms);
  EXPECT_EQ(inbox.calls(), 3);
  advance_settled(4s);  // then 4 s: this one succeeds
  EXPECT_EQ(inbox.calls(), 4);
  ASSERT_EQ(inbox.size(), 1u);
  EXPECT_EQ(inbox.got()[0].wall_ms, t0 + 7000);
  EXPECT_TRUE(store->list("o")->empty());
  auto st = svc.stats();
  EXPECT_EQ(st.failed, 3u);
  EXPECT_EQ(st.retried, 3u);
  EXPECT_EQ(st.delivered, 1u);
}

TEST_F(Service, a_delivery_that_never_answers_times_out_and_is_tried_again) {
  settings.attempt_timeout = 2s;
  set("o", "r", wall());
  int calls = 0;
  std::vector<Promise<void>> held;
  auto s = ReminderService::start(system, store, settings, [&](const Reminder&) -> Future<void> {
    Promise<void> p;
    Future<void> f = p.future();
    if (calls++ == 0) {
      held.push_back(std::move(p));  // never answered
    } else {
      p.set_value();
    }
    return f;
  });
  ASSERT_TRUE(s.ok());
  settle();
  advance_settled(2s);
  EXPECT_EQ(s->stats().timeouts, 1u);
  advance_settled(1s);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(s->stats().delivered, 1u);
  EXPECT_TRUE(store->list("o")->empty());
}

// A store that reads but cannot record, until told.
class CannotRecord final : public ReminderStore {
 public:
  explicit CannotRecord(std::shared_ptr<ReminderStore> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> broken{true};
  std::string_view kind() const noexcept override { return "broken"; }
  troupe::Result<void> set(const ReminderSpec& s) override { return inner_->set(s); }
  troupe::Result<bool> cancel(std::string_view o, std::string_view n) override { return inner_->cancel(o, n); }
  troupe::Result<std::vector<Reminder>> list(std::string_view o) override { return inner_->list(o); }
  troupe::Result<std::vector<Reminder>> take_due(std::int64_t now_ms, std::size_t limit, std::int64_t lease_ms) override {
    return inner_->take_due(now_ms, limit, lease_ms);
  }
  troupe::Result<bool> record_fired(const Reminder& r, std::int64_t t) override {
    if (broken) return Error(ErrorCode::journal_failed, "disk full");
    return inner_->record_fired(r, t);
  }
  troupe::Result<bool> record_failed(const Reminder& r, std::int64_t t, std::string_view e) override {
    if (broken) return Error(ErrorCode::journal_failed, "disk full");
    return inner_->record_failed(r, t, e);
  }
  troupe::Result<troupe::ReminderSummary> summary(std::int64_t now_ms) override { return inner_->summary(now_ms); }

 private:
  std::shared_ptr<ReminderStore> inner_;
};

// A firing whose record fails is delivered again (at least once), but only
// once its claim lapsed, not in a loop.
TEST_F(Service, a_firing_the_store_cannot_record_is_delivered_again_once_its_claim_lapses_not_in_a_loop) {
  settings.attempt_timeout = 2s;
  settings.lease = 5s;
  auto broken = std::make_shared<CannotRecord>(store);
  store = broken;
  set("o", "r", wall());
  auto svc = start();
  EXPECT_EQ(inbox.calls(), 1);
  EXPECT_EQ(svc.stats().store_errors, 1u);
  broken->broken = false;
  advance_settled(4999ms);
  EXPECT_EQ(inbox.calls(), 1) << "still claimed by the try whose record failed";
  advance_settled(1ms);
  EXPECT_EQ(inbox.calls(), 2) << "delivered again: the first firing was not recorded";
  EXPECT_TRUE(store->list("o")->empty());
  advance_settled(5s);
  EXPECT_EQ(inbox.calls(), 2);
}

TEST_F(Service, a_handle_without_a_running_service_answers_with_an_error_at_once) {
  auto svc = start();
  auto h = svc.handle();
  svc.stop();
  settle();
  auto r = h.set("o", "r", clock->wall_now() + 1s).get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(h.cancel("o", "r").get().error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(troupe::Reminders().set("o", "r", clock->wall_now()).get().error().code(), ErrorCode::shutting_down);
  EXPECT_TRUE(store->list("o")->empty());
}

TEST_F(Service, bad_settings_are_refused) {
  auto deliver = inbox.deliver(clock);
  auto bad = [&](auto change) {
    ReminderSettings s = settings;
    change(s);
    auto r = ReminderService::start(system, store, s, deliver);
    return !r.ok() && r.error().code() == ErrorCode::invalid_argument;
  };
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.max_per_second = 0; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.max_per_second = -1; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.page_size = 0; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.max_in_flight = 0; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.max_backoff = 0s; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.backoff_factor = 0.5; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.lease = s.attempt_timeout; }));
  EXPECT_TRUE(bad([](ReminderSettings& s) { s.lease = 0s; }));
  EXPECT_FALSE(ReminderService::start(system, nullptr, settings, deliver).ok());
  EXPECT_FALSE(ReminderService::start(system, store, settings, nullptr).ok());
}

// A service over a database is stopped and its store closed; a new service
// on a new connection to the same database delivers what it left (due while
// nothing ran, and later).
void Service::restart(const std::function<std::shared_ptr<ReminderStore>()>& open) {
  store = open();
  auto svc = start();
  ASSERT_TRUE(svc.handle().set("pay|a", "x", clock->wall_now() + 1s).get().ok());
  ASSERT_TRUE(svc.handle().set("pay|b", "y", clock->wall_now() + 20s, 10s).get().ok());
  svc.stop();
  settle();
  store.reset();
  advance_settled(30s);
  EXPECT_EQ(inbox.size(), 0u);

  store = open();
  auto again = start();
  ASSERT_EQ(inbox.size(), 2u);
  EXPECT_EQ(inbox.got()[0].reminder.name, "x");
  EXPECT_EQ(inbox.got()[1].reminder.name, "y");
  advance_settled(10s);
  EXPECT_EQ(inbox.size(), 3u);  // y's next period
}

// proves: R2
TEST_F(Service, a_new_service_over_the_same_sqlite_file_delivers_what_the_stopped_one_left) {
  troupe::test::TempDir dir;
  restart([&] { return *troupe::open_sqlite_reminder_store({.path = dir.file("r.db")}); });
}

TEST_F(Service, a_new_service_over_the_same_postgres_schema_delivers_what_the_stopped_one_left) {
  const std::string schema = troupe::test::fresh_schema();
  restart([&] {
    return *troupe::open_postgres_reminder_store({.conninfo = troupe::test::shared_postgres_conninfo(), .schema = schema});
  });
}

// The bar: 100,000 reminders fall due during a 60 s outage (no service).
// Then one service starts at 1,000 a second with pages of 1,000: each is
// delivered exactly once, never faster than the rate, all within 100 s and
// a little, and never more than one page held in memory.
void Service::outage(std::shared_ptr<ReminderStore> target) {
  constexpr int kCount = 100'000;
  const std::int64_t outage_start = ms(clock->wall_now());
  for (int i = 0; i < kCount; ++i)
    ASSERT_TRUE(target->set(ReminderSpec{"pay|p" + std::to_string(i % 5000), "r" + std::to_string(i),
                                        outage_start + (60'000LL * i) / kCount, i % 10 == 0 ? 30'000 : 0, {}})
                    .ok());
  clock->advance(60s);

  ReminderSettings s;
  s.log = false;
  s.max_per_second = 1000;
  s.burst = 100;
  s.page_size = 1000;
  Inbox box;
  std::uint64_t most_held = 0;
  std::optional<ReminderService> svc;
  std::mutex mu;
  auto deliver = box.deliver(clock, 0, [&] {
    std::lock_guard lk(mu);
    if (svc) most_held = std::max(most_held, svc->stats().held);
  });
  const TimePoint t0 = clock->now();
  {
    std::lock_guard lk(mu);
    auto r = ReminderService::start(system, target, s, deliver);
    ASSERT_TRUE(r.ok());
    svc.emplace(*r);
  }
  settle();
  {
    std::lock_guard lk(mu);
    auto first = svc->stats();
    EXPECT_EQ(first.due_now, static_cast<std::uint64_t>(kCount)) << "all due, counted when the first page was taken";
    EXPECT_EQ(first.oldest_lag_ms, 60'000) << "the oldest fell due when the outage began";
    EXPECT_EQ(first.delivered, 100u) << "the first burst, at once";
  }
  for (int step = 0; step < 1200 && box.size() < static_cast<std::size_t>(kCount); ++step) advance_settled(100ms);
  auto got = box.got();
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kCount));
  std::vector<int> seen(kCount, 0);
  for (std::size_t k = 0; k < got.size(); ++k) {
    ++seen[std::stoi(got[k].reminder.name.substr(1))];
    const double secs = std::chrono::duration<double>(got[k].at - t0).count();
    ASSERT_LE(static_cast<double>(k + 1), 100 + 1000 * secs + 1e-6) << "delivery " << k << " at " << secs << " s";
  }
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(seen[i], 1) << "reminder r" << i;
  const double last = std::chrono::duration<double>(got.back().at - t0).count();
  EXPECT_GE(last, 99.9 - 1e-6);
  EXPECT_LE(last, 101.0) << "slower than the configured rate";
  auto st = svc->stats();
  EXPECT_EQ(st.delivered, static_cast<std::uint64_t>(kCount));
  EXPECT_LE(st.max_held, s.page_size);
  EXPECT_LE(most_held, s.page_size);
  // The periodic tenth is still there, each once, due after the recovery.
  auto sum = target->summary(ms(clock->wall_now()));
  ASSERT_TRUE(sum.ok());
  EXPECT_GT(*sum->next_try_ms, outage_start + 60'000);
  svc->stop();
  settle();
}

// proves: R2
TEST_F(Service, R2_100000_reminders_due_in_a_60s_outage_are_each_delivered_once_at_the_rate_with_one_page_held) {
  outage(store);
}

// proves: R2
TEST_F(Service, R2_on_sqlite_100000_reminders_due_in_a_60s_outage_are_each_delivered_once_at_the_rate) {
  troupe::test::TempDir dir;
  outage(*troupe::open_sqlite_reminder_store({.path = dir.file("r.db"), .full_sync = false}));
}

}  // namespace
