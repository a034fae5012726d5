// Clocks: the manual clock that makes every timeout testable, and the timer
// queue it drives.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/core/detail/timer_service.hpp"

// Before any using-directive of this file: troupe's headers bring no
// literals along, and troupe::literals offers every duration literal.
namespace literals_opt_in {
using namespace troupe::literals;

TEST(ClockLiterals, TroupeLiteralsOffersTheDurationLiteralsToCodeThatOptsIn) {
  EXPECT_EQ(troupe::Duration(1500ms), std::chrono::milliseconds(1500));
  EXPECT_EQ(troupe::Duration(2min + 5s), std::chrono::seconds(125));
  EXPECT_EQ(troupe::Duration(1h), std::chrono::hours(1));
  EXPECT_EQ(troupe::Duration(3us + 4ns), std::chrono::nanoseconds(3004));
}

}  // namespace literals_opt_in

namespace {

using namespace std::chrono_literals;
using troupe::Duration;
using troupe::ManualClock;
using troupe::TimePoint;
using troupe::WallTime;
using troupe::detail::TimerService;

// A listener with a fixed list of deadlines that records the clock's now()
// at each fire.
class Recorder : public ManualClock::Listener {
 public:
  explicit Recorder(ManualClock& c) : clock_(c) {}
  void add(TimePoint t) {
    pending_.push_back(t);
    std::sort(pending_.begin(), pending_.end());
  }
  TimePoint next_deadline() override { return pending_.empty() ? TimePoint::max() : pending_.front(); }
  void fire_due(TimePoint until) override {
    while (!pending_.empty() && pending_.front() <= until) {
      fired.emplace_back(pending_.front(), clock_.now());
      pending_.erase(pending_.begin());
    }
  }
  std::vector<std::pair<TimePoint, TimePoint>> fired;  // (deadline, now() at the fire)

 private:
  ManualClock& clock_;
  std::vector<TimePoint> pending_;
};

// proves: X3
TEST(ManualClock, time_moves_only_when_advanced) {
  ManualClock c;
  auto t0 = c.now();
  auto w0 = c.wall_now();
  std::this_thread::sleep_for(2ms);  // real time passes; virtual time must not
  EXPECT_EQ(c.now(), t0);
  EXPECT_EQ(c.wall_now(), w0);
  c.advance(1500ms);
  EXPECT_EQ(c.now(), t0 + 1500ms);
}

TEST(ManualClock, wall_time_moves_with_monotonic_time) {
  ManualClock c(WallTime{std::chrono::hours(24 * 365 * 50)});
  auto t0 = c.now();
  auto w0 = c.wall_now();
  EXPECT_EQ(w0, WallTime{std::chrono::hours(24 * 365 * 50)});
  c.advance(90min);
  EXPECT_EQ(c.now() - t0, 90min);
  EXPECT_EQ(c.wall_now() - w0, 90min);
}

TEST(ManualClock, set_wall_moves_wall_time_only) {
  ManualClock c;
  auto t0 = c.now();
  auto later = c.wall_now() + std::chrono::hours(24 * 30);
  c.set_wall(later);
  EXPECT_EQ(c.wall_now(), later);
  EXPECT_EQ(c.now(), t0);
  c.advance(1s);
  EXPECT_EQ(c.wall_now(), later + 1s);
}

TEST(ManualClock, advancing_by_zero_or_a_negative_amount_does_not_move_time) {
  ManualClock c;
  auto t0 = c.now();
  c.advance(0ms);
  c.advance(-5s);
  EXPECT_EQ(c.now(), t0);
}

// proves: X3
TEST(ManualClock, advance_stops_at_each_deadline_in_order_with_now_equal_to_it) {
  ManualClock c;
  Recorder r(c);
  c.add_listener(&r);
  auto t0 = c.now();
  for (auto d : {30ms, 10ms, 20ms, 20ms}) r.add(t0 + d);
  c.advance(25ms);
  ASSERT_EQ(r.fired.size(), 3u);
  EXPECT_EQ(r.fired[0], std::make_pair(t0 + 10ms, t0 + 10ms));
  EXPECT_EQ(r.fired[1], std::make_pair(t0 + 20ms, t0 + 20ms));
  EXPECT_EQ(r.fired[2], std::make_pair(t0 + 20ms, t0 + 20ms));
  EXPECT_EQ(c.now(), t0 + 25ms);
  c.advance(5ms);
  ASSERT_EQ(r.fired.size(), 4u);
  EXPECT_EQ(r.fired[3], std::make_pair(t0 + 30ms, t0 + 30ms));
  c.remove_listener(&r);
}

TEST(ManualClock, deadlines_of_several_listeners_interleave_in_time_order) {
  ManualClock c;
  Recorder a(c), b(c);
  c.add_listener(&a);
  c.add_listener(&b);
  auto t0 = c.now();
  a.add(t0 + 10ms);
  a.add(t0 + 30ms);
  b.add(t0 + 20ms);
  c.advance(30ms);
  ASSERT_EQ(a.fired.size(), 2u);
  ASSERT_EQ(b.fired.size(), 1u);
  // Each fire saw its own deadline as now(): b's fire at 20 came between a's.
  EXPECT_EQ(a.fired[0].second, t0 + 10ms);
  EXPECT_EQ(b.fired[0].second, t0 + 20ms);
  EXPECT_EQ(a.fired[1].second, t0 + 30ms);
  c.remove_listener(&a);
  c.remove_listener(&b);
}

TEST(ManualClock, a_removed_listener_is_not_fired) {
  ManualClock c;
  Recorder r(c);
  c.add_listener(&r);
  r.add(c.now() + 1ms);
  c.remove_listener(&r);
  c.advance(1s);
  EXPECT_TRUE(r.fired.empty());
}

// --- the timer queue on the manual clock ------------------------------------------------

// A timer node that records (its tag, now()) when it fires, and may schedule
// a follow-up from inside the fire.
class TestNode final : public TimerService::Node {
 public:
  struct Log {
    std::mutex mu;
    std::vector<std::pair<int, TimePoint>> fires;
  };
  TestNode(int tag, Log& log, TimerService& svc) : tag_(tag), log_(log), svc_(svc) {}
  void then(TestNode* n, Duration after) {
    next_ = n;
    after_ = after;
  }

 private:
  void fire() noexcept override {
    {
      std::lock_guard lk(log_.mu);
      log_.fires.emplace_back(tag_, svc_.clock().now());
    }
    if (next_) svc_.schedule(next_, svc_.clock().now() + after_);
  }
  int tag_;
  Log& log_;
  TimerService& svc_;
  TestNode* next_ = nullptr;
  Duration after_{};
};

class TimerQueue : public ::testing::Test {
 protected:
  TimerQueue() : clock(std::make_shared<ManualClock>()), svc(clock) { svc.start(); }
  ~TimerQueue() override {
    svc.stop();
    for (auto* n : nodes) n->release();
  }
  TestNode* node(int tag) {
    nodes.push_back(new TestNode(tag, log, svc));
    return nodes.back();
  }
  std::vector<int> tags() {
    std::vector<int> t;
    for (auto& f : log.fires) t.push_back(f.first);
    return t;
  }
  std::shared_ptr<ManualClock> clock;
  TimerService svc;
  TestNode::Log log;
  std::vector<TestNode*> nodes;
};

TEST_F(TimerQueue, fires_in_deadline_order_then_start_order_each_at_its_deadline) {
  auto t0 = clock->now();
  svc.schedule(node(3), t0 + 30ms);
  svc.schedule(node(1), t0 + 10ms);
  svc.schedule(node(2), t0 + 20ms);
  svc.schedule(node(4), t0 + 20ms);
  EXPECT_EQ(svc.pending(), 4u);
  clock->advance(30ms);
  EXPECT_EQ(tags(), (std::vector<int>{1, 2, 4, 3}));
  EXPECT_EQ(log.fires[0].second, t0 + 10ms);
  EXPECT_EQ(log.fires[1].second, t0 + 20ms);
  EXPECT_EQ(log.fires[3].second, t0 + 30ms);
  EXPECT_EQ(svc.pending(), 0u);
}

TEST_F(TimerQueue, a_timer_scheduled_by_a_fire_within_the_step_fires_in_the_same_advance) {
  auto t0 = clock->now();
  auto* first = node(1);
  first->then(node(2), 5ms);
  svc.schedule(first, t0 + 10ms);
  clock->advance(20ms);
  ASSERT_EQ(tags(), (std::vector<int>{1, 2}));
  EXPECT_EQ(log.fires[1].second, t0 + 15ms);
}

TEST_F(TimerQueue, a_cancelled_timer_never_fires_and_leaves_the_queue) {
  auto t0 = clock->now();
  auto* n = node(1);
  svc.schedule(n, t0 + 10ms);
  EXPECT_TRUE(svc.cancel(n));
  EXPECT_FALSE(svc.cancel(n));
  EXPECT_EQ(svc.pending(), 0u);
  clock->advance(1s);
  EXPECT_TRUE(log.fires.empty());
}

TEST_F(TimerQueue, rescheduling_a_queued_timer_moves_it) {
  auto t0 = clock->now();
  auto* n = node(1);
  svc.schedule(n, t0 + 10ms);
  svc.schedule(n, t0 + 50ms);
  EXPECT_EQ(svc.pending(), 1u);
  clock->advance(49ms);
  EXPECT_TRUE(log.fires.empty());
  clock->advance(1ms);
  EXPECT_EQ(tags(), std::vector<int>{1});
}

TEST_F(TimerQueue, a_periodic_timer_fires_every_interval_until_cancelled) {
  auto t0 = clock->now();
  auto* n = node(1);
  n->set_interval(10ms);
  svc.schedule(n, t0 + 10ms);
  clock->advance(35ms);
  ASSERT_EQ(log.fires.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(log.fires[i].second, t0 + static_cast<int>(i + 1) * 10ms);
  EXPECT_TRUE(svc.cancel(n));
  clock->advance(1s);
  EXPECT_EQ(log.fires.size(), 3u);
}

TEST_F(TimerQueue, stop_releases_what_is_still_queued) {
  for (int i = 0; i < 10; ++i) svc.schedule(node(i), clock->now() + 1h);
  EXPECT_EQ(svc.pending(), 10u);
  svc.stop();
  EXPECT_EQ(svc.pending(), 0u);
  clock->advance(2h);
  EXPECT_TRUE(log.fires.empty());
}

// --- the system clock -----------------------------------------------------------------

TEST(SystemClock, is_monotonic_and_its_wall_time_follows_the_system_clock) {
  auto c = troupe::SystemClock::instance();
  EXPECT_EQ(c, troupe::SystemClock::instance());
  EXPECT_FALSE(c->is_manual());
  auto a = c->now();
  auto b = c->now();
  EXPECT_LE(a, b);
  auto w = c->wall_now();
  auto sys = std::chrono::system_clock::now();
  EXPECT_LT(std::chrono::abs(sys - w), 5s);
}

TEST(SystemClock, a_system_without_a_clock_uses_it_and_a_timer_really_fires) {
  troupe::SystemConfig cfg;
  cfg.threads = 1;
  troupe::ActorSystem sys(cfg);
  EXPECT_FALSE(sys.clock().is_manual());
  struct Alarm : troupe::Actor<int> {
    explicit Alarm(std::shared_ptr<std::promise<void>> p) : done(std::move(p)) {}
    void on_start() { start_timer("t", 1ms, 1); }
    void receive(int&) { done->set_value(); }
    std::shared_ptr<std::promise<void>> done;
  };
  auto p = std::make_shared<std::promise<void>>();
  auto f = p->get_future();
  sys.spawn<Alarm>(p);
  EXPECT_EQ(f.wait_for(10s), std::future_status::ready);
}

}  // namespace

namespace {

TEST(CoarseClock, SystemCoarseNowIsNeverAheadAndLagsByATickAtMost) {
  auto clock = troupe::SystemClock::instance();
  for (int i = 0; i < 1000; ++i) {
    auto coarse = clock->coarse_now();
    auto fine = clock->now();
    EXPECT_LE(coarse, fine);
    EXPECT_LT(fine - coarse, std::chrono::milliseconds(50));  // a tick is a few ms; generous bound
  }
}

TEST(CoarseClock, ManualCoarseNowIsExact) {
  troupe::ManualClock clock;
  EXPECT_EQ(clock.coarse_now(), clock.now());
  clock.advance(std::chrono::milliseconds(3));
  EXPECT_EQ(clock.coarse_now(), clock.now());
}

}  // namespace
