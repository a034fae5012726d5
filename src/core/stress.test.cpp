// Concurrency stress: races the deterministic tests cannot reach. Each test
// asserts exact totals or invariants, so that a lost, duplicated or stale
// message fails it; run under TSan and ASan as well.
// Under real time no message of a cancelled or replaced timer generation is
// ever delivered: what the entity runtime's deadline cancel (E4) relies on.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::ActorSystem;
using troupe::Delivery;
using troupe::ErrorCode;
using troupe::ReplyTo;
using troupe::Result;
using troupe::testkit::TestProbe;

// Divides the iteration counts, should a slow build need it (TSan on two
// cores runs the full sizes in a few seconds).
constexpr int kScale = 1;

troupe::SystemConfig config() {
  troupe::SystemConfig c;
  c.threads = 2;
  c.log_dead_letters = false;
  c.log_failures = false;
  return c;
}

// --- many senders, one receiver -------------------------------------------------------

struct Numbered {
  int sender = 0;
  int seq = 0;
};
struct Total {
  ReplyTo<std::vector<int>> reply;  // per-sender counts; -1 marks a reordering
};
using CountMsg = std::variant<Numbered, Total>;

struct PerSenderCounter : troupe::Actor<CountMsg> {
  explicit PerSenderCounter(int senders) : next(static_cast<std::size_t>(senders), 0) {}
  void receive(CountMsg& m) {
    if (auto* n = std::get_if<Numbered>(&m)) {
      auto& want = next[static_cast<std::size_t>(n->sender)];
      if (n->seq != want) reordered = true;
      want = n->seq + 1;
      return;
    }
    auto out = next;
    if (reordered) out.push_back(-1);
    std::get<Total>(m).reply(std::move(out));
  }
  std::vector<int> next;
  bool reordered = false;
};

TEST(Stress, eight_senders_into_one_actor_lose_nothing_and_keep_each_sender_s_order) {
  constexpr int kSenders = 8;
  const int per_sender = 100'000 / kScale;
  ActorSystem sys(config());
  auto counter = sys.spawn<PerSenderCounter>(kSenders);
  std::vector<std::thread> senders;
  for (int s = 0; s < kSenders; ++s)
    senders.emplace_back([&, s] {
      for (int i = 0; i < per_sender; ++i) ASSERT_EQ(counter.tell(Numbered{s, i}), Delivery::delivered);
    });
  for (auto& t : senders) t.join();
  auto r = sys.ask<std::vector<int>>(counter, [](auto reply) { return Total{std::move(reply)}; }, 60s).get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::vector<int>(kSenders, per_sender));
}

// --- tells racing a stop -----------------------------------------------------------------

struct Tally : troupe::Actor<int> {
  explicit Tally(std::shared_ptr<std::atomic<long>> h) : handled(std::move(h)) {}
  void receive(int&) { handled->fetch_add(1, std::memory_order_relaxed); }
  std::shared_ptr<std::atomic<long>> handled;
};

TEST(Stress, every_tell_racing_a_stop_is_either_handled_or_a_dead_letter) {
  ActorSystem sys(config());
  for (int round = 0; round < 20; ++round) {
    auto handled = std::make_shared<std::atomic<long>>(0);
    auto dead_before = sys.stats().dead_letters;
    auto t = sys.spawn<Tally>(handled);
    std::atomic<long> sent{0};
    std::vector<std::thread> senders;
    for (int s = 0; s < 3; ++s)
      senders.emplace_back([&] {
        for (int i = 0; i < 5000 / kScale; ++i) {
          t.tell(i);
          sent.fetch_add(1, std::memory_order_relaxed);
        }
      });
    std::this_thread::sleep_for(std::chrono::microseconds(50 * round));  // stop at varying points
    t.stop();
    for (auto& s : senders) s.join();
    ASSERT_TRUE(sys.wait_idle(30s));
    ASSERT_TRUE(t.terminated());
    EXPECT_EQ(handled->load() + static_cast<long>(sys.stats().dead_letters - dead_before), sent.load())
        << "round " << round;
  }
}

// --- spawn/stop storms ---------------------------------------------------------------------

struct Census {
  std::atomic<long> constructed{0};
  std::atomic<long> destroyed{0};
  std::atomic<long> started{0};
  std::atomic<long> stopped{0};
};

struct Ephemeral : troupe::Actor<int> {
  Ephemeral(std::shared_ptr<Census> c, int mode) : census(std::move(c)), mode_(mode) {
    census->constructed.fetch_add(1);
  }
  ~Ephemeral() { census->destroyed.fetch_add(1); }
  void on_start() {
    census->started.fetch_add(1);
    if (mode_ == 0) stop();  // stops itself at once
  }
  void on_stop() { census->stopped.fetch_add(1); }
  void receive(int& n) {
    if (n < 0) stop();
  }
  std::shared_ptr<Census> census;
  int mode_;
};

// Spawns `left` children in chunks of 100, one chunk per message, so that
// stop requests interleave with the spawning.
struct Spawner : troupe::Actor<int> {
  explicit Spawner(std::shared_ptr<Census> c) : census(std::move(c)) {}
  void receive(int& left) {
    for (int i = 0; i < 100 && left > 0; ++i, --left) {
      auto child = spawn<Ephemeral>(census, left % 3);
      if (left % 3 == 1) child.stop();  // stopped by its parent at once
      if (left % 3 == 2) child.tell(1);  // left running until the parent stops
    }
    if (left > 0) self().tell(left);
  }
  std::shared_ptr<Census> census;
};

TEST(Stress, spawning_ten_thousand_actors_while_stopping_them_leaves_none_behind) {
  auto census = std::make_shared<Census>();
  {
    ActorSystem sys(config());
    std::vector<ActorRef<int>> spawners;
    for (int i = 0; i < 4; ++i) spawners.push_back(sys.spawn<Spawner>(census));
    for (auto& s : spawners) s.tell(10'000 / 4 / kScale);
    // Stop half of the spawners while they are still spawning.
    std::this_thread::sleep_for(1ms);
    spawners[0].stop();
    spawners[1].stop();
    ASSERT_TRUE(sys.wait_idle(60s));
    spawners[2].stop();
    spawners[3].stop();
    ASSERT_TRUE(sys.wait_idle(60s));
    EXPECT_EQ(sys.stats().actors_live, 0u);
    EXPECT_EQ(census->started.load(), census->stopped.load()) << "an actor started but never stopped";
    EXPECT_GE(sys.stats().actors_spawned, 4u + static_cast<unsigned long>(census->started.load()));
  }
  EXPECT_EQ(census->constructed.load(), census->destroyed.load());
  EXPECT_GE(census->started.load(), 2 * (10'000 / 4 / kScale)) << "the two spawners left alone spawn all theirs";
}

// --- timers racing cancel and replace, on the real clock -------------------------------

struct Kick {};
struct Fire {
  std::uint64_t gen = 0;
};
using RacerMsg = std::variant<Kick, Fire>;

struct RaceResult {
  long violations = 0;
  long fires = 0;
  long replaced = 0;
  long cancelled = 0;
};

// Starts, replaces and cancels timer "t" at random with delays of a few
// microseconds, and checks that every Fire it gets carries the generation it
// armed last and has not cancelled or replaced since.
struct TimerRacer : troupe::Actor<RacerMsg> {
  TimerRacer(unsigned seed, int iterations, ActorRef<RaceResult> d)
      : rng(seed), left(iterations), done(std::move(d)) {}
  void on_start() { self().tell(Kick{}); }
  void receive(RacerMsg& m) {
    if (auto* f = std::get_if<Fire>(&m)) {
      if (f->gen != armed) {
        ++r.violations;
      } else {
        ++r.fires;
        if (!periodic) armed = 0;
      }
      return;
    }
    if (left-- <= 0) {
      cancel_timer("t");
      cancel_timer("kick");
      done.tell(r);
      return;
    }
    auto us = [&](int max) { return std::chrono::microseconds(std::uniform_int_distribution<int>(0, max)(rng)); };
    switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
      case 0:
      case 1:
        if (armed) ++r.replaced;
        armed = ++gen;
        periodic = false;
        start_timer("t", us(300), Fire{armed});
        break;
      case 2:
        if (armed) ++r.replaced;
        armed = ++gen;
        periodic = true;
        (void)start_periodic_timer("t", std::chrono::microseconds(20) + us(100), Fire{armed});
        break;
      case 3:
        if (cancel_timer("t")) ++r.cancelled;
        armed = 0;
        break;
      default:
        break;
    }
    // Let real time pass sometimes, so that fires land while we are idle.
    if (std::uniform_int_distribution<int>(0, 1)(rng)) {
      start_timer("kick", us(200), Kick{});
    } else {
      self().tell(Kick{});
    }
  }
  std::mt19937 rng;
  int left;
  ActorRef<RaceResult> done;
  std::uint64_t gen = 0;
  std::uint64_t armed = 0;  // generation that may still fire; 0 = none
  bool periodic = false;
  RaceResult r;
};

TEST(Stress, no_message_of_a_cancelled_or_replaced_timer_is_ever_delivered) {
  ActorSystem sys(config());
  TestProbe<RaceResult> results(sys);
  constexpr int kRacers = 8;
  for (int i = 0; i < kRacers; ++i) sys.spawn<TimerRacer>(1234u + static_cast<unsigned>(i), 3000 / kScale, results.ref());
  RaceResult total;
  for (int i = 0; i < kRacers; ++i) {
    auto r = results.expect_message(60s);
    total.violations += r.violations;
    total.fires += r.fires;
    total.replaced += r.replaced;
    total.cancelled += r.cancelled;
  }
  EXPECT_EQ(total.violations, 0) << "a stale timer message was delivered";
  EXPECT_GT(total.fires, 0);
  EXPECT_GT(total.replaced + total.cancelled, 0);
  // Informational: how often the runtime dropped an already-queued stale fire.
  RecordProperty("stale_timer_fires", std::to_string(sys.stats().stale_timer_fires));
}

// --- asks racing their timeouts ------------------------------------------------------------

struct Question {
  int id = 0;
  ReplyTo<int> reply;
};
struct AnswerLater {
  int id = 0;
};
using SlowMsg = std::variant<Question, AnswerLater>;

// Answers each question after a random delay around the askers' timeout.
struct SlowResponder : troupe::Actor<SlowMsg> {
  SlowResponder(unsigned seed, ActorRef<int> a) : rng(seed), answered(std::move(a)) {}
  void receive(SlowMsg& m) {
    if (auto* q = std::get_if<Question>(&m)) {
      auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng));
      pending.emplace(q->id, std::move(q->reply));
      start_timer("q" + std::to_string(q->id), delay, AnswerLater{q->id});
      return;
    }
    auto id = std::get<AnswerLater>(m).id;
    auto it = pending.find(id);
    it->second.reply(id);
    pending.erase(it);
    answered.tell(id);
  }
  std::mt19937 rng;
  ActorRef<int> answered;
  std::map<int, ReplyTo<int>> pending;
};

// Waits (real time) until the responder's answer timers have all fired and
// everything they sent has been handled.
void wait_for_late_answers(ActorSystem& sys) {
  for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until;) {
    if (sys.stats().timers_pending == 0 && sys.wait_idle(10s)) return;
    std::this_thread::sleep_for(1ms);
  }
  ADD_FAILURE() << "timers still pending after 60 s";
}

struct AskSummary {
  int completions = 0;
  int replies = 0;
  int timeouts = 0;
  int other = 0;
  int duplicates = 0;
};
struct Go {};
struct Report {
  ActorRef<AskSummary> to;
};
using AskerMsg = std::variant<Go, Report>;

struct RacingAsker : troupe::Actor<AskerMsg> {
  RacingAsker(ActorRef<SlowMsg> t, int n, int base, ActorRef<AskSummary> d)
      : target(std::move(t)), count(n), first_id(base), done(std::move(d)) {}
  void receive(AskerMsg& m) {
    if (auto* r = std::get_if<Report>(&m)) {
      r->to.tell(s);
      return;
    }
    for (int i = 0; i < count; ++i) {
      int id = first_id + i;
      ask<int>(
          target, [id](ReplyTo<int> rt) { return Question{id, std::move(rt)}; }, 1ms,
          [this, id](Result<int> res) {
            if (++calls[id] > 1) ++s.duplicates;
            ++s.completions;
            if (res.ok()) {
              ++s.replies;
            } else if (res.error().code() == ErrorCode::timeout) {
              ++s.timeouts;
            } else {
              ++s.other;
            }
            if (s.completions == count) done.tell(s);
          });
    }
  }
  ActorRef<SlowMsg> target;
  int count;
  int first_id;
  ActorRef<AskSummary> done;
  std::map<int, int> calls;
  AskSummary s;
};

TEST(Stress, asks_racing_their_timeouts_each_complete_exactly_once) {
  ActorSystem sys(config());
  TestProbe<AskSummary> summaries(sys);
  TestProbe<int> answered(sys);
  constexpr int kAskers = 4;
  const int per_asker = 500 / kScale;
  auto responder = sys.spawn<SlowResponder>(99u, answered.ref());
  std::vector<ActorRef<AskerMsg>> askers;
  for (int i = 0; i < kAskers; ++i)
    askers.push_back(sys.spawn<RacingAsker>(responder, per_asker, i * per_asker, summaries.ref()));
  for (auto& a : askers) a.tell(Go{});
  for (int i = 0; i < kAskers; ++i) (void)summaries.expect_message(60s);
  // Let every late answer arrive: no continuation may run a second time.
  wait_for_late_answers(sys);
  AskSummary total;
  for (auto& a : askers) {
    a.tell(Report{summaries.ref()});
    auto s = summaries.expect_message();
    total.completions += s.completions;
    total.replies += s.replies;
    total.timeouts += s.timeouts;
    total.other += s.other;
    total.duplicates += s.duplicates;
  }
  EXPECT_EQ(total.completions, kAskers * per_asker);
  EXPECT_EQ(total.duplicates, 0);
  EXPECT_EQ(total.other, 0);
  EXPECT_EQ(total.replies + total.timeouts, kAskers * per_asker);
  EXPECT_EQ(sys.stats().timers_pending, 0u);
}

TEST(Stress, futures_racing_their_timeouts_from_many_threads_each_complete_once) {
  ActorSystem sys(config());
  TestProbe<int> answered(sys);
  auto responder = sys.spawn<SlowResponder>(7u, answered.ref());
  constexpr int kThreads = 4;
  const int per_thread = 300 / kScale;
  std::atomic<int> replies{0}, timeouts{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        int id = t * per_thread + i;
        auto r = sys.ask<int>(responder, [id](ReplyTo<int> rt) { return Question{id, std::move(rt)}; }, 1ms).get();
        if (r.ok()) {
          (*r == id ? replies : other).fetch_add(1);
        } else {
          (r.error().code() == ErrorCode::timeout ? timeouts : other).fetch_add(1);
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(replies.load() + timeouts.load(), kThreads * per_thread);
  EXPECT_EQ(other.load(), 0);
  wait_for_late_answers(sys);  // late replies into completed futures are harmless
}

// An ask is "send the request, then wait for the reply or the timeout": the
// request must reach the target even when the timeout is already over by the
// time it is sent.
struct Counted {
  ReplyTo<int> reply;
};
struct RequestCounter : troupe::Actor<Counted> {
  explicit RequestCounter(std::shared_ptr<std::atomic<int>> n) : received(std::move(n)) {}
  void receive(Counted&) { received->fetch_add(1); }
  std::shared_ptr<std::atomic<int>> received;
};

TEST(Stress, every_ask_request_reaches_its_target_even_if_its_timeout_is_already_over) {
  ActorSystem sys(config());
  auto received = std::make_shared<std::atomic<int>>(0);
  auto target = sys.spawn<RequestCounter>(received);
  constexpr int kAsks = 2000;
  for (int i = 0; i < kAsks; ++i) {
    auto r = sys.ask<int>(target, [](ReplyTo<int> rt) { return Counted{std::move(rt)}; }, 0ns).get();
    ASSERT_FALSE(r.ok());  // timeout or no_reply, whichever came first
  }
  ASSERT_TRUE(sys.wait_idle(30s));
  EXPECT_EQ(received->load(), kAsks) << "requests were dropped without being sent";
}

// --- watching an actor as it terminates ------------------------------------------------

struct Doomed : troupe::Actor<int> {
  void receive(int& n) {
    if (n == 1) throw std::runtime_error("doomed");
    stop();
  }
};

// Regression (TSan data race until d18dde2): push_system could see kClosed
// through a relaxed load, and WatchEnvelope::drop then read the target's
// exit reason without synchronising with terminate().
TEST(Stress, watching_an_actor_as_it_terminates_reads_its_exit_reason_race_free) {
  ActorSystem sys(config());
  TestProbe<troupe::Down> downs(sys);
  for (int round = 0; round < 2000 / kScale; ++round) {
    auto t = sys.spawn<Doomed>();
    t.tell(round % 2);       // odd rounds fail, even rounds stop normally
    downs.watch(t);          // races the termination
    auto d = downs.expect_message(30s);
    ASSERT_EQ(d.reason, round % 2 ? troupe::ExitReason::failure : troupe::ExitReason::normal) << "round " << round;
  }
}

// --- reading a ref while the actor runs --------------------------------------------------

struct Busy : troupe::Actor<int> {
  void receive(int& n) {
    // Uses the per-actor state block (timers) for the first time.
    start_timer("t" + std::to_string(n), 1h, n);
    cancel_timer("t" + std::to_string(n));
  }
};

// Regression (TSan data race until d18dde2): name() read the lazily
// allocated extras_ pointer without synchronisation.
TEST(Stress, reading_the_name_of_an_unnamed_actor_while_it_runs_is_race_free) {
  ActorSystem sys(config());
  for (int round = 0; round < 50; ++round) {
    auto b = sys.spawn<Busy>();
    std::atomic<bool> stop{false};
    std::thread reader([&] {
      while (!stop.load()) EXPECT_EQ(b.name(), "");
    });
    b.tell(round);
    ASSERT_TRUE(sys.wait_idle());
    stop = true;
    reader.join();
  }
}

}  // namespace
