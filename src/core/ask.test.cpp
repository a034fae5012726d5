// Ask: request/response from outside (Future) and from inside an actor
// (continuation), with timeouts on the manual clock.
// Ask timeouts run on the manual clock (X3); typed results and no blocking
// inside an actor are what the keyed lock (L4) and the job service (J2)
// build on.


#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::Error;
using troupe::ErrorCode;
using troupe::ReplyTo;
using troupe::Result;
using troupe::testkit::Gate;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

// --- the responder ------------------------------------------------------------------

struct Double {  // replies 2n at once
  int n = 0;
  ReplyTo<int> reply;
};
struct Keep {  // keeps the reply target for later
  ReplyTo<int> reply;
};
struct AnswerKept {  // answers every kept target with n
  int n = 0;
};
struct Ignore {  // drops the reply target without answering
  ReplyTo<int> reply;
};
struct Refuse {  // answers with an error value
  ReplyTo<int> reply;
};
struct Twice {  // answers twice; the second must be a no-op
  ReplyTo<int> reply;
};
using ResponderMsg = std::variant<Double, Keep, AnswerKept, Ignore, Refuse, Twice>;

struct Responder : troupe::Actor<ResponderMsg> {
  explicit Responder(ActorRef<std::string> l = {}) : log(std::move(l)) {}
  void receive(ResponderMsg& m) {
    troupe::match(
        m, [&](Double& d) { d.reply(2 * d.n); }, [&](Keep& k) { kept.push_back(std::move(k.reply)); },
        [&](AnswerKept& a) {
          for (auto& r : kept) r.reply(a.n);
          kept.clear();
          if (log) log.tell("answered");
        },
        [&](Ignore&) {}, [&](Refuse& r) { r.reply.fail(Error(ErrorCode::invalid_argument, "no thanks")); },
        [&](Twice& t) {
          EXPECT_TRUE(t.reply.pending());
          t.reply(1);
          EXPECT_FALSE(t.reply.pending());
          t.reply(2);
        });
  }
  std::vector<ReplyTo<int>> kept;
  ActorRef<std::string> log;
};

auto make_double(int n) {
  return [n](ReplyTo<int> r) { return Double{n, std::move(r)}; };
}
auto make_keep() {
  return [](ReplyTo<int> r) { return Keep{std::move(r)}; };
}

class Ask : public ManualClockTest {};

// --- from outside ---------------------------------------------------------------------

TEST_F(Ask, an_ask_from_outside_yields_the_reply) {
  auto r = system.spawn<Responder>();
  auto f = system.ask<int>(r, make_double(21), 1s);
  auto res = f.get();
  ASSERT_TRUE(res.ok()) << res.error().to_string();
  EXPECT_EQ(*res, 42);
}

TEST_F(Ask, an_answered_ask_leaves_no_timer_behind) {
  auto r = system.spawn<Responder>();
  settle();
  auto f = system.ask<int>(r, make_double(1), 1h);
  ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

// proves: X3
TEST_F(Ask, an_unanswered_ask_times_out_at_its_deadline_and_not_before) {
  auto r = system.spawn<Responder>();
  auto f = system.ask<int>(r, make_keep(), 100ms);
  settle();
  advance(99ms);
  EXPECT_FALSE(f.ready());
  advance(1ms);
  ASSERT_TRUE(f.ready());
  auto res = f.get();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::timeout);
}

TEST_F(Ask, a_late_reply_after_the_timeout_is_ignored) {
  TestProbe<std::string> log(system);
  auto r = system.spawn<Responder>(log.ref());
  auto f = system.ask<int>(r, make_keep(), 100ms);
  settle();
  advance(100ms);
  r.tell(AnswerKept{5});
  EXPECT_EQ(log.expect_message(), "answered");
  auto res = f.get();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::timeout);
}

TEST_F(Ask, a_reply_target_dropped_without_a_reply_answers_no_reply_at_once) {
  auto r = system.spawn<Responder>();
  auto f = system.ask<int>(r, [](ReplyTo<int> rt) { return Ignore{std::move(rt)}; }, 1h);
  auto res = f.get();  // no advance(): this must not wait for the timeout
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::no_reply);
}

TEST_F(Ask, an_error_reply_arrives_as_the_error_value) {
  auto r = system.spawn<Responder>();
  auto res = system.ask<int>(r, [](ReplyTo<int> rt) { return Refuse{std::move(rt)}; }, 1h).get();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(res.error().message(), "no thanks");
}

TEST_F(Ask, only_the_first_reply_counts) {
  auto r = system.spawn<Responder>();
  auto res = system.ask<int>(r, [](ReplyTo<int> rt) { return Twice{std::move(rt)}; }, 1h).get();
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(*res, 1);
}

TEST_F(Ask, asking_a_stopped_actor_fails_at_once_with_dead_letter) {
  auto r = system.spawn<Responder>();
  r.stop();
  settle();
  auto f = system.ask<int>(r, make_double(1), 1h);
  ASSERT_TRUE(f.ready());
  auto res = f.get();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::dead_letter);
  EXPECT_EQ(system.stats().dead_letters, 1u);
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

TEST_F(Ask, asking_through_an_empty_ref_fails_with_dead_letter) {
  auto res = system.ask<int>(ActorRef<ResponderMsg>{}, make_double(1), 1h).get();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::dead_letter);
}

TEST_F(Ask, a_request_queued_behind_a_stop_is_answered_with_no_reply) {
  auto r = system.spawn<Responder>();
  auto f = system.ask<int>(r, make_keep(), 1h);
  settle();
  r.stop();  // the kept target dies with the actor
  auto res = f.get();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::no_reply);
}

TEST_F(Ask, reply_target_move_assignment_answers_the_overwritten_one_with_no_reply) {
  auto r = system.spawn<Responder>();
  // Two asks whose reply targets the test takes over from the responder.
  struct Grab : troupe::Actor<std::variant<Keep, int>> {
    explicit Grab(std::shared_ptr<std::vector<ReplyTo<int>>> o) : out(std::move(o)) {}
    void receive(std::variant<Keep, int>& m) {
      if (auto* k = std::get_if<Keep>(&m)) out->push_back(std::move(k->reply));
    }
    std::shared_ptr<std::vector<ReplyTo<int>>> out;
  };
  auto grabbed = std::make_shared<std::vector<ReplyTo<int>>>();
  auto g = system.spawn<Grab>(grabbed);
  auto f1 = system.ask<int>(g, make_keep(), 1h);
  auto f2 = system.ask<int>(g, make_keep(), 1h);
  settle();
  ASSERT_EQ(grabbed->size(), 2u);
  (*grabbed)[0] = std::move((*grabbed)[1]);  // overwrites the first, unanswered
  auto r1 = f1.get();
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code(), ErrorCode::no_reply);
  EXPECT_FALSE(f2.ready());
  (*grabbed)[0].reply(9);
  EXPECT_EQ(*f2.get(), 9);
  grabbed->clear();
}

TEST_F(Ask, wait_for_reports_readiness_without_consuming_the_result) {
  auto r = system.spawn<Responder>();
  auto f = system.ask<int>(r, make_keep(), 50ms);
  EXPECT_FALSE(f.wait_for(1ms));
  settle();
  advance(50ms);
  EXPECT_TRUE(f.wait_for(0ms));
  EXPECT_EQ(f.get().error().code(), ErrorCode::timeout);
}

// --- from inside an actor ---------------------------------------------------------------

struct Outcome {
  int id = 0;
  bool ok = false;
  int value = 0;
  ErrorCode code = ErrorCode::ok;
  int total = 0;  // actor state after the continuation
  int calls = 0;  // continuations run for this id so far
};

struct AskDouble {
  int id = 0;
  int n = 0;
  troupe::Duration timeout{};
};
struct AskKeep {
  int id = 0;
  troupe::Duration timeout{};
};
struct HoldAsker {
  Gate* entered = nullptr;
  Gate* release = nullptr;
};
using AskerMsg = std::variant<AskDouble, AskKeep, HoldAsker>;

// Asks the responder and folds each answer into its own state in the
// continuation, which runs in this actor like a message.
struct Asker : troupe::Actor<AskerMsg> {
  Asker(ActorRef<ResponderMsg> t, ActorRef<Outcome> o, ActorRef<std::string> l)
      : target(std::move(t)), out(std::move(o)), log(std::move(l)) {}
  void receive(AskerMsg& m) {
    troupe::match(
        m, [&](AskDouble& a) { ask<int>(target, make_double(a.n), a.timeout, continuation(a.id)); },
        [&](AskKeep& a) { ask<int>(target, make_keep(), a.timeout, continuation(a.id)); },
        [&](HoldAsker& h) {
          h.entered->open();
          ASSERT_TRUE(h.release->wait());
          log.tell("released");
        });
  }
  std::function<void(Result<int>)> continuation(int id) {
    return [this, id](Result<int> r) {
      int calls = ++calls_by_id[id];
      if (r.ok()) total += *r;
      if (log) log.tell("continuation");
      out.tell(Outcome{id, r.ok(), r.ok() ? *r : 0, r.ok() ? ErrorCode::ok : r.error().code(), total, calls});
    };
  }
  ActorRef<ResponderMsg> target;
  ActorRef<Outcome> out;
  ActorRef<std::string> log;
  int total = 0;
  std::map<int, int> calls_by_id;
};

class AskInActor : public ManualClockTest {
 protected:
  AskInActor() : outcomes(system, "outcomes"), log(system, "log") {}
  TestProbe<Outcome> outcomes;
  TestProbe<std::string> log;
};

TEST_F(AskInActor, the_continuation_gets_the_reply_and_can_update_the_actor_s_state) {
  auto responder = system.spawn<Responder>();
  auto asker = system.spawn<Asker>(responder, outcomes.ref(), ActorRef<std::string>{});
  asker.tell(AskDouble{1, 1, 1s});
  asker.tell(AskDouble{2, 10, 1s});
  asker.tell(AskDouble{3, 100, 1s});
  int last_total = 0;
  for (int i = 0; i < 3; ++i) {
    auto o = outcomes.expect_message();
    EXPECT_TRUE(o.ok);
    EXPECT_EQ(o.calls, 1);
    last_total = std::max(last_total, o.total);
  }
  EXPECT_EQ(last_total, 222);
  settle();
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

TEST_F(AskInActor, the_continuation_runs_in_the_actor_never_beside_a_handler) {
  auto responder = system.spawn<Responder>(log.ref());
  auto asker = system.spawn<Asker>(responder, outcomes.ref(), log.ref());
  asker.tell(AskKeep{1, 1h});
  settle();
  Gate entered, release;
  asker.tell(HoldAsker{&entered, &release});
  ASSERT_TRUE(entered.wait());
  responder.tell(AnswerKept{5});
  EXPECT_EQ(log.expect_message(), "answered");  // the reply is on its way
  log.expect_no_message(50ms);                  // but the asker is busy
  release.open();
  EXPECT_EQ(log.expect_message(), "released");
  EXPECT_EQ(log.expect_message(), "continuation");
  EXPECT_EQ(outcomes.expect_message().value, 5);
}

TEST_F(AskInActor, an_unanswered_ask_times_out_in_the_actor_and_a_late_reply_is_ignored) {
  auto responder = system.spawn<Responder>();
  auto asker = system.spawn<Asker>(responder, outcomes.ref(), ActorRef<std::string>{});
  asker.tell(AskKeep{7, 100ms});
  settle();
  advance(99ms);
  EXPECT_EQ(outcomes.pending(), 0u);
  advance(1ms);
  auto o = outcomes.expect_message(0ms);
  EXPECT_EQ(o.id, 7);
  EXPECT_FALSE(o.ok);
  EXPECT_EQ(o.code, ErrorCode::timeout);
  EXPECT_EQ(o.calls, 1);
  responder.tell(AnswerKept{5});  // too late
  settle();
  EXPECT_EQ(outcomes.pending(), 0u) << "the continuation ran twice";
}

TEST_F(AskInActor, asking_a_stopped_actor_gives_the_continuation_dead_letter) {
  auto responder = system.spawn<Responder>();
  responder.stop();
  settle();
  auto asker = system.spawn<Asker>(responder, outcomes.ref(), ActorRef<std::string>{});
  asker.tell(AskDouble{1, 1, 1h});
  auto o = outcomes.expect_message();
  EXPECT_FALSE(o.ok);
  EXPECT_EQ(o.code, ErrorCode::dead_letter);
}

TEST_F(AskInActor, an_asker_that_stopped_never_runs_its_continuation) {
  auto responder = system.spawn<Responder>();
  auto asker = system.spawn<Asker>(responder, outcomes.ref(), ActorRef<std::string>{});
  asker.tell(AskKeep{1, 100ms});
  settle();
  asker.stop();
  settle();
  responder.tell(AnswerKept{5});
  settle();
  advance(1s);
  EXPECT_EQ(outcomes.pending(), 0u);
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

}  // namespace
