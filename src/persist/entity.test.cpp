// The entity runtime against SPEC E1-E8, on the manual clock and the
// in-memory journal. One E1 test runs the payment in a child process on the
// SQLite journal, kills it with SIGKILL mid-episode and recovers here.

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "entity_test_support.hpp"
#include "journal_test_support.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::test;

namespace {

class Entities : public ::testing::Test {
 protected:
  Entities() { boot(); }
  ~Entities() override { drop(); }

  EntitySettings default_settings() {
    EntitySettings s;
    s.type_name = "pay";
    s.idle_timeout = Duration::zero();
    s.shards = 2;
    s.stop_timeout = 2s;  // real time: graceful stops in these tests end by advance()
    s.log = false;
    return s;
  }

  // A fresh actor system (same clock, same journal) with the registry.
  void boot(std::optional<EntitySettings> s = std::nullopt, std::optional<StateCodec<PayState>> snaps = std::nullopt) {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.clock = clock;
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    gateway = std::make_unique<testkit::TestProbe<GatewayRequest>>(*system, "gateway");
    auto gw = gateway->ref();
    auto r = EntityRegistry<Pay>::start(
        *system, journal_ref ? journal_ref : journal, s ? *s : default_settings(), pay_codecs(),
        [gw, t = processing_timeout](const std::string&) { return Pay{gw, t}; }, std::move(snaps));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    reg.emplace(std::move(*r));
  }

  // The registry and its actor system are dropped without a graceful stop:
  // only what the journal acknowledged is there for the next boot().
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

  Result<std::string> ask_str(const std::string& id, auto make) {
    return reg->ask<std::string>(id, make, 10s).get();
  }
  std::string state_of(const std::string& id) {
    auto r = ask_str(id, [](ReplyTo<std::string> t) { return GetState{std::move(t)}; });
    return r.ok() ? *r : r.error().to_string();
  }
  // Settles and returns the gateway request the entity made.
  GatewayRequest settle_payment(const std::string& id, std::int64_t amount) {
    auto r = ask_str(id, [amount](ReplyTo<std::string> t) { return Settle{amount, std::move(t)}; });
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (r.ok()) {
      EXPECT_EQ(*r, "accepted " + std::to_string(amount));
    }
    return gateway->expect_message();
  }

  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::shared_ptr<Journal> journal_ref;  // another back end, when a test sets one
  Duration processing_timeout = 15s;
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<testkit::TestProbe<GatewayRequest>> gateway;
  std::optional<EntityRegistry<Pay>> reg;
};

// --- the happy path ---------------------------------------------------------------

TEST_F(Entities, a_command_persists_an_event_and_the_reply_sees_the_new_state) {
  auto req = settle_payment("p1", 500);
  EXPECT_EQ(req.id, "p1");
  EXPECT_EQ(req.amount, 500);
  req.reply_to.reply(true);
  settle();
  EXPECT_EQ(state_of("p1"), "completed amount=500 notes=0 timeouts=0");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].type, "Accepted");
  EXPECT_EQ((*events)[1].type, "Completed");
  EXPECT_EQ((*events)[0].timestamp_ms, detail::wall_ms(clock->wall_now()));
}

TEST_F(Entities, an_entity_recovers_its_state_from_the_journal_in_a_new_system) {
  auto req = settle_payment("p1", 7);
  req.reply_to.reply(true);
  settle();
  ASSERT_TRUE(reg->tell("p1", Note{"hello"}).ok());
  settle();
  drop();
  boot();
  EXPECT_EQ(state_of("p1"), "completed amount=7 notes=1 timeouts=0");
  EXPECT_EQ(reg->stats().recoveries, 1u);
}

TEST_F(Entities, commands_that_arrive_during_recovery_wait_and_run_after_it_in_order) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reg->tell("p1", Note{"n" + std::to_string(i)}).ok());
  settle();
  drop();
  boot();
  // Many commands at once to a cold entity: the first starts recovery, the
  // rest queue behind it.
  for (int i = 3; i < 10; ++i) ASSERT_TRUE(reg->tell("p1", Note{"n" + std::to_string(i)}).ok());
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=10 timeouts=0");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 10u);
  for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ((*events)[i].seq, i + 1);
}

// --- E1 ---------------------------------------------------------------------------

// proves: E1
TEST_F(Entities, E1_a_payment_recovered_an_hour_after_its_registry_was_dropped_in_settling_times_out_at_once) {
  auto req = settle_payment("p1", 100);  // held: the gateway never answers
  drop();
  clock->set_wall(clock->wall_now() + 1h);
  boot();
  EXPECT_EQ(state_of("p1"), "settling amount=100 notes=0 timeouts=0");
  advance(0ms);  // the deadline is already due: it fires without any time passing
  EXPECT_EQ(state_of("p1"), "failed amount=100 notes=0 timeouts=1");
  EXPECT_EQ(reg->stats().processing_timeouts, 1u);
}

// proves: E1
TEST_F(Entities, E1_a_payment_recovered_one_second_after_its_registry_was_dropped_times_out_at_fourteen_seconds_not_before) {
  auto req = settle_payment("p1", 100);  // held: the gateway never answers
  drop();
  clock->set_wall(clock->wall_now() + 1s);
  boot();
  EXPECT_EQ(state_of("p1"), "settling amount=100 notes=0 timeouts=0");
  advance(14s - 1ms);
  EXPECT_EQ(state_of("p1"), "settling amount=100 notes=0 timeouts=0");
  advance(1ms);
  EXPECT_EQ(state_of("p1"), "failed amount=100 notes=0 timeouts=1");
}

// proves: E1
TEST_F(Entities, E1_a_live_processing_episode_times_out_at_its_timeout) {
  auto req = settle_payment("p1", 1);  // held: the gateway never answers
  advance(15s - 1ms);
  EXPECT_EQ(state_of("p1"), "settling amount=1 notes=0 timeouts=0");
  advance(1ms);
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].type, "TimedOut");  // E3: the timeout is an event in the log
}

#ifdef TROUPE_SETTLING_CRASH_CHILD
// A child process (settling_crash_child_main.cpp) settles p1 on an SQLite
// file and is killed with SIGKILL while the payment waits for the gateway.
// Recovered here on the manual clock, the episode's deadline counts from
// the start stored in Accepted: 15 s after it, not before.
// proves: E1, V2
TEST_F(Entities, E1_on_sqlite_a_payment_settling_in_a_process_killed_with_sigkill_times_out_from_its_stored_start) {
  drop();
  TempDir dir;
  std::string path = dir.file("journal.db");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::string exe = TROUPE_SETTLING_CRASH_CHILD, id = "p1", amount = "42";
    char* argv[] = {exe.data(), path.data(), id.data(), amount.data(), nullptr};
    execv(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  std::string said;
  char c;
  while (said.find('\n') == std::string::npos) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 30000) <= 0 || read(fds[0], &c, 1) != 1) break;
    said += c;
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(fds[0]);
  ASSERT_EQ(said, "settling p1\n");
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  SqliteJournalOptions o;
  o.path = path;
  auto opened = SqliteJournal::open(o);
  ASSERT_TRUE(opened.ok()) << opened.error().to_string();
  journal_ref = std::move(*opened);
  auto stored = journal_sync::replay(*journal_ref, "pay|p1");
  ASSERT_TRUE(stored.ok()) << stored.error().to_string();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].type, "Accepted");
  const std::int64_t started = (*stored)[0].timestamp_ms;
  // Recovered 5 s after the episode began: 10 s are left.
  clock->set_wall(WallTime(std::chrono::milliseconds(started)) + 5s);
  boot();
  EXPECT_EQ(state_of("p1"), "settling amount=42 notes=0 timeouts=0");
  advance(10s - 1ms);
  EXPECT_EQ(state_of("p1"), "settling amount=42 notes=0 timeouts=0");
  advance(1ms);
  EXPECT_EQ(state_of("p1"), "failed amount=42 notes=0 timeouts=1");
  auto events = journal_sync::replay(*journal_ref, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].type, "TimedOut");
  EXPECT_EQ((*events)[1].timestamp_ms - started, 15000);
  drop();
  journal_ref.reset();
}
#endif  // TROUPE_SETTLING_CRASH_CHILD

// --- E2 ---------------------------------------------------------------------------

// The decline cancels the episode's deadline: it is not even delivered.
// (A deadline that was delivered before its episode ended is the E2 test
// below.)
// proves: E4
TEST_F(Entities, E4_a_declined_episodes_deadline_is_never_delivered_or_handled) {
  // Episode 1 starts at t=0 (deadline t=15s) and ends by a decline at t=10s.
  auto req = settle_payment("p1", 1);
  advance(10s);
  req.reply_to.reply(false);
  settle();
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=0");
  advance(10s);  // past episode 1's deadline: nothing happens
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=0");
  EXPECT_EQ(reg->stats().processing_timeouts, 0u);
  EXPECT_EQ(reg->stats().stale_deadlines, 0u);
}

// proves: E2
TEST_F(Entities, E2_only_the_last_episode_in_a_replayed_log_arms_a_deadline) {
  // History: episode A (entered at t0, declined), then episode B entered at
  // t0+10s and still open. Recovery replays both; only B's deadline counts.
  drop();
  EventRecord a{1, detail::wall_ms(clock->wall_now()), "Accepted", 1, ByteWriter().i64(5).take()};
  EventRecord d{2, a.timestamp_ms + 1000, "Declined", 1, ByteWriter().str("no").take()};
  EventRecord b{3, a.timestamp_ms + 10000, "Accepted", 1, ByteWriter().i64(6).take()};
  ASSERT_TRUE(journal_sync::append(*journal, AppendBatch{"pay|p1", {a, d, b}}).ok());
  clock->set_wall(clock->wall_now() + 16s);  // A's deadline (t0+15s) has passed, B's (t0+25s) has not
  boot();
  EXPECT_EQ(state_of("p1"), "settling amount=6 notes=0 timeouts=0");
  advance(0ms);
  EXPECT_EQ(state_of("p1"), "settling amount=6 notes=0 timeouts=0");
  advance(9s - 1ms);
  EXPECT_EQ(state_of("p1"), "settling amount=6 notes=0 timeouts=0");
  advance(1ms);
  EXPECT_EQ(state_of("p1"), "failed amount=6 notes=0 timeouts=1");
}

// Episode 1's deadline fires while the append that ends it and starts
// episode 2 is in flight; by the time the entity looks at it, episode 2 is
// live. Only episode 2's own deadline may end episode 2.
// proves: E2
TEST_F(Entities, E2_an_earlier_episodes_deadline_firing_during_a_live_later_episode_is_never_handled) {
  auto first = settle_payment("p1", 1);  // episode 1 enters at t0: deadline t0+15s
  advance(10s);
  journal->hold();  // the retry's append (Declined, Accepted) stays in flight...
  auto retry = reg->ask<std::string>("p1", [](ReplyTo<std::string> t) { return Retry{2, std::move(t)}; }, 1h);
  settle();
  advance(5s);  // ...while episode 1's deadline (t0+15s) is delivered
  EXPECT_EQ(reg->stats().processing_timeouts, 0u);
  journal->release_held();  // episode 1 ends, episode 2 enters at t0+10s: deadline t0+25s
  settle();
  auto r = retry.get();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r, "retrying 2");
  auto second = gateway->expect_message();  // held: the gateway never answers
  EXPECT_EQ(second.amount, 2);
  EXPECT_EQ(state_of("p1"), "settling amount=2 notes=0 timeouts=0");
  EXPECT_EQ(reg->stats().stale_deadlines, 1u);
  EXPECT_EQ(reg->stats().processing_timeouts, 0u);
  advance(10s - 1ms);
  EXPECT_EQ(state_of("p1"), "settling amount=2 notes=0 timeouts=0");
  advance(1ms);
  EXPECT_EQ(state_of("p1"), "failed amount=2 notes=0 timeouts=1");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 4u);
  EXPECT_EQ((*events)[1].type, "Declined");
  EXPECT_EQ((*events)[2].type, "Accepted");
  EXPECT_EQ((*events)[3].type, "TimedOut");
  EXPECT_EQ((*events)[3].timestamp_ms - (*events)[0].timestamp_ms, 25000);
}

// --- E3 ---------------------------------------------------------------------------

// proves: E3
TEST_F(Entities, E3_the_timeout_persists_the_timeout_event_leaves_processing_and_unstashes) {
  auto req = settle_payment("p1", 1);  // held: the gateway never answers
  // Commands during Settling are stashed by the handler.
  ASSERT_TRUE(reg->tell("p1", Note{"during"}).ok());
  auto cancel = reg->ask<std::string>("p1", [](ReplyTo<std::string> t) { return Cancel{std::move(t)}; }, 1h);
  settle();
  EXPECT_FALSE(cancel.ready());
  advance(15s);
  auto c = cancel.get();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, "too late: failed");  // handled after the timeout, in the new state
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=1 timeouts=1");
}

// What the node shows as "processing longest".
TEST_F(Entities, TheRegistryListsEntitiesInAProcessingEpisodeWithTheirStartAndDeadlineUntilTheEpisodeEnds) {
  auto first = settle_payment("p1", 1);
  advance(2s);
  auto second = settle_payment("p2", 2);
  EXPECT_EQ(reg->processing_count(), 2u);
  auto list = reg->processing(10);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].id, "p1");  // the longest first
  EXPECT_EQ(list[1].id, "p2");
  EXPECT_EQ(list[0].deadline_ms - list[0].since_ms, 15000);
  EXPECT_EQ(list[1].since_ms - list[0].since_ms, 2000);
  EXPECT_EQ(reg->processing(1).size(), 1u);
  ASSERT_TRUE(reg->processing_of("p2").has_value());
  EXPECT_FALSE(reg->processing_of("nobody").has_value());
  first.reply_to.reply(true);  // p1's episode ends by its answer
  settle();
  EXPECT_FALSE(reg->processing_of("p1").has_value());
  advance(15s);  // p2's by its deadline
  EXPECT_EQ(state_of("p2"), "failed amount=2 notes=0 timeouts=1");
  EXPECT_EQ(reg->processing_count(), 0u);
}

// --- E4 ---------------------------------------------------------------------------

// proves: E4
TEST_F(Entities, E4_completion_cancels_the_deadline_so_no_timeout_is_delivered_or_handled) {
  auto req = settle_payment("p1", 1);
  advance(5s);
  req.reply_to.reply(true);
  settle();
  auto before = system->stats();
  advance(1h);
  EXPECT_EQ(state_of("p1"), "completed amount=1 notes=0 timeouts=0");
  auto st = reg->stats();
  EXPECT_EQ(st.processing_timeouts, 0u);
  EXPECT_EQ(st.stale_deadlines, 0u);
  EXPECT_EQ(system->stats().stale_timer_fires, before.stale_timer_fires);  // not even delivered
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 2u);
}

// proves: E4
TEST_F(Entities, E4_a_gateway_answer_after_the_timeout_changes_nothing) {
  auto req = settle_payment("p1", 1);
  advance(15s);
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
  req.reply_to.reply(true);  // late
  settle();
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
}

// --- E5 ---------------------------------------------------------------------------

// proves: E5
TEST_F(Entities, E5_an_idle_entity_is_passivated_and_recovered_by_its_next_command) {
  drop();
  auto s = default_settings();
  s.idle_timeout = 120s;
  boot(s);
  ASSERT_TRUE(reg->tell("p1", Note{"a"}).ok());
  settle();
  EXPECT_EQ(reg->stats().active, 1u);
  advance(119s);
  EXPECT_EQ(reg->stats().active, 1u);
  advance(1s);
  EXPECT_EQ(reg->stats().active, 0u);
  EXPECT_EQ(reg->stats().passivations, 1u);
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=1 timeouts=0");
  EXPECT_EQ(reg->stats().incarnations_started, 2u);
}

// proves: E5
TEST_F(Entities, E5_a_processing_entity_is_not_passivated_while_it_waits) {
  drop();
  auto s = default_settings();
  s.idle_timeout = 5s;
  boot(s);
  auto req = settle_payment("p1", 1);
  advance(5s);
  advance(5s);
  EXPECT_EQ(reg->stats().passivations, 0u);
  req.reply_to.reply(true);
  settle();
  advance(5s);
  EXPECT_EQ(reg->stats().passivations, 1u);
  EXPECT_EQ(reg->stats().active, 0u);
}

// proves: E5
TEST_F(Entities, E5_commands_sent_while_an_entity_passivates_reach_its_next_incarnation) {
  // The entity asks to passivate; while the shard stops it, more commands
  // arrive. None is lost: the next incarnation handles them.
  journal->hold();  // keep the first note's append in flight so the stop must wait
  ASSERT_TRUE(reg->tell("p1", Note{"first"}).ok());
  auto sleep = reg->ask<std::string>("p1", [](ReplyTo<std::string> t) { return Sleep{std::move(t)}; }, 1h);
  settle();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reg->tell("p1", Note{"later" + std::to_string(i)}).ok());
  settle();
  journal->release_held();
  settle();
  ASSERT_TRUE(sleep.get().ok());
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=6 timeouts=0");
  EXPECT_EQ(reg->stats().passivations, 1u);
  EXPECT_EQ(reg->stats().incarnations_started, 2u);
}

// An idle entity is told to stop; the incarnation is held (a gate) after
// it asked to stop, so the shard has marked it stopping when the commands
// arrive. They wait in the shard's buffer and reach the next incarnation,
// all of them, in the order sent.
// proves: E5
TEST_F(Entities, E5_commands_arriving_while_an_idle_entity_passivates_reach_the_next_incarnation_in_order) {
  drop();
  auto s = default_settings();
  s.idle_timeout = 120s;
  boot(s);
  ASSERT_TRUE(reg->tell("p1", Note{"before"}).ok());
  settle();
  auto gate = [] { return std::make_shared<testkit::Gate>(); };
  // The incarnation is busy while its idle time runs out: what the idle
  // sweep sends it queues behind the held handler.
  auto busy_in = gate(), busy_out = gate();
  ASSERT_TRUE(reg->tell("p1", Hold{busy_in, busy_out}).ok());
  ASSERT_TRUE(busy_in->wait());
  clock->advance(120s);
  // One sweep of p1's shard (Idle to p1), then a second hold behind it.
  using ShardMsg = EntityRegistry<Pay>::ShardMsg;
  ASSERT_EQ(reg->shard_for("p1").tell(ShardMsg{ShardMsg::IdleTick{}}), Delivery::delivered);
  auto stopping_in = gate(), stopping_out = gate();
  ASSERT_TRUE(reg->tell("p1", Hold{stopping_in, stopping_out}).ok());
  busy_out->open();
  // p1 handled Idle (idle for 120 s: it asked to stop), then the second
  // hold; the shard has marked it stopping and sent it the stop request.
  ASSERT_TRUE(stopping_in->wait());
  auto until = std::chrono::steady_clock::now() + 10s;
  while (reg->stats().passivations == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(reg->stats().passivations, 1u);
  EXPECT_EQ(reg->stats().incarnations_started, 1u);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reg->tell("p1", Note{"during" + std::to_string(i)}).ok());
  stopping_out->open();
  settle();
  EXPECT_EQ(reg->stats().incarnations_started, 2u);
  EXPECT_EQ(reg->stats().recoveries, 2u);
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=6 timeouts=0");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 6u);
  std::vector<std::string> notes;
  for (const auto& e : *events) {
    ByteReader rd(e.payload);
    notes.push_back(rd.str());
  }
  EXPECT_EQ(notes, (std::vector<std::string>{"before", "during0", "during1", "during2", "during3", "during4"}));
}

// proves: E5
TEST_F(Entities, E5_an_entity_may_ask_to_be_passivated) {
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return Sleep{std::move(t)}; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "sleeping");
  settle();
  EXPECT_EQ(reg->stats().active, 0u);
  EXPECT_EQ(reg->stats().passivations, 1u);
}

// --- E6 ---------------------------------------------------------------------------

// proves: E6
TEST_F(Entities, E6_a_stop_during_settling_waits_for_the_gateway_reply_then_stops) {
  auto req = settle_payment("p1", 1);
  ASSERT_TRUE(reg->tell("p2", Note{"idle one"}).ok());
  settle();
  reg->begin_stop();
  settle();
  EXPECT_EQ(reg->stats().active, 1u);  // p2 stopped at once, p1 waits
  EXPECT_FALSE(reg->wait_stopped(50ms));
  EXPECT_EQ(reg->stats().stops_deferred, 1u);
  req.reply_to.reply(true);
  EXPECT_TRUE(reg->wait_stopped(5s));
  EXPECT_EQ(reg->stats().active, 0u);
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ(events->back().type, "Completed");
}

// proves: E6
TEST_F(Entities, E6_a_stop_during_settling_waits_for_the_deadline_if_no_reply_comes) {
  auto req = settle_payment("p1", 1);  // held: the gateway never answers
  reg->begin_stop();
  settle();
  advance(14s);
  EXPECT_EQ(reg->stats().active, 1u);
  advance(1s);
  EXPECT_TRUE(reg->wait_stopped(5s));
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->back().type, "TimedOut");
}

// proves: E6
TEST_F(Entities, E6_commands_after_a_stop_began_are_refused_with_shutting_down) {
  ASSERT_TRUE(reg->tell("p1", Note{"x"}).ok());
  settle();
  reg->begin_stop();
  EXPECT_TRUE(reg->wait_stopped(5s));
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return GetState{std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
}

// proves: E6
TEST_F(Entities, E6_the_actor_systems_shutdown_stops_entities_gracefully_first) {
  auto req = settle_payment("p1", 1);
  std::thread answer([&] {
    std::this_thread::sleep_for(100ms);
    req.reply_to.reply(true);
  });
  system->shutdown();  // waits for p1's episode to end
  answer.join();
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ(events->back().type, "Completed");
}

// proves: E6, E1
TEST_F(Entities, E6_an_immediate_stop_ends_a_processing_entity_at_once_and_its_deadline_rearms_where_it_recovers) {
  auto req = settle_payment("p1", 1);  // held: the gateway never answers
  ASSERT_TRUE(reg->tell("p1", Note{"waits behind the episode"}).ok());
  auto cancel = reg->ask<std::string>("p1", [](ReplyTo<std::string> t) { return Cancel{std::move(t)}; }, 1h);
  settle();
  reg->begin_stop();  // graceful: would wait for the episode...
  settle();
  EXPECT_FALSE(reg->wait_stopped(50ms));
  reg->begin_immediate_stop();  // ...the node lost its lease: stop now
  EXPECT_TRUE(reg->wait_stopped(5s));
  EXPECT_EQ(reg->stats().active, 0u);
  // The stashed request is handed back to the shard and answered there.
  auto c = cancel.get();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), ErrorCode::shutting_down) << c.error().to_string();
  // Nothing was appended by the stop: the episode is still open in the
  // journal, and the waiting command was not handled.
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ(events->back().type, "Accepted");
  // Where it recovers (here, a new registry), the deadline counts from the
  // stored start of the episode.
  drop();
  clock->set_wall(clock->wall_now() + 5s);
  boot();
  EXPECT_EQ(state_of("p1"), "settling amount=1 notes=0 timeouts=0");
  advance(10s);
  EXPECT_EQ(state_of("p1"), "failed amount=1 notes=0 timeouts=1");
}

// --- E7 ---------------------------------------------------------------------------

// proves: E7
TEST_F(Entities, E7_a_stale_incarnations_append_is_rejected_and_it_stops) {
  ASSERT_TRUE(reg->tell("p1", Note{"mine"}).ok());
  settle();
  // Another writer (another node's incarnation) appends seq 2 behind our back.
  EventRecord other{2, 0, "Noted", 1, ByteWriter().str("theirs").take()};
  ASSERT_TRUE(journal_sync::append(*journal, AppendBatch{"pay|p1", {other}}).ok());
  // Our incarnation believes the next number is 2: its append must fail.
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return Settle{9, std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict);
  settle();
  EXPECT_EQ(reg->stats().journal_conflicts, 1u);
  EXPECT_EQ(reg->stats().active, 0u);
  // The next command recovers a fresh incarnation that sees both events.
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=2 timeouts=0");
  auto events = journal_sync::replay(*journal, "pay|p1");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 2u);
}

// --- E8 ---------------------------------------------------------------------------

// proves: E8
TEST_F(Entities, E8_past_the_stash_bound_commands_get_an_explicit_overflow_error) {
  drop();
  auto s = default_settings();
  s.stash_capacity = 3;
  boot(s);
  auto req = settle_payment("p1", 1);  // held: the gateway never answers
  std::vector<Future<std::string>> cancels;
  for (int i = 0; i < 5; ++i)
    cancels.push_back(reg->ask<std::string>("p1", [](ReplyTo<std::string> t) { return Cancel{std::move(t)}; }, 1h));
  settle();
  int overflowed = 0;
  for (auto& f : cancels) {
    if (!f.ready()) continue;
    auto r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::stash_overflow);
    EXPECT_NE(r.error().message().find("pay|p1"), std::string::npos);
    ++overflowed;
  }
  EXPECT_EQ(overflowed, 2);
  EXPECT_EQ(reg->stats().stash_overflows, 2u);
  advance(15s);  // the three stashed cancels run after the timeout
  for (std::size_t i = 0; i < 3; ++i) {
    auto r = cancels[i].get();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, "too late: failed");
  }
}

// --- replies, failures, bad input ---------------------------------------------------

TEST_F(Entities, a_command_handled_without_a_reply_is_answered_with_a_clear_no_reply_error) {
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return Forget{std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::no_reply);
  EXPECT_NE(r.error().message().find("handled troupe::test::Forget without replying"), std::string::npos)
      << r.error().message();
  EXPECT_EQ(reg->stats().missing_replies, 1u);
}

TEST_F(Entities, a_throwing_command_handler_fails_that_command_only_and_keeps_the_rest) {
  ASSERT_TRUE(reg->tell("p1", Note{"a"}).ok());
  ASSERT_TRUE(reg->tell("p1", Boom{}).ok());
  ASSERT_TRUE(reg->tell("p1", Note{"b"}).ok());
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=2 timeouts=0");
  EXPECT_EQ(reg->stats().handler_failures, 1u);
  EXPECT_EQ(reg->stats().incarnations_started, 1u);
}

TEST_F(Entities, an_event_handler_that_throws_rebuilds_the_state_from_the_journal) {
  // The poisoned event is stored; folding it throws live and again on
  // replay, so the entity ends refusing commands with a recovery error that
  // says why, and other entities are untouched.
  ASSERT_TRUE(reg->tell("p1", Note{"a"}).ok());
  ASSERT_TRUE(reg->tell("p1", Note{"poison"}).ok());
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return GetState{std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::recovery_failed);
  EXPECT_NE(r.error().message().find("poisoned event"), std::string::npos) << r.error().message();
  EXPECT_EQ(state_of("p2"), "waiting amount=0 notes=0 timeouts=0");
}

TEST_F(Entities, a_failed_append_answers_the_request_with_the_journal_error_and_stops_the_incarnation) {
  journal->fail_next_appends(1, Error(ErrorCode::journal_failed, "disk full"));
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return Settle{1, std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(r.error().message().find("disk full"), std::string::npos);
  settle();
  EXPECT_EQ(reg->stats().journal_failures, 1u);
  gateway->expect_no_message(20ms);  // the gateway was never called
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=0 timeouts=0");
}

TEST_F(Entities, an_undecodable_event_fails_recovery_of_that_entity_only) {
  ASSERT_TRUE(reg->tell("good", Note{"x"}).ok());
  ASSERT_TRUE(reg->tell("bad", Note{"x"}).ok());
  ASSERT_TRUE(reg->tell("bad", Note{"y"}).ok());
  settle();
  drop();
  ASSERT_TRUE(journal->tamper("pay|bad", 2, EventRecord{0, 0, "Noted", 1, "\x05"}));
  boot();
  auto r = ask_str("bad", [](ReplyTo<std::string> t) { return GetState{std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::recovery_failed);
  EXPECT_NE(r.error().message().find("event 2"), std::string::npos) << r.error().message();
  // It keeps refusing, with the same error, and loses nothing else.
  auto again = ask_str("bad", [](ReplyTo<std::string> t) { return GetState{std::move(t)}; });
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::recovery_failed);
  EXPECT_EQ(state_of("good"), "waiting amount=0 notes=1 timeouts=0");
  EXPECT_EQ(reg->stats().recovery_failures, 1u);
  EXPECT_EQ(journal->size(), 3u);
}

TEST_F(Entities, an_unknown_manifest_fails_recovery_with_its_name) {
  ASSERT_TRUE(reg->tell("p1", Note{"x"}).ok());
  settle();
  drop();
  ASSERT_TRUE(journal->tamper("pay|p1", 1, EventRecord{0, 0, "Refunded", 3, ""}));
  boot();
  auto r = ask_str("p1", [](ReplyTo<std::string> t) { return GetState{std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::recovery_failed);
  EXPECT_NE(r.error().message().find("unknown event manifest 'Refunded' v3"), std::string::npos) << r.error().message();
}

TEST_F(Entities, an_empty_id_is_refused) {
  auto t = reg->tell("", Note{"x"});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::invalid_argument);
  auto a = ask_str("", [](ReplyTo<std::string> r) { return GetState{std::move(r)}; });
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), ErrorCode::invalid_argument);
}

TEST_F(Entities, bad_settings_are_refused_with_clear_errors) {
  auto try_start = [&](EntitySettings s, EventCodecs<PayEvent> c) {
    auto r = EntityRegistry<Pay>::start(*system, journal, std::move(s), std::move(c),
                                        [](const std::string&) { return Pay{}; });
    return r.ok() ? std::string("ok") : r.error().to_string();
  };
  auto s = default_settings();
  s.type_name = "";
  EXPECT_EQ(try_start(s, pay_codecs()), "invalid_argument: entity type name is empty");
  s.type_name = "a|b";
  EXPECT_EQ(try_start(s, pay_codecs()), "invalid_argument: entity type name 'a|b' contains '|'");
  s.type_name = "pay2";
  EXPECT_EQ(try_start(s, {}), "invalid_argument: entity type 'pay2': no event codecs registered");
  s.stash_capacity = 0;
  EXPECT_EQ(try_start(s, pay_codecs()), "invalid_argument: entity type 'pay2': stash capacity is 0");
  s.stash_capacity = 10;
  s.snapshot_every = 10;
  EXPECT_EQ(try_start(s, pay_codecs()), "invalid_argument: entity type 'pay2': snapshot_every needs a state codec");
  auto r = EntityRegistry<Pay>::start(*system, nullptr, default_settings(), pay_codecs());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
}

// --- snapshots ------------------------------------------------------------------------

TEST_F(Entities, snapshots_shorten_recovery_and_give_the_same_state) {
  drop();
  auto s = default_settings();
  s.snapshot_every = 4;
  boot(s, pay_state_codec());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(reg->tell("p1", Note{"n" + std::to_string(i)}).ok());
  settle();
  EXPECT_EQ(reg->stats().snapshots_saved, 2u);
  auto snap = journal_sync::load_snapshot(*journal, "pay|p1");
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE(snap->has_value());
  EXPECT_EQ((*snap)->seq, 8u);
  drop();
  boot(s, pay_state_codec());
  EXPECT_EQ(state_of("p1"), "waiting amount=0 notes=10 timeouts=0");
}

}  // namespace
