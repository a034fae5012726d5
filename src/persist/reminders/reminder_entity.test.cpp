// Reminders and entities (reminder_service.hpp, SPEC R2): an entity sets a
// reminder from its command handler through a Reminders handle its factory
// gave it; the entity is passivated (or its whole node stops), and the
// reminder re-activates it and its command arrives. Manual clock, real
// EntityRegistry, MemoryJournal.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "../journal_test_support.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/persist/reminder_service.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe;

// Commands: arm a reminder `in` from now; the reminder's ring; read.
struct Arm {
  std::string name;
  Duration in{};
  Duration period{};
  ReplyTo<std::string> reply_to;
};
struct Ring {
  std::string name;
  std::int64_t due_ms = 0;
};
struct Read {
  ReplyTo<std::string> reply_to;
};
// A ring that is answered once its event is stored (for ask_entities).
struct RingAck {
  std::string name;
  ReplyTo<std::string> reply_to;
};
using ClerkCmd = std::variant<Arm, Ring, Read, RingAck>;

struct Armed {
  std::string name;
};
struct Rang {
  std::string name;
};
using ClerkEvent = std::variant<Armed, Rang>;

struct ClerkState {
  std::vector<std::string> log;  // "armed x", "rang x"
};

std::string joined(const ClerkState& s) {
  std::string out;
  for (const auto& l : s.log) out += (out.empty() ? "" : ", ") + l;
  return out;
}

struct Clerk {
  using Command = ClerkCmd;
  using Event = ClerkEvent;
  using State = ClerkState;
  using Effect = troupe::Effect<Event, State>;

  Reminders reminders;  // given by the factory: non-blocking, thread-safe

  Effect on_command(const State& s, Command& c, EntityContext<Clerk>& ctx) {
    return std::visit(overloaded{
                          [&](Arm& a) -> Effect {
                            // Stored by the service shortly; the entity does not wait.
                            (void)reminders.set(ctx.persistence_id(), a.name, ctx.wall_now() + a.in, a.period);
                            return Effect::persist(Armed{a.name}).then_reply(a.reply_to, [](const State& st) {
                              return joined(st);
                            });
                          },
                          [&](Ring& r) -> Effect { return Effect::persist(Rang{r.name}); },
                          [&](Read& r) -> Effect { return Effect::reply(r.reply_to, joined(s)); },
                          [&](RingAck& r) -> Effect {
                            return Effect::persist(Rang{r.name}).then_reply(r.reply_to, [](const State& st) {
                              return joined(st);
                            });
                          },
                      },
                      c);
  }
  void on_event(State& s, const Event& e) {
    std::visit(overloaded{[&](const Armed& a) { s.log.push_back("armed " + a.name); },
                          [&](const Rang& r) { s.log.push_back("rang " + r.name); }},
               e);
  }
};

EventCodecs<ClerkEvent> clerk_codecs() {
  EventCodecs<ClerkEvent> c;
  c.add<Armed>(
      "Armed", 1, [](const Armed& e, ByteWriter& w) { w.str(e.name); },
      [](std::uint32_t, ByteReader& r) -> Result<Armed> {
        Armed e;
        e.name = r.str();
        return r.finish(std::move(e));
      });
  c.add<Rang>(
      "Rang", 1, [](const Rang& e, ByteWriter& w) { w.str(e.name); },
      [](std::uint32_t, ByteReader& r) -> Result<Rang> {
        Rang e;
        e.name = r.str();
        return r.finish(std::move(e));
      });
  return c;
}

class EntityReminders : public ::testing::Test {
 protected:
  EntityReminders() { boot(); }
  ~EntityReminders() override { drop(); }

  // A node: an actor system on the shared clock, the clerks (passivated
  // after 5 s idle) and a reminder service on the shared store.
  void boot() {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.clock = clock;
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    // The handle is filled once the service runs, while the service's first
    // deliveries may already start clerks: the slot is read and written
    // under its lock.
    struct Slot {
      std::mutex mu;
      Reminders handle;
    };
    auto slot = std::make_shared<Slot>();
    EntitySettings s;
    s.type_name = "clerk";
    s.idle_timeout = 5s;
    s.shards = 2;
    s.stop_timeout = 2s;
    s.log = false;
    auto r = EntityRegistry<Clerk>::start(*system, journal, s, clerk_codecs(),
                                          [slot](const std::string&) {
                                            std::lock_guard lk(slot->mu);
                                            return Clerk{slot->handle};
                                          });
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    reg.emplace(*r);
    ReminderSettings rs;
    rs.log = false;
    auto svc = ReminderService::start(*system, store, rs, deliver_to_entities(*reg, [](const Reminder& m) {
                                        return Ring{m.name, m.due_ms};
                                      }));
    ASSERT_TRUE(svc.ok()) << svc.error().to_string();
    service.emplace(*svc);
    {
      std::lock_guard lk(slot->mu);
      slot->handle = service->handle();
    }
    settle();
  }
  // As in a crash: nothing stops gracefully; the journal and the store keep
  // what they acknowledged.
  void drop() {
    if (!system) return;
    reg->abandon();
    service.reset();
    reg.reset();
    system.reset();
  }
  void settle() { ASSERT_TRUE(system->wait_idle(10s)); }
  std::int64_t ms_now() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(clock->wall_now().time_since_epoch()).count();
  }
  // One timer deadline at a time, settled at each: a service that re-arms
  // its wake from a fire is never overtaken by the clock, however slow the
  // build (as ManualClockTest::advance_settled).
  void advance(Duration total) {
    troupe::testkit::advance_settled(*clock, total, [this] { settle(); });
  }
  std::string ask(const std::string& id, auto make) {
    auto r = reg->ask<std::string>(id, make, 10s).get();
    return r.ok() ? *r : r.error().to_string();
  }
  std::string read(const std::string& id) {
    return ask(id, [](ReplyTo<std::string> t) { return Read{std::move(t)}; });
  }

  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::shared_ptr<ReminderStore> store = make_memory_reminder_store();
  std::unique_ptr<ActorSystem> system;
  std::optional<EntityRegistry<Clerk>> reg;
  std::optional<ReminderService> service;
};

// proves: R2
TEST_F(EntityReminders, a_reminder_set_by_a_passivated_entity_activates_it_and_its_command_arrives) {
  EXPECT_EQ(ask("c1", [](ReplyTo<std::string> t) { return Arm{"expire", 60s, {}, std::move(t)}; }), "armed expire");
  settle();
  ASSERT_EQ(store->list("clerk|c1")->size(), 1u);
  advance(10s);
  EXPECT_EQ(reg->stats().active, 0u) << "idle for 5 s: passivated";
  EXPECT_EQ(reg->stats().passivations, 1u);
  advance(49s);
  EXPECT_EQ(reg->stats().active, 0u);
  advance(1s);
  EXPECT_EQ(reg->stats().incarnations_started, 2u) << "the reminder activated it";
  EXPECT_EQ(read("c1"), "armed expire, rang expire");
  EXPECT_TRUE(store->list("clerk|c1")->empty());
  auto events = journal_sync::replay(*journal, "clerk|c1");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 2u);
  EXPECT_EQ(service->stats().delivered, 1u);
}

// proves: R2
TEST_F(EntityReminders, a_periodic_reminder_outlives_its_node_and_fires_once_for_the_periods_missed_while_down) {
  EXPECT_EQ(ask("c2", [](ReplyTo<std::string> t) { return Arm{"audit", 10s, 10s, std::move(t)}; }),
            "armed audit");
  advance(10s);
  EXPECT_EQ(read("c2"), "armed audit, rang audit");
  drop();
  clock->advance(45s);  // down: four periods pass with no node
  boot();
  EXPECT_EQ(read("c2"), "armed audit, rang audit, rang audit") << "the missed periods fire once";
  advance(4s);
  EXPECT_EQ(read("c2"), "armed audit, rang audit, rang audit") << "not before the next boundary";
  advance(1s);
  EXPECT_EQ(read("c2"), "armed audit, rang audit, rang audit, rang audit");
}

TEST_F(EntityReminders, an_asked_delivery_succeeds_once_the_entity_stored_its_event_and_is_retried_while_it_cannot) {
  service->stop();
  settle();
  ReminderSettings rs;
  rs.log = false;
  rs.min_backoff = 1s;
  auto asked = ReminderService::start(
      *system, store, rs,
      ask_entities<std::string>(
          *reg, [](const Reminder& m, ReplyTo<std::string> t) { return RingAck{m.name, std::move(t)}; }, 5s));
  ASSERT_TRUE(asked.ok());
  settle();  // started and armed before time moves
  // The journal refuses the first append: the entity stops, the ask fails,
  // the firing stays and is delivered again after the back-off.
  journal->fail_next_appends(1, Error(ErrorCode::journal_failed, "disk full"));
  ASSERT_TRUE(store->set({"clerk|c4", "expire", ms_now() + 1000, 0, {}}).ok());
  asked->poke();
  settle();  // the poke's look at the store is done (nothing due yet) and the wake armed
  advance(1s);
  // The ask's failure crosses the entity, the journal and the service:
  // waited for in real time (bounded), not assumed done by the advance.
  auto eventually = [](auto&& ok) {
    for (int i = 0; i < 1000 && !ok(); ++i) std::this_thread::sleep_for(10ms);
    return ok();
  };
  EXPECT_TRUE(eventually([&] { return asked->stats().failed == 1u; }))
      << "failed " << asked->stats().failed << ", in flight " << asked->stats().in_flight;
  EXPECT_EQ(store->list("clerk|c4")->size(), 1u);
  advance(1s);
  EXPECT_TRUE(eventually([&] { return asked->stats().delivered == 1u; })) << asked->stats().delivered;
  EXPECT_TRUE(eventually([&] { return store->list("clerk|c4")->empty(); }));
  EXPECT_EQ(read("c4"), "rang expire");
  asked->stop();
  settle();
}

TEST_F(EntityReminders, reminders_of_another_type_or_a_bare_id_go_where_their_owner_says) {
  Promise<void> seen;
  auto f = seen.future();
  auto other = std::make_shared<std::optional<Promise<void>>>(std::move(seen));
  auto route = route_by_type({{"clerk", deliver_to_entities(*reg, [](const Reminder& m) { return Ring{m.name, 0}; })},
                              {"audit", [other](const Reminder&) {
                                 if (*other) (*other)->set_value();
                                 Promise<void> p;
                                 auto done = p.future();
                                 p.set_value();
                                 return done;
                               }}});
  Reminder bare;
  bare.owner = "c3";
  bare.name = "bare";
  EXPECT_FALSE(route(bare).get().ok()) << "no type: not routed";
  bare.owner = "audit|x";
  EXPECT_TRUE(route(bare).get().ok());
  EXPECT_TRUE(f.get().ok());
  bare.owner = "clerk|c3";
  EXPECT_TRUE(route(bare).get().ok());
  // A bare entity id goes straight to the registry.
  auto direct = deliver_to_entities(*reg, [](const Reminder& m) { return Ring{m.name, 0}; });
  bare.owner = "c3";
  bare.name = "direct";
  EXPECT_TRUE(direct(bare).get().ok());
  settle();
  EXPECT_EQ(read("c3"), "rang bare, rang direct");
}

}  // namespace
