// Typed actors: variant protocols, behaviour switching, names, children and
// per-sender order.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
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
using troupe::Delivery;
using troupe::SpawnOptions;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

class Actors : public ManualClockTest {};

// --- a counter with a variant protocol ------------------------------------------

struct Inc {};
struct Add {
  int n = 0;
};
struct Get {
  ActorRef<int> to;
};
using CounterMsg = std::variant<Inc, Add, Get>;

struct Counter : troupe::Actor<CounterMsg> {
  int n = 0;
  void receive(CounterMsg& m) {
    troupe::match(
        m, [&](Inc&) { ++n; }, [&](Add& a) { n += a.n; }, [&](Get& g) { g.to.tell(n); });
  }
};

TEST_F(Actors, a_variant_protocol_actor_handles_each_alternative_it_is_told) {
  TestProbe<int> probe(system);
  auto counter = system.spawn<Counter>();
  EXPECT_EQ(counter.tell(Inc{}), Delivery::delivered);
  EXPECT_EQ(counter.tell(Add{40}), Delivery::delivered);
  EXPECT_EQ(counter.tell(Inc{}), Delivery::delivered);
  counter.tell(Get{probe.ref()});
  EXPECT_EQ(probe.expect_message(), 42);
}

TEST_F(Actors, an_actor_is_built_with_the_constructor_arguments_given_to_spawn) {
  struct Greeter : troupe::Actor<ActorRef<std::string>> {
    Greeter(std::string g, int times) : greeting(std::move(g)), times_(times) {}
    void receive(ActorRef<std::string>& to) {
      for (int i = 0; i < times_; ++i) to.tell(greeting);
    }
    std::string greeting;
    int times_;
  };
  TestProbe<std::string> probe(system);
  auto g = system.spawn<Greeter>(std::string("hello"), 2);
  g.tell(probe.ref());
  EXPECT_EQ(probe.expect_messages(2), (std::vector<std::string>{"hello", "hello"}));
}

TEST_F(Actors, a_throwing_constructor_propagates_to_the_spawner_and_no_actor_is_left) {
  struct Broken : troupe::Actor<int> {
    Broken() { throw std::runtime_error("no"); }
    void receive(int&) {}
  };
  auto before = system.stats();
  EXPECT_THROW(system.spawn<Broken>(), std::runtime_error);
  auto after = system.stats();
  EXPECT_EQ(after.actors_spawned, before.actors_spawned);
  EXPECT_EQ(after.actors_live, before.actors_live);
}

// --- hooks ------------------------------------------------------------------------

struct Hooked : troupe::Actor<int> {
  explicit Hooked(ActorRef<std::string> l) : log(std::move(l)) {}
  void on_start() { log.tell("start"); }
  void receive(int& n) { log.tell("msg " + std::to_string(n)); }
  void on_stop() { log.tell("stop"); }
  ActorRef<std::string> log;
};

TEST_F(Actors, on_start_runs_before_the_first_message_and_on_stop_after_the_last) {
  TestProbe<std::string> log(system);
  auto a = system.spawn<Hooked>(log.ref());
  a.tell(1);
  a.tell(2);
  a.stop();
  EXPECT_EQ(log.expect_messages(4), (std::vector<std::string>{"start", "msg 1", "msg 2", "stop"}));
  settle();
  EXPECT_TRUE(a.terminated());
}

// --- become / unbecome --------------------------------------------------------------

// A turnstile: locked until a coin, then lets one push through.
struct Coin {};
struct Push {};
using TurnstileMsg = std::variant<Coin, Push>;

struct MemberTurnstile : troupe::Actor<TurnstileMsg> {
  explicit MemberTurnstile(ActorRef<std::string> l) : log(std::move(l)) {}
  void receive(TurnstileMsg& m) {  // locked
    troupe::match(
        m,
        [&](Coin&) {
          log.tell("unlock");
          become(&MemberTurnstile::unlocked);
        },
        [&](Push&) { log.tell("blocked"); });
  }
  void unlocked(TurnstileMsg& m) {
    troupe::match(
        m, [&](Coin&) { log.tell("refund"); },
        [&](Push&) {
          log.tell("pass");
          unbecome();
        });
  }
  ActorRef<std::string> log;
};

TEST_F(Actors, become_with_a_member_function_and_unbecome_drive_a_state_machine) {
  TestProbe<std::string> log(system);
  auto t = system.spawn<MemberTurnstile>(log.ref());
  for (auto m : std::vector<TurnstileMsg>{Push{}, Coin{}, Coin{}, Push{}, Push{}}) t.tell(m);
  EXPECT_EQ(log.expect_messages(5),
            (std::vector<std::string>{"blocked", "unlock", "refund", "pass", "blocked"}));
}

struct LambdaTurnstile : troupe::Actor<TurnstileMsg> {
  explicit LambdaTurnstile(ActorRef<std::string> l) : log(std::move(l)) {}
  void receive(TurnstileMsg& m) {
    if (std::holds_alternative<Push>(m)) {
      log.tell("blocked");
      return;
    }
    ++coins;
    log.tell("unlock");
    become([this](TurnstileMsg& u) {
      if (std::holds_alternative<Coin>(u)) {
        ++coins;
        log.tell("refund");
        return;
      }
      log.tell("pass after " + std::to_string(coins) + " coins");
      unbecome();
    });
  }
  int coins = 0;
  ActorRef<std::string> log;
};

TEST_F(Actors, become_with_a_lambda_switches_behaviour_from_the_next_message) {
  TestProbe<std::string> log(system);
  auto t = system.spawn<LambdaTurnstile>(log.ref());
  for (auto m : std::vector<TurnstileMsg>{Coin{}, Coin{}, Push{}, Push{}}) t.tell(m);
  EXPECT_EQ(log.expect_messages(4),
            (std::vector<std::string>{"unlock", "refund", "pass after 2 coins", "blocked"}));
}

// A behaviour that switches away from itself and then still uses what it
// captured: the contract says the switch takes effect from the next message,
// so the running closure must stay alive until it returns.
struct SelfReplacing : troupe::Actor<int> {
  explicit SelfReplacing(ActorRef<std::string> l) : log(std::move(l)) {}
  void on_start() {
    become([this, tag = std::string(64, 'x')](int&) {
      unbecome();
      log.tell(tag);  // the capture, after the switch
    });
  }
  void receive(int&) { log.tell("receive"); }
  ActorRef<std::string> log;
};

// Regression (heap-use-after-free under ASan until d18dde2): set_behavior
// freed the running closure at once.
TEST_F(Actors, a_behaviour_may_switch_away_from_itself_and_still_use_its_captures) {
  TestProbe<std::string> log(system);
  auto a = system.spawn<SelfReplacing>(log.ref());
  a.tell(1);
  a.tell(2);
  EXPECT_EQ(log.expect_messages(2), (std::vector<std::string>{std::string(64, 'x'), "receive"}));
}

// --- names --------------------------------------------------------------------------

struct NameReporter : troupe::Actor<ActorRef<std::string>> {
  void receive(ActorRef<std::string>& to) { to.tell(name()); }
};

TEST_F(Actors, a_named_actor_reports_its_name_through_its_ref_and_to_itself) {
  TestProbe<std::string> probe(system);
  auto a = system.spawn<NameReporter>(SpawnOptions{.name = "reporter"});
  EXPECT_EQ(a.name(), "reporter");
  EXPECT_EQ(troupe::AnyRef(a).name(), "reporter");
  a.tell(probe.ref());
  EXPECT_EQ(probe.expect_message(), "reporter");
}

TEST_F(Actors, an_unnamed_actor_and_an_empty_ref_have_empty_names) {
  auto a = system.spawn<NameReporter>();
  EXPECT_EQ(a.name(), "");
  EXPECT_EQ(ActorRef<int>().name(), "");
  EXPECT_FALSE(ActorRef<int>());
  EXPECT_TRUE(ActorRef<int>().terminated());
}

// --- children -----------------------------------------------------------------------

struct Child : troupe::Actor<int> {
  explicit Child(std::shared_ptr<std::atomic<int>> s) : stopped(std::move(s)) {}
  void receive(int&) {}
  void on_stop() { stopped->fetch_add(1); }
  std::shared_ptr<std::atomic<int>> stopped;
};

// Spawns `n` children (each spawning `depth - 1` levels below it) and
// reports every child's ref.
struct Parent : troupe::Actor<int> {
  Parent(int n, int depth, std::shared_ptr<std::atomic<int>> s, ActorRef<ActorRef<int>> r)
      : n_(n), depth_(depth), stopped(std::move(s)), report(std::move(r)) {}
  void on_start() {
    for (int i = 0; i < n_; ++i) {
      ActorRef<int> c = depth_ > 1 ? spawn<Parent>(n_, depth_ - 1, stopped, report) : spawn<Child>(stopped);
      report.tell(c);
    }
  }
  void receive(int&) {}
  void on_stop() { stopped->fetch_add(1); }
  int n_;
  int depth_;
  std::shared_ptr<std::atomic<int>> stopped;
  ActorRef<ActorRef<int>> report;
};

TEST_F(Actors, children_spawned_by_an_actor_are_stopped_when_it_stops) {
  auto stopped = std::make_shared<std::atomic<int>>(0);
  TestProbe<ActorRef<int>> kids(system);
  TestProbe<troupe::Down> downs(system);
  auto parent = system.spawn<Parent>(3, 1, stopped, kids.ref());
  auto children = kids.expect_messages(3);
  for (auto& c : children) downs.watch(c);
  settle();
  EXPECT_EQ(stopped->load(), 0);
  for (auto& c : children) EXPECT_FALSE(c.terminated());

  parent.stop();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(downs.expect_message().reason, troupe::ExitReason::normal);
  settle();
  for (auto& c : children) EXPECT_TRUE(c.terminated());
  EXPECT_EQ(stopped->load(), 4);  // three children and the parent ran on_stop
  EXPECT_EQ(system.stats().actors_live, 2u);  // only the two probes are left
}

TEST_F(Actors, stopping_an_actor_stops_its_whole_subtree) {
  auto stopped = std::make_shared<std::atomic<int>>(0);
  TestProbe<ActorRef<int>> kids(system);
  auto root = system.spawn<Parent>(2, 3, stopped, kids.ref());
  auto all = kids.expect_messages(2 + 4 + 8);
  settle();
  EXPECT_EQ(system.stats().actors_live, 1u + 1u + 14u);
  root.stop();
  settle();
  for (auto& c : all) EXPECT_TRUE(c.terminated());
  EXPECT_EQ(stopped->load(), 15);
  EXPECT_EQ(system.stats().actors_live, 1u);  // the probe
}

// --- order ----------------------------------------------------------------------------

struct SeqChecker : troupe::Actor<std::variant<int, Get>> {
  int expected = 0;
  int out_of_order = 0;
  void receive(std::variant<int, Get>& m) {
    troupe::match(
        m,
        [&](int n) {
          if (n != expected) ++out_of_order;
          expected = n + 1;
        },
        [&](Get& g) { g.to.tell(out_of_order == 0 ? expected : -out_of_order); });
  }
};

TEST_F(Actors, one_sender_s_hundred_thousand_messages_arrive_in_the_order_sent) {
  constexpr int kCount = 100'000;
  TestProbe<int> probe(system);
  auto a = system.spawn<SeqChecker>();
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(a.tell(i), Delivery::delivered);
  a.tell(Get{probe.ref()});
  EXPECT_EQ(probe.expect_message(10s), kCount);  // negative would count reorderings
}

TEST_F(Actors, a_message_an_actor_tells_itself_is_handled_after_those_already_queued) {
  struct SelfTeller : troupe::Actor<int> {
    SelfTeller(ActorRef<int> l, troupe::testkit::Gate* g) : log(std::move(l)), go(g) {}
    void on_start() { ASSERT_TRUE(go->wait()); }  // lets the test queue 0 and 1 first
    void receive(int& n) {
      if (n == 0) self().tell(2);
      log.tell(n);
    }
    ActorRef<int> log;
    troupe::testkit::Gate* go;
  };
  TestProbe<int> log(system);
  troupe::testkit::Gate go;
  auto a = system.spawn<SelfTeller>(log.ref(), &go);
  a.tell(0);
  a.tell(1);
  go.open();
  EXPECT_EQ(log.expect_messages(3), (std::vector<int>{0, 1, 2}));
}

TEST_F(Actors, handlers_of_one_actor_never_run_concurrently) {
  struct Exclusive : troupe::Actor<std::variant<int, Get>> {
    explicit Exclusive(std::shared_ptr<std::atomic<int>> in) : inside(std::move(in)) {}
    void receive(std::variant<int, Get>& m) {
      if (inside->fetch_add(1) != 0) ++overlaps;
      if (auto* g = std::get_if<Get>(&m)) g->to.tell(overlaps);
      inside->fetch_sub(1);
    }
    std::shared_ptr<std::atomic<int>> inside;
    int overlaps = 0;
  };
  TestProbe<int> probe(system);
  auto a = system.spawn<Exclusive>(std::make_shared<std::atomic<int>>(0));
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t)
    senders.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) a.tell(i);
    });
  for (auto& s : senders) s.join();
  a.tell(Get{probe.ref()});
  EXPECT_EQ(probe.expect_message(10s), 0);
}

}  // namespace
