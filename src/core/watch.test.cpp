// Watch: termination notices (Down).

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::AnyRef;
using troupe::Down;
using troupe::ExitReason;
using troupe::SpawnOptions;
using troupe::testkit::Gate;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

using Report = std::variant<Down, int>;

// Tells `to` whatever int it gets; -1 stops it, 13 throws.
struct Target : troupe::Actor<int> {
  explicit Target(ActorRef<Report> t) : to(std::move(t)) {}
  void receive(int& n) {
    if (n == 13) throw std::runtime_error("thirteen");
    if (to) to.tell(n);
    if (n == -1) stop();
  }
  ActorRef<Report> to;
};

struct WatchCmd {
  ActorRef<int> target;
};
struct UnwatchCmd {
  ActorRef<int> target;
};
struct Hold {
  Gate* entered = nullptr;
  Gate* release = nullptr;
  ActorRef<int> unwatch_after;
};
using WatcherMsg = std::variant<WatchCmd, UnwatchCmd, Down, Hold, int>;

// Watches on command and reports every Down (and int) it gets.
struct Watcher : troupe::Actor<WatcherMsg> {
  explicit Watcher(ActorRef<Report> o) : out(std::move(o)) {}
  void receive(WatcherMsg& m) {
    troupe::match(
        m, [&](WatchCmd& c) { watch(c.target); }, [&](UnwatchCmd& c) { unwatch(c.target); },
        [&](Down& d) { out.tell(d); }, [&](int n) { out.tell(n); },
        [&](Hold& h) {
          h.entered->open();
          ASSERT_TRUE(h.release->wait());
          if (h.unwatch_after) unwatch(h.unwatch_after);
        });
  }
  ActorRef<Report> out;
};

class Watch : public ManualClockTest {
 protected:
  Watch() : reports(system, "reports") {}
  ActorRef<int> spawn_target(std::string name = "target") {
    return system.spawn<Target>(SpawnOptions{.name = std::move(name)}, ActorRef<Report>{});
  }
  ActorRef<WatcherMsg> spawn_watcher() { return system.spawn<Watcher>(reports.ref()); }
  TestProbe<Report> reports;
};

TEST_F(Watch, a_stopped_target_s_watcher_gets_one_down_with_reason_normal) {
  auto target = spawn_target();
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  settle();
  target.stop();
  auto d = reports.expect<Down>();
  EXPECT_EQ(d.actor, AnyRef(target));
  EXPECT_EQ(d.actor.name(), "target");
  EXPECT_EQ(d.reason, ExitReason::normal);
  EXPECT_TRUE(d.detail.empty());
  settle();
  EXPECT_EQ(reports.pending(), 0u) << "more than one notice";
}

TEST_F(Watch, watching_twice_still_gives_one_notice) {
  auto target = spawn_target();
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  w.tell(WatchCmd{target});
  settle();
  target.stop();
  (void)reports.expect<Down>();
  settle();
  EXPECT_EQ(reports.pending(), 0u);
}

TEST_F(Watch, watching_an_actor_that_already_terminated_delivers_the_notice_at_once) {
  auto target = spawn_target();
  target.stop();
  settle();
  ASSERT_TRUE(target.terminated());
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  auto d = reports.expect<Down>();
  EXPECT_EQ(d.actor, AnyRef(target));
  EXPECT_EQ(d.reason, ExitReason::normal);
}

TEST_F(Watch, unwatch_prevents_the_notice) {
  auto target = spawn_target();
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  w.tell(UnwatchCmd{target});
  settle();
  target.stop();
  settle();
  EXPECT_TRUE(target.terminated());
  EXPECT_EQ(reports.pending(), 0u);
}

TEST_F(Watch, unwatch_prevents_a_notice_that_is_already_in_the_mailbox) {
  auto target = spawn_target();
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  settle();
  auto live = system.stats().actors_live;
  Gate entered, release;
  w.tell(Hold{&entered, &release, target});
  ASSERT_TRUE(entered.wait());
  target.stop();
  // The notice is pushed before the runtime counts the target as gone.
  for (auto until = std::chrono::steady_clock::now() + 10s;
       system.stats().actors_live == live && std::chrono::steady_clock::now() < until;)
    std::this_thread::yield();
  ASSERT_EQ(system.stats().actors_live, live - 1);
  release.open();  // the handler unwatches; then the queued Down runs
  settle();
  EXPECT_EQ(reports.pending(), 0u);
}

TEST_F(Watch, a_failed_target_s_notice_carries_reason_failure_and_the_what) {
  auto target = spawn_target();
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  settle();
  target.tell(13);
  auto d = reports.expect<Down>();
  EXPECT_EQ(d.reason, ExitReason::failure);
  EXPECT_EQ(d.detail, "thirteen");
}

TEST_F(Watch, every_watcher_is_notified) {
  auto target = spawn_target();
  std::vector<ActorRef<WatcherMsg>> ws;
  for (int i = 0; i < 5; ++i) ws.push_back(spawn_watcher());
  for (auto& w : ws) w.tell(WatchCmd{target});
  settle();
  target.stop();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(reports.expect<Down>().actor, AnyRef(target));
  settle();
  EXPECT_EQ(reports.pending(), 0u);
}

TEST_F(Watch, the_notice_comes_after_every_message_the_target_sent_before_stopping) {
  auto w = spawn_watcher();
  // The target reports to the watcher, which forwards to the probe.
  struct Relay : troupe::Actor<int> {
    explicit Relay(ActorRef<WatcherMsg> w) : watcher(std::move(w)) {}
    void receive(int& n) {
      for (int i = 0; i < 100; ++i) watcher.tell(i);
      if (n == -1) stop();
    }
    ActorRef<WatcherMsg> watcher;
  };
  auto relay = system.spawn<Relay>(w);
  w.tell(WatchCmd{relay});
  settle();
  relay.tell(-1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(reports.expect<int>(), i);
  (void)reports.expect<Down>();
}

TEST_F(Watch, a_notice_can_be_mapped_to_a_message_of_the_watcher_s_protocol) {
  struct Gone {
    std::string who;
    ExitReason why;
  };
  struct Mapper : troupe::Actor<std::variant<Gone, ActorRef<int>>> {
    explicit Mapper(ActorRef<std::string> o) : out(std::move(o)) {}
    void receive(std::variant<Gone, ActorRef<int>>& m) {
      if (auto* t = std::get_if<ActorRef<int>>(&m)) {
        watch(*t, [](const Down& d) { return Gone{d.actor.name(), d.reason}; });
      } else {
        auto& g = std::get<Gone>(m);
        out.tell(g.who + ":" + std::string(troupe::to_string(g.why)));
      }
    }
    ActorRef<std::string> out;
  };
  TestProbe<std::string> out(system);
  auto target = spawn_target("mapped");
  auto m = system.spawn<Mapper>(out.ref());
  m.tell(target);
  settle();
  target.stop();
  EXPECT_EQ(out.expect_message(), "mapped:normal");
}

TEST_F(Watch, a_watcher_that_stopped_first_gets_nothing_and_breaks_nothing) {
  auto target = spawn_target();
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  settle();
  w.stop();
  settle();
  target.stop();
  settle();
  EXPECT_TRUE(target.terminated());
  EXPECT_EQ(reports.pending(), 0u);
  EXPECT_EQ(system.stats().actors_live, 1u);  // the probe
}

TEST_F(Watch, a_target_and_its_watchers_stopping_together_leave_nothing_behind) {
  // Watch links hold references both ways; all must be released (ASan: no leak).
  auto a = spawn_watcher();
  auto b = spawn_watcher();
  auto ta = system.spawn<Target>(ActorRef<Report>{});
  a.tell(WatchCmd{ta});
  b.tell(WatchCmd{ta});
  settle();
  a.stop();
  ta.stop();
  b.stop();
  settle();
  EXPECT_EQ(system.stats().actors_live, 1u);
}

TEST_F(Watch, shutdown_gives_watchers_reason_shutdown) {
  // The watcher lives in a second system so that it is still running when
  // the first one shuts down (in one system it would be stopped alongside).
  troupe::SystemConfig c;
  c.threads = 1;
  c.log_dead_letters = false;
  troupe::ActorSystem doomed(c);
  auto target = doomed.spawn<Target>(SpawnOptions{.name = "doomed"}, ActorRef<Report>{});
  auto w = spawn_watcher();
  w.tell(WatchCmd{target});
  settle();
  ASSERT_TRUE(doomed.wait_idle());
  doomed.shutdown();
  auto d = reports.expect<Down>();
  EXPECT_EQ(d.reason, ExitReason::shutdown);
  EXPECT_EQ(d.actor.name(), "doomed");
}

}  // namespace
