// Coroutine command handlers (Effect::await) against SPEC E1-E6: the payment
// handler stores the event that enters processing, awaits the gateway, and
// stores the outcome; the runtime's promises hold around it. Manual clock,
// in-memory journal, the gateway played by a TestProbe.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "entity_test_support.hpp"
#include "journal_test_support.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::test;

namespace {

// What the handlers did, for the tests to check.
struct Seen {
  std::atomic<int> frames{0};   // handler frames alive now
  std::atomic<int> answers{0};  // gateway answers a handler went on with
};

// Counts a frame while it lives.
struct Alive {
  explicit Alive(std::shared_ptr<Seen> s) : seen(std::move(s)) { ++seen->frames; }
  Alive(const Alive&) = delete;
  Alive& operator=(const Alive&) = delete;
  ~Alive() { --seen->frames; }
  std::shared_ptr<Seen> seen;
};

// The test payment (entity_test_support.hpp) with Settle handled by a
// coroutine that answers with the outcome. Retry while settling declines
// the episode from another command; Note while settling is a second
// coroutine handler, which waits for the first.
struct CoPay {
  using Command = PayCmd;
  using Event = PayEvent;
  using State = PayState;
  using Effect = troupe::Effect<Event, State>;
  using Context = EntityContext<CoPay>;

  ActorRef<GatewayRequest> gateway;
  Duration processing_timeout = 15s;
  std::shared_ptr<Seen> seen;

  Effect on_command(const State& s, Command& c, Context& ctx) {
    return match(
        c,
        [&](Settle& m) -> Effect {
          if (s.phase == Phase::settling) return Effect::stash();
          if (s.phase != Phase::waiting) return Effect::reply(m.reply_to, std::string("refused: ") + phase_name(s.phase));
          return Effect::await(settle(s, m, ctx));
        },
        [&](Retry& m) -> Effect {
          if (s.phase != Phase::settling) return Effect::reply(m.reply_to, std::string("refused: ") + phase_name(s.phase));
          return Effect::persist(Declined{"retried"}).then_reply(m.reply_to, [](const State& st) { return describe(st); });
        },
        [&](Note& m) -> Effect {
          if (s.phase == Phase::settling) return Effect::await(note_later(m, ctx));
          return Effect::persist(Noted{m.text});
        },
        [&](Cancel& m) -> Effect {
          if (s.phase == Phase::settling) return Effect::stash();
          if (s.phase != Phase::waiting) return Effect::reply(m.reply_to, std::string("too late: ") + phase_name(s.phase));
          return Effect::persist(Cancelled{}).then_reply(m.reply_to, [] { return std::string("cancelled"); });
        },
        [&](GetState& m) -> Effect { return Effect::reply(m.reply_to, describe(s)); },
        [&](Boom&) -> Effect { return Effect::await(boom(ctx)); },
        [&](Sleep& m) -> Effect { return Effect::reply(m.reply_to, std::string("sleeping")).then_passivate(); },
        [&](auto&) -> Effect { return Effect::none(); });
  }

  // Answered with the outcome; `s` is the live state, `m` stays valid.
  Task<Effect> settle(const State& s, Settle& m, Context& ctx) {
    Alive alive(seen);
    Result<void> stored = co_await ctx.persist(Accepted{m.amount});
    if (!stored.ok()) co_return Effect::none();  // the entity stops; the runtime answers
    Result<bool> answer = co_await ctx.ask<bool>(
        gateway, [&](ReplyTo<bool> r) { return GatewayRequest{ctx.id(), s.amount, std::move(r)}; }, 1h);
    ++seen->answers;
    auto reply = [](const State& st) { return describe(st); };
    if (!answer.ok()) co_return Effect::persist(Declined{answer.error().to_string()}).then_reply(m.reply_to, reply);
    if (!*answer) co_return Effect::persist(Declined{"declined"}).then_reply(m.reply_to, reply);
    co_return Effect::persist(Completed{}).then_reply(m.reply_to, reply);
  }

  Task<Effect> note_later(Note& m, Context& ctx) {
    Alive alive(seen);
    // Named first: GCC 12 mishandles an aggregate temporary with a
    // non-trivial member (Noted{...}) inside a co_await expression.
    auto stored = ctx.persist(Noted{m.text});
    (void)co_await std::move(stored);
    co_return Effect::none();
  }

  Task<Effect> boom(Context& ctx) {
    auto stored = ctx.persist(Noted{"before the throw"});
    (void)co_await std::move(stored);
    throw std::runtime_error("boom after an await");
  }

  void on_event(State& s, const Event& e) { Pay{}.on_event(s, e); }

  std::optional<Processing<Event>> processing(const State& s) const {
    if (s.phase != Phase::settling) return std::nullopt;
    return Processing<Event>{processing_timeout, TimedOut{}};
  }
};

class CoroutineEntities : public ::testing::Test {
 protected:
  CoroutineEntities() { boot(); }
  ~CoroutineEntities() override { drop(); }

  EntitySettings default_settings() {
    EntitySettings s;
    s.type_name = "pay";
    s.idle_timeout = Duration::zero();
    s.shards = 2;
    s.stop_timeout = 2s;
    s.log = false;
    return s;
  }
  void boot(std::optional<EntitySettings> s = std::nullopt) {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.clock = clock;
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    gateway = std::make_unique<testkit::TestProbe<GatewayRequest>>(*system, "gateway");
    auto r = EntityRegistry<CoPay>::start(*system, journal, s ? *s : default_settings(), pay_codecs(),
                                          [gw = gateway->ref(), sn = seen](const std::string&) {
                                            return CoPay{gw, 15s, sn};
                                          });
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    reg.emplace(std::move(*r));
  }
  void drop() {
    if (!system) return;
    reg->abandon();
    reg.reset();
    gateway.reset();
    system.reset();
  }
  void settle() { ASSERT_TRUE(system->wait_idle(10s)); }
  void advance(Duration d) {
    clock->advance(d);
    settle();
  }
  std::string state_of(const std::string& id) {
    auto r = reg->ask<std::string>(id, [](ReplyTo<std::string> t) { return GetState{std::move(t)}; }, 10s).get();
    return r.ok() ? *r : r.error().to_string();
  }
  Future<std::string> ask(const std::string& id, auto make) { return reg->ask<std::string>(id, make, 1h); }
  // Starts a settlement; returns the client's future and the gateway request.
  std::pair<Future<std::string>, GatewayRequest> start_settle(const std::string& id, std::int64_t amount) {
    auto f = ask(id, [amount](ReplyTo<std::string> t) { return Settle{amount, std::move(t)}; });
    GatewayRequest req = gateway->expect_message();
    settle();
    return {std::move(f), std::move(req)};
  }
  std::vector<std::string> event_types(const std::string& id) {
    std::vector<std::string> out;
    auto events = journal_sync::replay(*journal, "pay|" + id);
    if (events.ok()) {
      for (auto& e : *events) out.push_back(e.type);
    }
    return out;
  }
  using Types = std::vector<std::string>;

  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<testkit::TestProbe<GatewayRequest>> gateway;
  std::optional<EntityRegistry<CoPay>> reg;
};

TEST_F(CoroutineEntities, a_handler_persists_awaits_the_gateway_and_persists_the_outcome) {
  auto [client, req] = start_settle("p1", 5);
  EXPECT_EQ(req.amount, 5);  // read from the state the handler's own persist made
  EXPECT_EQ(seen->frames.load(), 1);
  // The entity keeps answering while the handler waits.
  EXPECT_EQ(state_of("p1"), "settling amount=5 notes=0 timeouts=0");
  EXPECT_FALSE(client.ready());
  req.reply_to.reply(true);
  auto r = client.get();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r, "completed amount=5 notes=0 timeouts=0");
  settle();
  EXPECT_EQ(seen->frames.load(), 0);
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "Completed"}));
}

TEST_F(CoroutineEntities, E1_the_handlers_episode_times_out_from_its_stored_event) {
  auto [client, req] = start_settle("p1", 1);
  advance(15s - 1ms);
  EXPECT_EQ(state_of("p1"), "settling amount=1 notes=0 timeouts=0");
  advance(1ms);
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].timestamp_ms - (*events)[0].timestamp_ms, 15000);
}

// proves: E2
TEST_F(CoroutineEntities, E2_a_gateway_answer_after_the_deadline_never_resumes_the_handler) {
  auto [client, req] = start_settle("p1", 1);
  advance(15s);  // the deadline stores TimedOut and destroys the waiting handler
  ASSERT_TRUE(client.wait_for(5s));  // answered, not left waiting for the gateway
  auto r = client.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::timeout);
  EXPECT_EQ(seen->frames.load(), 0);
  req.reply_to.reply(true);  // the late answer
  settle();
  EXPECT_EQ(seen->answers.load(), 0);
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "TimedOut"}));
}

// proves: E2
TEST_F(CoroutineEntities, E2_an_episode_ended_by_another_command_destroys_the_handler_waiting_in_it) {
  auto [client, req] = start_settle("p1", 1);
  auto retry = ask("p1", [](ReplyTo<std::string> t) { return Retry{0, std::move(t)}; });
  EXPECT_EQ(*retry.get(), "failed amount=1 notes=0 timeouts=0");
  ASSERT_TRUE(client.wait_for(5s));
  auto r = client.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(seen->frames.load(), 0);
  req.reply_to.reply(true);
  settle();
  EXPECT_EQ(seen->answers.load(), 0);
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "Declined"}));
  advance(15s);  // the ended episode's deadline is stale
  EXPECT_EQ(reg->stats().processing_timeouts, 0u);
}

TEST_F(CoroutineEntities, E3_the_timeout_unstashes_what_waited_behind_the_handler) {
  auto [client, req] = start_settle("p1", 1);
  auto cancel = ask("p1", [](ReplyTo<std::string> t) { return Cancel{std::move(t)}; });
  settle();
  EXPECT_FALSE(cancel.ready());
  advance(15s);
  EXPECT_EQ(*cancel.get(), "too late: failed");
}

TEST_F(CoroutineEntities, E4_the_handlers_outcome_cancels_the_deadline) {
  auto [client, req] = start_settle("p1", 1);
  req.reply_to.reply(false);
  EXPECT_EQ(*client.get(), "failed amount=1 notes=0 timeouts=0");
  advance(30s);
  EXPECT_EQ(reg->stats().processing_timeouts, 0u);
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "Declined"}));
}

TEST_F(CoroutineEntities, E5_an_entity_is_not_passivated_while_its_handler_waits) {
  drop();
  auto s = default_settings();
  s.idle_timeout = 5s;
  boot(s);
  auto [client, req] = start_settle("p1", 1);
  advance(5s);
  advance(5s);
  EXPECT_EQ(reg->stats().passivations, 0u);
  EXPECT_EQ(seen->frames.load(), 1);
  req.reply_to.reply(true);
  ASSERT_TRUE(client.get().ok());
  advance(5s);
  advance(5s);
  EXPECT_EQ(reg->stats().passivations, 1u);
}

TEST_F(CoroutineEntities, E6_a_stop_waits_for_the_handlers_answer_then_stops) {
  auto [client, req] = start_settle("p1", 1);
  reg->begin_stop();
  settle();
  EXPECT_FALSE(reg->wait_stopped(50ms));
  req.reply_to.reply(true);
  EXPECT_EQ(*client.get(), "completed amount=1 notes=0 timeouts=0");
  EXPECT_TRUE(reg->wait_stopped(5s));
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "Completed"}));
}

TEST_F(CoroutineEntities, E6_a_stop_waits_for_the_deadline_and_the_handler_is_destroyed) {
  auto [client, req] = start_settle("p1", 1);
  reg->begin_stop();
  settle();
  advance(14s);
  EXPECT_EQ(reg->stats().active, 1u);
  advance(1s);
  EXPECT_TRUE(reg->wait_stopped(5s));
  EXPECT_EQ(client.get().error().code(), ErrorCode::timeout);
  EXPECT_EQ(seen->frames.load(), 0);
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "TimedOut"}));
}

TEST_F(CoroutineEntities, an_immediate_stop_destroys_the_handler_and_the_episode_resumes_on_recovery) {
  auto [client, req] = start_settle("p1", 1);
  reg->begin_immediate_stop();
  EXPECT_TRUE(reg->wait_stopped(5s));
  auto r = client.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(seen->frames.load(), 0);
  req.reply_to.reply(true);  // to the stopped incarnation
  drop();
  clock->set_wall(clock->wall_now() + 20s);
  boot();
  EXPECT_EQ(state_of("p1"), "settling amount=1 notes=0 timeouts=0");  // recovered mid-episode
  advance(0ms);  // its deadline is already due
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
  EXPECT_EQ(seen->answers.load(), 0);
}

TEST_F(CoroutineEntities, a_second_coroutine_handler_waits_for_the_first) {
  auto [client, req] = start_settle("p1", 1);
  ASSERT_TRUE(reg->tell("p1", Note{"during"}).ok());
  settle();
  EXPECT_EQ(state_of("p1"), "settling amount=1 notes=0 timeouts=0");
  EXPECT_EQ(seen->frames.load(), 1);  // the note's coroutine has not started
  req.reply_to.reply(true);
  ASSERT_TRUE(client.get().ok());
  settle();
  EXPECT_EQ(state_of("p1"), "completed amount=1 notes=1 timeouts=0");
  EXPECT_EQ(event_types("p1"), (Types{"Accepted", "Completed", "Noted"}));
  EXPECT_EQ(seen->frames.load(), 0);
}

TEST_F(CoroutineEntities, a_failed_persist_in_a_handler_answers_the_command_and_stops_the_incarnation) {
  journal->fail_next_appends(1, Error(ErrorCode::journal_failed, "disk full"));
  auto r = ask("p1", [](ReplyTo<std::string> t) { return Settle{1, std::move(t)}; }).get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  settle();
  EXPECT_EQ(seen->frames.load(), 0);
  gateway->expect_no_message(20ms);
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=0 timeouts=0");
}

TEST_F(CoroutineEntities, a_handler_that_throws_after_an_await_fails_its_command_only) {
  ASSERT_TRUE(reg->tell("p1", Boom{}).ok());
  settle();
  EXPECT_EQ(reg->stats().handler_failures, 1u);
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=1 timeouts=0");  // what it stored stays
}

}  // namespace
