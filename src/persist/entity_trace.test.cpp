// Trace ids in the entity runtime (SPEC X4): each command's events are
// stored with the trace it arrived under, also when it waited for a persist
// in flight; what follows an append (replies, the gateway ask) stays under
// it; and the seed-000 lines (processing timed out, stop deferred while
// processing, passivated after a terminal state) are logged at info with
// the trace of the request they belong to, across a recovery too.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "entity_test_support.hpp"
#include "troupe/core/log.hpp"
#include "troupe/core/trace.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::test;

namespace {

class EntityTraces : public ::testing::Test {
 protected:
  EntityTraces() {
    EXPECT_TRUE(log::configure({.level = log::Level::info,
                                .format = log::Format::json,
                                .sink = [this](std::string_view line) {
                                  std::lock_guard lk(mu_);
                                  lines_.push_back(nlohmann::json::parse(line));
                                }})
                    .ok());
    boot();
  }
  ~EntityTraces() override {
    drop();
    (void)log::configure({});
  }

  void boot() {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.clock = clock;
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    gateway = std::make_unique<testkit::TestProbe<GatewayRequest>>(*system, "gateway");
    EntitySettings s;
    s.type_name = "pay";
    s.idle_timeout = Duration::zero();
    s.shards = 2;
    s.stop_timeout = 2s;
    auto gw = gateway->ref();
    auto r = EntityRegistry<Pay>::start(*system, journal, s, pay_codecs(),
                                        [gw](const std::string&) { return Pay{gw, 15s}; });
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

  // The lines with this message, as logged so far.
  std::vector<nlohmann::json> lines(const std::string& msg) {
    std::lock_guard lk(mu_);
    std::vector<nlohmann::json> out;
    for (auto& l : lines_)
      if (l["msg"] == msg) out.push_back(l);
    return out;
  }
  std::vector<std::string> traces_of(const std::string& pid) {
    auto events = journal_sync::replay(*journal, pid);
    EXPECT_TRUE(events.ok());
    std::vector<std::string> out;
    if (events.ok())
      for (auto& e : *events) out.push_back(e.trace_id);
    return out;
  }
  Result<std::string> settle_under(const TraceContext& t, const std::string& id, std::int64_t amount) {
    TraceScope scope(t);
    return reg->ask<std::string>(id, [amount](ReplyTo<std::string> r) { return Settle{amount, std::move(r)}; }, 10s)
        .get();
  }

  std::mutex mu_;
  std::vector<nlohmann::json> lines_;
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<testkit::TestProbe<GatewayRequest>> gateway;
  std::optional<EntityRegistry<Pay>> reg;
};

// proves: X4
TEST_F(EntityTraces, each_commands_events_carry_its_own_trace_even_when_it_waited_for_an_append) {
  auto a = TraceContext::generate();
  auto b = TraceContext::generate();
  {
    TraceScope scope(a);
    ASSERT_TRUE(reg->tell("p1", Note{"first"}).ok());
  }
  {
    TraceScope scope(b);
    ASSERT_TRUE(reg->tell("p1", Note{"second"}).ok());  // waits for the first one's append
  }
  ASSERT_TRUE(reg->tell("p1", Note{"untraced"}).ok());
  settle();
  EXPECT_EQ(traces_of("pay|p1"), (std::vector<std::string>{a.trace_id.hex(), b.trace_id.hex(), ""}));
}

// proves: X4
TEST_F(EntityTraces, the_gateway_answer_is_stored_under_the_trace_of_the_settle_that_asked_for_it) {
  auto t = TraceContext::generate();
  ASSERT_TRUE(settle_under(t, "p1", 5).ok());
  auto req = gateway->expect_message();
  req.reply_to.reply(true);  // answered from outside any trace
  settle();
  EXPECT_EQ(traces_of("pay|p1"), (std::vector<std::string>{t.trace_id.hex(), t.trace_id.hex()}));
}

TEST_F(EntityTraces, a_processing_timeout_is_logged_at_info_and_stored_under_the_episodes_trace) {
  auto t = TraceContext::generate();
  ASSERT_TRUE(settle_under(t, "p1", 5).ok());
  auto req = gateway->expect_message();  // never answered
  clock->advance(15s);
  settle();
  auto timed_out = lines("processing timed out");
  ASSERT_EQ(timed_out.size(), 1u);
  EXPECT_EQ(timed_out[0]["level"], "info");
  EXPECT_EQ(timed_out[0]["component"], "persist");
  EXPECT_EQ(timed_out[0]["entity"], "pay|p1");
  EXPECT_EQ(timed_out[0]["timeout_ms"], 15000);
  EXPECT_EQ(timed_out[0]["trace_id"], t.trace_id.hex());
  EXPECT_EQ(traces_of("pay|p1"), (std::vector<std::string>{t.trace_id.hex(), t.trace_id.hex()}));
  EXPECT_EQ(reg->stats().processing_timeouts, 1u) << "the counter stays";
}

TEST_F(EntityTraces, a_recovered_episode_times_out_under_the_trace_it_was_stored_with) {
  auto t = TraceContext::generate();
  ASSERT_TRUE(settle_under(t, "p1", 5).ok());
  auto req = gateway->expect_message();  // held: never answered
  drop();
  clock->set_wall(clock->wall_now() + 1h);
  boot();
  ASSERT_TRUE(reg->tell("p1", Note{"wake up"}).ok());  // recovers, and the deadline is long past
  settle();
  clock->advance(0ms);  // the deadline is already due: it fires without any time passing
  settle();
  auto timed_out = lines("processing timed out");
  ASSERT_EQ(timed_out.size(), 1u);
  EXPECT_EQ(timed_out[0]["trace_id"], t.trace_id.hex());
  auto traces = traces_of("pay|p1");
  ASSERT_GE(traces.size(), 2u);
  EXPECT_EQ(traces[1], t.trace_id.hex()) << "the TimedOut event";
}

TEST_F(EntityTraces, a_stop_deferred_while_processing_is_logged_at_info_with_the_episodes_trace) {
  auto t = TraceContext::generate();
  ASSERT_TRUE(settle_under(t, "p1", 5).ok());
  auto req = gateway->expect_message();
  reg->begin_stop();
  settle();
  auto deferred = lines("stop deferred while processing");
  ASSERT_EQ(deferred.size(), 1u);
  EXPECT_EQ(deferred[0]["level"], "info");
  EXPECT_EQ(deferred[0]["entity"], "pay|p1");
  EXPECT_EQ(deferred[0]["trace_id"], t.trace_id.hex());
  EXPECT_EQ(reg->stats().stops_deferred, 1u);
  req.reply_to.reply(true);
  EXPECT_TRUE(reg->wait_stopped(5s));
}

TEST_F(EntityTraces, passivation_after_a_terminal_state_is_logged_at_info_with_the_commands_trace) {
  auto t = TraceContext::generate();
  {
    TraceScope scope(t);
    auto r = reg->ask<std::string>("p1", [](ReplyTo<std::string> to) { return Sleep{std::move(to)}; }, 10s).get();
    ASSERT_TRUE(r.ok());
  }
  settle();
  auto passivated = lines("passivated after a terminal state");
  ASSERT_EQ(passivated.size(), 1u);
  EXPECT_EQ(passivated[0]["level"], "info");
  EXPECT_EQ(passivated[0]["trace_id"], t.trace_id.hex());
  EXPECT_EQ(reg->stats().passivations, 1u);
}

}  // namespace
