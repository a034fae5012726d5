// Shutdown and lifetimes: draining, stopping every actor, and references and
// reply targets that outlive the system.
// Shutdown lets queued work finish, then stops every actor with on_stop
// (the entities' graceful stop, E6, runs before it in a shutdown hook);
// late use of a dead system is a value, not a crash.


#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::ActorSystem;
using troupe::Delivery;
using troupe::ErrorCode;
using troupe::ReplyTo;
using troupe::SpawnOptions;
using troupe::testkit::Gate;
using troupe::testkit::TestProbe;

troupe::SystemConfig config(std::shared_ptr<troupe::Clock> clock = {}) {
  troupe::SystemConfig c;
  c.threads = 2;
  c.clock = std::move(clock);
  c.log_dead_letters = false;
  c.log_failures = false;
  return c;
}

struct Counters {
  std::atomic<int> handled{0};
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::atomic<int> constructed{0};
  std::atomic<int> destroyed{0};
};

struct Hold {
  Gate* entered = nullptr;
  Gate* release = nullptr;
};
struct Keep {
  ReplyTo<int> reply;
};
using WorkMsg = std::variant<int, Hold, Keep>;

// Counts what it handles; forwards ints to `next` if it has one; spawns
// `children` children of its own kind at start.
struct Worker : troupe::Actor<WorkMsg> {
  Worker(std::shared_ptr<Counters> c, ActorRef<WorkMsg> n, int kids)
      : counters(std::move(c)), next(std::move(n)), children(kids) {
    counters->constructed.fetch_add(1);
  }
  ~Worker() { counters->destroyed.fetch_add(1); }
  void on_start() {
    counters->started.fetch_add(1);
    for (int i = 0; i < children; ++i) spawn<Worker>(counters, ActorRef<WorkMsg>{}, 0);
    start_timer("far", 1h, 0);  // a pending timer must not hold shutdown up
  }
  void on_stop() { counters->stopped.fetch_add(1); }
  void receive(WorkMsg& m) {
    troupe::match(
        m,
        [&](int n) {
          counters->handled.fetch_add(1);
          if (next) next.tell(n);
        },
        [&](Hold& h) {
          h.entered->open();
          ASSERT_TRUE(h.release->wait());
        },
        [&](Keep& k) { kept.push_back(std::move(k.reply)); });
  }
  std::shared_ptr<Counters> counters;
  ActorRef<WorkMsg> next;
  int children;
  std::vector<ReplyTo<int>> kept;
};

TEST(Shutdown, lets_queued_messages_be_handled_then_stops_every_actor_with_on_stop) {
  auto counters = std::make_shared<Counters>();
  ActorSystem sys(config());
  std::vector<ActorRef<WorkMsg>> top;
  for (int i = 0; i < 3; ++i) top.push_back(sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 2));
  for (auto& a : top)
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.tell(i), Delivery::delivered);
  sys.shutdown();
  EXPECT_EQ(counters->handled.load(), 3000);
  EXPECT_EQ(counters->started.load(), 9);
  EXPECT_EQ(counters->stopped.load(), 9) << "on_stop runs for every actor, children included";
  EXPECT_EQ(sys.stats().actors_live, 0u);
  EXPECT_EQ(sys.stats().timers_pending, 0u);
  for (auto& a : top) EXPECT_TRUE(a.terminated());
}

TEST(Shutdown, actors_may_still_message_each_other_while_the_system_drains) {
  auto counters = std::make_shared<Counters>();
  ActorSystem sys(config());
  auto last = sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 0);
  auto first = sys.spawn<Worker>(counters, last, 0);
  Gate entered, release;
  first.tell(Hold{&entered, &release});
  ASSERT_TRUE(entered.wait());
  for (int i = 0; i < 100; ++i) first.tell(i);
  std::thread stopper([&] { sys.shutdown(); });
  // Once shutdown has begun, outside tells are refused...
  for (auto until = std::chrono::steady_clock::now() + 10s;
       first.tell(-1) == Delivery::delivered && std::chrono::steady_clock::now() < until;)
    std::this_thread::yield();
  EXPECT_EQ(first.tell(-1), Delivery::dead_letter);
  release.open();
  stopper.join();
  // ...but what was queued ran, including the forwards from first to last.
  EXPECT_GE(counters->handled.load(), 200);
  EXPECT_EQ(counters->handled.load() % 2, 0) << "a forward inside the drain was lost";
}

TEST(Shutdown, a_second_shutdown_and_the_destructor_after_it_are_harmless) {
  auto counters = std::make_shared<Counters>();
  {
    ActorSystem sys(config());
    sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 1);
    sys.shutdown();
    sys.shutdown();
  }
  EXPECT_EQ(counters->stopped.load(), 2);
  EXPECT_EQ(counters->destroyed.load(), counters->constructed.load());
}

TEST(Shutdown, tells_after_shutdown_are_dead_letters) {
  auto counters = std::make_shared<Counters>();
  ActorSystem sys(config());
  auto a = sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 0);
  sys.shutdown();
  EXPECT_EQ(a.tell(1), Delivery::dead_letter);
  EXPECT_EQ(sys.stats().dead_letters, 1u);
  EXPECT_EQ(counters->handled.load(), 0);
}

TEST(Shutdown, an_ask_after_shutdown_fails_at_once_instead_of_hanging) {
  auto counters = std::make_shared<Counters>();
  ActorSystem sys(config());
  auto a = sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 0);
  sys.shutdown();
  auto f = sys.ask<int>(a, [](ReplyTo<int> r) { return Keep{std::move(r)}; }, 1h);
  ASSERT_TRUE(f.ready()) << "nothing is left to answer or time out this ask";
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.error().code() == ErrorCode::shutting_down || r.error().code() == ErrorCode::dead_letter)
      << r.error().to_string();
}

TEST(Shutdown, spawn_after_shutdown_returns_an_empty_ref_and_frees_the_object) {
  auto counters = std::make_shared<Counters>();
  ActorSystem sys(config());
  sys.shutdown();
  auto a = sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 0);
  EXPECT_FALSE(a);
  EXPECT_EQ(a.tell(1), Delivery::dead_letter);
  EXPECT_EQ(counters->started.load(), 0);
  EXPECT_EQ(counters->destroyed.load(), counters->constructed.load());
  EXPECT_EQ(sys.stats().actors_live, 0u);
}

TEST(Shutdown, destroying_a_system_with_busy_actors_is_clean) {
  auto counters = std::make_shared<Counters>();
  auto clock = std::make_shared<troupe::ManualClock>();
  {
    ActorSystem sys(config(clock));
    for (int i = 0; i < 10; ++i) {
      auto a = sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 3);
      for (int j = 0; j < 100; ++j) a.tell(j);
    }
  }  // no shutdown(): the destructor does it
  EXPECT_EQ(counters->started.load(), 40);
  EXPECT_EQ(counters->stopped.load(), 40);
  EXPECT_EQ(counters->handled.load(), 1000);
  EXPECT_EQ(counters->destroyed.load(), counters->constructed.load());
  clock->advance(2h);  // the system's timers are gone with it
}

TEST(Shutdown, a_pending_ask_is_answered_no_reply_when_the_system_goes_away) {
  auto counters = std::make_shared<Counters>();
  auto clock = std::make_shared<troupe::ManualClock>();
  std::optional<troupe::Future<int>> f;
  {
    ActorSystem sys(config(clock));
    auto a = sys.spawn<Worker>(counters, ActorRef<WorkMsg>{}, 0);
    f.emplace(sys.ask<int>(a, [](ReplyTo<int> r) { return Keep{std::move(r)}; }, 1h));
    ASSERT_TRUE(sys.wait_idle());
  }
  ASSERT_TRUE(f->wait_for(10s)) << "a future outlived its system unanswered";
  auto r = f->get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::no_reply);
}

TEST(Shutdown, a_ref_outliving_its_system_tells_dead_letter_and_never_crashes) {
  auto counters = std::make_shared<Counters>();
  ActorRef<WorkMsg> survivor;
  {
    ActorSystem sys(config());
    survivor = sys.spawn<Worker>(SpawnOptions{.name = "survivor"}, counters, ActorRef<WorkMsg>{}, 0);
  }
  EXPECT_TRUE(survivor.terminated());
  EXPECT_EQ(survivor.tell(1), Delivery::dead_letter);
  survivor.stop();
  EXPECT_EQ(survivor.name(), "survivor");
  troupe::AnyRef any(survivor);
  survivor = {};
  EXPECT_TRUE(any.terminated());
}

// A reply target handed to a thread outside the system ("usable from any
// thread") may be answered after the system is gone.
// Regression (heap-use-after-free under ASan until d18dde2: the reply
// cancelled its timeout in the freed system's timer queue).
TEST(Shutdown, a_reply_after_the_system_is_gone_is_harmless) {
  struct Grab : troupe::Actor<Keep> {
    explicit Grab(std::shared_ptr<std::vector<ReplyTo<int>>> o) : out(std::move(o)) {}
    void receive(Keep& k) { out->push_back(std::move(k.reply)); }
    std::shared_ptr<std::vector<ReplyTo<int>>> out;
  };
  auto grabbed = std::make_shared<std::vector<ReplyTo<int>>>();
  std::optional<troupe::Future<int>> f;
  {
    ActorSystem sys(config());
    auto g = sys.spawn<Grab>(grabbed);
    f.emplace(sys.ask<int>(g, [](ReplyTo<int> r) { return Keep{std::move(r)}; }, 1h));
    ASSERT_TRUE(sys.wait_idle());
    ASSERT_EQ(grabbed->size(), 1u);
  }
  (*grabbed)[0].reply(5);  // the system, its timer queue included, is gone
  auto r = f->get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
}

TEST(Shutdown, watchers_in_another_system_hear_reason_shutdown) {
  // The watcher lives in a second system so that it outlives the first.
  ActorSystem observers(config());
  TestProbe<troupe::Down> downs(observers);
  auto counters = std::make_shared<Counters>();
  {
    ActorSystem sys(config());
    auto a = sys.spawn<Worker>(SpawnOptions{.name = "a"}, counters, ActorRef<WorkMsg>{}, 0);
    downs.watch(a);
    ASSERT_TRUE(observers.wait_idle());
    ASSERT_TRUE(sys.wait_idle());
    EXPECT_EQ(sys.stats().timers_pending, 1u);
  }
  auto d = downs.expect_message();
  EXPECT_EQ(d.reason, troupe::ExitReason::shutdown);
  EXPECT_EQ(d.actor.name(), "a");
}

// A restart back-off is a timer; shutdown must not wait for it (or, on a
// manual clock, forever): the suspended actor is stopped like the others.
struct Fragile : troupe::Actor<int> {
  explicit Fragile(std::shared_ptr<Counters> c) : counters(std::move(c)) {}
  void on_stop() { counters->stopped.fetch_add(1); }
  void receive(int&) { throw std::runtime_error("boom"); }
  std::shared_ptr<Counters> counters;
};

// Regression (until d18dde2 shutdown waited the whole drain timeout, the
// actor never terminated and LeakSanitizer reported the cell and system).
TEST(Shutdown, an_actor_waiting_out_a_restart_back_off_is_stopped_promptly) {
  auto clock = std::make_shared<troupe::ManualClock>();
  auto counters = std::make_shared<Counters>();
  auto cfg = config(clock);
  cfg.shutdown_drain_timeout = 2s;
  ActorSystem sys(cfg);
  troupe::RestartPolicy p;
  p.min_backoff = 1h;
  auto a = sys.spawn<Fragile>(SpawnOptions{.name = "fragile", .supervision = troupe::Supervision::restart(p)},
                              counters);
  a.tell(1);
  ASSERT_TRUE(sys.wait_idle());
  auto t0 = std::chrono::steady_clock::now();
  sys.shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "shutdown waited for the back-off";
  EXPECT_TRUE(a.terminated());
  EXPECT_EQ(sys.stats().actors_live, 0u);
}

}  // namespace
