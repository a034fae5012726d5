// The outbox dispatcher (outbox_dispatcher.hpp) on the manual clock: a
// stored record runs after it is stored and is marked done once; failed
// tries are retried after a growing back-off; a try that never answers times
// out; a record that keeps failing is kept as failed and listed; a restart
// picks up what was pending; dispatchers sharing a journal run each record
// once. And the entity side (outbox.hpp, SideEffect): records are derived
// from the events an entity stores, in the same append, never on recovery.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/persist.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Duration;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Future;
using troupe::MemoryJournal;
using troupe::OutboxDispatcher;
using troupe::OutboxEntry;
using troupe::OutboxHandlers;
using troupe::OutboxQuery;
using troupe::OutboxRecord;
using troupe::OutboxSettings;
using troupe::OutboxStatus;
using troupe::Promise;
using troupe::Result;
namespace js = troupe::journal_sync;

// What a handler saw, and how it answers: each call gets the next scripted
// answer (ok, an error, or "hold": the promise is kept unanswered).
class Receiver {
 public:
  enum class Answer { ok, fail, hold, raise };

  explicit Receiver(std::vector<Answer> script = {}) : script_(std::move(script)) {}

  troupe::OutboxHandler handler(std::shared_ptr<troupe::Clock> clock) {
    return [this, clock](const OutboxEntry& e) -> Future<void> {
      Answer a;
      {
        std::lock_guard lk(mu_);
        calls_.push_back(e);
        times_.push_back(clock->wall_now());
        a = calls_.size() <= script_.size() ? script_[calls_.size() - 1] : Answer::ok;
        if (a == Answer::ok) ++done_[e.record.key];
      }
      Promise<void> p;
      auto f = p.future();
      switch (a) {
        case Answer::ok: p.set_value(); break;
        case Answer::fail: p.set_error(Error(ErrorCode::unreachable, "gateway answered HTTP 503")); break;
        case Answer::raise: throw std::runtime_error("handler bug");
        case Answer::hold: {
          std::lock_guard lk(mu_);
          held_.push_back(std::move(p));
          break;
        }
      }
      return f;
    };
  }

  std::size_t calls() const {
    std::lock_guard lk(mu_);
    return calls_.size();
  }
  OutboxEntry call(std::size_t i) const {
    std::lock_guard lk(mu_);
    return calls_.at(i);
  }
  troupe::WallTime time(std::size_t i) const {
    std::lock_guard lk(mu_);
    return times_.at(i);
  }
  std::map<std::string, int> done() const {
    std::lock_guard lk(mu_);
    return done_;
  }
  // Answers the oldest held try with success.
  void answer_held() {
    Promise<void> p;
    {
      std::lock_guard lk(mu_);
      p = std::move(held_.front());
      held_.erase(held_.begin());
    }
    p.set_value();
  }

 private:
  mutable std::mutex mu_;
  std::vector<Answer> script_;
  std::vector<OutboxEntry> calls_;
  std::vector<troupe::WallTime> times_;
  std::map<std::string, int> done_;
  std::vector<Promise<void>> held_;
};

using A = Receiver::Answer;

class Dispatcher : public troupe::testkit::ManualClockTest {
 protected:
  Dispatcher() {
    settings.owner = "node-1";
    settings.poll_interval = 100ms;
    settings.attempt_timeout = 2s;
    settings.lease = 5s;
    settings.min_backoff = 1s;
    settings.max_backoff = 4s;
    settings.backoff_factor = 2;
    settings.max_attempts = 4;
    settings.count_interval = 500ms;
    settings.log = false;
  }

  void store(const std::string& id, std::uint64_t seq, const std::string& key, const std::string& kind = "refund") {
    troupe::AppendBatch b;
    b.persistence_id = "pay|" + id;
    b.events.push_back(troupe::EventRecord{seq, 1, "Cancelled", 1, "x"});
    b.outbox.push_back(OutboxRecord{key, kind, "amount=100"});
    ASSERT_TRUE(js::append(*journal, std::move(b)).ok());
  }

  OutboxDispatcher start(Receiver& r, OutboxSettings s) {
    auto d = OutboxDispatcher::start(system, journal, std::move(s), OutboxHandlers{{"refund", r.handler(clock)}});
    EXPECT_TRUE(d.ok()) << d.error().to_string();
    settle();
    return *d;
  }
  OutboxDispatcher start(Receiver& r) { return start(r, settings); }

  // The settings of another node's dispatcher.
  OutboxSettings on(const std::string& owner) const {
    OutboxSettings s = settings;
    s.owner = owner;
    return s;
  }

  // A dispatcher of node-1 claims k1, its try held by `r`, and stops as in
  // a crash: the try is never settled and its lease stays.
  OutboxDispatcher crash_holding_k1(Receiver& r) {
    auto d = start(r);
    store("p1", 1, "k1");
    advance(100ms);
    EXPECT_EQ(r.calls(), 1u);
    d.stop();
    settle();
    return d;
  }

  troupe::OutboxView view(OutboxStatus status = OutboxStatus::pending) {
    auto v = js::read_outbox(*journal, OutboxQuery{status, 100});
    EXPECT_TRUE(v.ok());
    return v.ok() ? *v : troupe::OutboxView{};
  }

  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  OutboxSettings settings;
};

// proves: A1
TEST_F(Dispatcher, a_stored_record_runs_once_with_its_key_and_is_marked_done) {
  Receiver r;
  auto d = start(r);
  store("p1", 1, "pay|p1/1/0");
  EXPECT_EQ(r.calls(), 0u);  // not before the next poll
  advance(100ms);
  ASSERT_EQ(r.calls(), 1u);
  EXPECT_EQ(r.call(0).record.key, "pay|p1/1/0");
  EXPECT_EQ(r.call(0).entity_id(), "p1");
  EXPECT_EQ(r.call(0).record.payload, "amount=100");
  EXPECT_EQ(r.call(0).attempts, 1u);
  EXPECT_EQ(view().pending, 0u);
  advance_in_steps(10s, 100ms);
  EXPECT_EQ(r.calls(), 1u);
  auto st = d.stats();
  EXPECT_EQ(st.claimed, 1u);
  EXPECT_EQ(st.sent, 1u);
  EXPECT_EQ(st.retries, 0u);
  EXPECT_EQ(st.in_flight, 0u);
  ASSERT_TRUE(st.pending.has_value());
  EXPECT_EQ(*st.pending, 0u);
}

// proves: A1
TEST_F(Dispatcher, a_record_stored_before_the_dispatcher_starts_runs_at_once) {
  store("p1", 1, "k1");
  Receiver r;
  auto d = start(r);
  EXPECT_EQ(r.calls(), 1u);
  EXPECT_EQ(d.stats().sent, 1u);
}

// proves: A1
TEST_F(Dispatcher, failed_tries_are_retried_after_a_growing_back_off_until_one_succeeds) {
  Receiver r({A::fail, A::raise, A::fail, A::ok});
  auto d = start(r);
  store("p1", 1, "k1");
  advance_in_steps(20s, 100ms);
  ASSERT_EQ(r.calls(), 4u);
  // Back-off after try n: 1 s, 2 s, 4 s; claimed at the first poll after.
  const Duration expected[] = {1s, 2s, 4s};
  for (std::size_t i = 1; i < 4; ++i) {
    const Duration gap = r.time(i) - r.time(i - 1);
    EXPECT_GE(gap, expected[i - 1]) << "try " << i + 1;
    EXPECT_LE(gap, expected[i - 1] + 100ms) << "try " << i + 1;
    EXPECT_EQ(r.call(i).attempts, i + 1);
  }
  EXPECT_NE(r.call(2).last_error.find("handler bug"), std::string::npos) << r.call(2).last_error;
  EXPECT_EQ(r.done(), (std::map<std::string, int>{{"k1", 1}}));
  auto st = d.stats();
  EXPECT_EQ(st.retries, 3u);
  EXPECT_EQ(st.sent, 1u);
  EXPECT_EQ(st.failures, 0u);
  EXPECT_EQ(view().pending, 0u);
}

// proves: A1
TEST_F(Dispatcher, a_try_that_never_answers_times_out_and_its_late_answer_is_ignored) {
  Receiver r({A::hold, A::ok});
  auto d = start(r);
  store("p1", 1, "k1");
  advance(100ms);
  ASSERT_EQ(r.calls(), 1u);
  advance_in_steps(1900ms, 100ms);
  EXPECT_EQ(d.stats().in_flight, 1u);
  advance(100ms);  // attempt_timeout: a failed try
  EXPECT_EQ(d.stats().timeouts, 1u);
  EXPECT_EQ(d.stats().retries, 1u);
  r.answer_held();  // too late: the try has ended
  settle();
  EXPECT_EQ(d.stats().sent, 0u);
  advance_in_steps(1100ms, 100ms);  // the back-off, then the next poll
  EXPECT_EQ(r.calls(), 2u);
  EXPECT_EQ(d.stats().sent, 1u);
  EXPECT_EQ(view().pending, 0u);
}

// proves: A1
TEST_F(Dispatcher, a_record_that_keeps_failing_is_kept_as_failed_counted_and_listed_never_dropped) {
  Receiver r({A::fail, A::fail, A::fail, A::fail, A::fail});
  auto d = start(r);
  store("p1", 1, "k1");
  store("p2", 1, "k2", "unknown-kind");
  advance_in_steps(30s, 100ms);
  EXPECT_EQ(r.calls(), 4u);  // max_attempts
  auto st = d.stats();
  EXPECT_EQ(st.failures, 2u);
  EXPECT_EQ(st.retries, 6u);
  ASSERT_TRUE(st.failed.has_value());
  EXPECT_EQ(*st.failed, 2u);
  EXPECT_EQ(*st.pending, 0u);
  auto listed = d.read(OutboxQuery{OutboxStatus::failed, 10}).get();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->entries.size(), 2u);
  EXPECT_EQ(listed->entries[0].record.key, "k1");
  EXPECT_EQ(listed->entries[0].attempts, 4u);
  EXPECT_NE(listed->entries[0].last_error.find("HTTP 503"), std::string::npos) << listed->entries[0].last_error;
  EXPECT_NE(listed->entries[1].last_error.find("no handler for outbox kind 'unknown-kind'"), std::string::npos)
      << listed->entries[1].last_error;
  advance_in_steps(10s, 100ms);
  EXPECT_EQ(r.calls(), 4u);  // not run again
}

// proves: A1
TEST_F(Dispatcher, a_restarted_owner_runs_what_its_last_run_held_at_once_and_another_owner_after_the_lease) {
  Receiver first({A::hold});
  auto d1 = crash_holding_k1(first);
  // Another node sees the lease and waits for it.
  Receiver other;
  auto d2 = start(other, on("node-2"));
  advance_in_steps(1s, 100ms);
  EXPECT_EQ(other.calls(), 0u);
  d2.stop();
  settle();
  // node-1 comes back: its earlier run's lease is void.
  Receiver again;
  auto d3 = start(again);
  ASSERT_EQ(again.calls(), 1u);
  EXPECT_EQ(again.call(0).record.key, "k1");
  EXPECT_EQ(again.call(0).attempts, 2u);
  EXPECT_NE(d3.incarnation(), d1.incarnation());
  EXPECT_EQ(view().pending, 0u);
  first.answer_held();  // the old run's answer goes nowhere
  settle();
}

// proves: A1
TEST_F(Dispatcher, a_lease_that_runs_out_passes_the_record_to_another_node) {
  Receiver first({A::hold});
  (void)crash_holding_k1(first);
  Receiver other;
  auto d2 = start(other, on("node-2"));
  advance_in_steps(4800ms, 100ms);
  EXPECT_EQ(other.calls(), 0u);
  advance_in_steps(300ms, 100ms);  // the 5 s lease has run out
  ASSERT_EQ(other.calls(), 1u);
  EXPECT_EQ(other.done(), (std::map<std::string, int>{{"k1", 1}}));
  EXPECT_EQ(d2.stats().sent, 1u);
}

// proves: A1
TEST_F(Dispatcher, dispatchers_of_two_nodes_on_one_journal_run_each_record_once) {
  Receiver a, b;
  auto da = start(a);
  OutboxSettings s2 = on("node-2");
  s2.max_in_flight = 3;
  auto db = start(b, s2);
  for (int i = 0; i < 40; ++i) store("p" + std::to_string(i), 1, "k" + std::to_string(i));
  advance_in_steps(2s, 100ms);
  std::map<std::string, int> all = a.done();
  for (const auto& [k, n] : b.done()) all[k] += n;
  EXPECT_EQ(all.size(), 40u);
  for (const auto& [k, n] : all) EXPECT_EQ(n, 1) << k;
  EXPECT_EQ(da.stats().sent + db.stats().sent, 40u);
  EXPECT_EQ(view().pending, 0u);
}

TEST_F(Dispatcher, unusable_settings_and_a_journal_without_an_outbox_are_refused) {
  Receiver r;
  auto h = OutboxHandlers{{"refund", r.handler(clock)}};
  auto refused = [&](OutboxSettings s, OutboxHandlers hs, std::shared_ptr<troupe::Journal> j) {
    auto d = OutboxDispatcher::start(system, std::move(j), std::move(s), std::move(hs));
    return !d.ok() && d.error().code() == ErrorCode::invalid_argument;
  };
  EXPECT_TRUE(refused(settings, {}, journal));
  EXPECT_TRUE(refused(settings, {{"refund", nullptr}}, journal));
  EXPECT_TRUE(refused(settings, h, nullptr));
  OutboxSettings s = settings;
  s.owner.clear();
  EXPECT_TRUE(refused(s, h, journal));
  s = settings;
  s.lease = s.attempt_timeout;
  EXPECT_TRUE(refused(s, h, journal));
  s = settings;
  s.max_backoff = s.min_backoff - 1ms;
  EXPECT_TRUE(refused(s, h, journal));
  s = settings;
  s.poll_interval = Duration::zero();
  EXPECT_TRUE(refused(s, h, journal));
  class Plain final : public troupe::ForwardingJournal {
   public:
    using ForwardingJournal::ForwardingJournal;
    bool stores_outbox() const noexcept override { return false; }
  };
  EXPECT_TRUE(refused(settings, h, std::make_shared<Plain>(journal)));
}

// --- side effects derived from an entity's events ------------------------------------

struct Pay {
  std::int64_t amount = 0;
  troupe::ReplyTo<std::string> reply_to;
};
struct Refund {
  troupe::ReplyTo<std::string> reply_to;
};
using RefundCmd = std::variant<Pay, Refund>;
struct Paid {
  std::int64_t amount = 0;
};
struct Refunded {
  std::int64_t amount = 0;
};
using RefundEvent = std::variant<Paid, Refunded>;
struct RefundState {
  std::int64_t paid = 0, refunded = 0;
};

// Refunds what was paid: a Refunded event calls for one "refund" side
// effect, or for an effect without a kind (a bug) when `bug` is set.
struct Refunder {
  using Command = RefundCmd;
  using Event = RefundEvent;
  using State = RefundState;
  using Effect = troupe::Effect<Event, State>;

  Effect on_command(const State& s, Command& c, troupe::EntityContext<Refunder>&) {
    return troupe::match(
        c,
        [&](Pay& p) {
          return Effect::persist(Paid{p.amount}).then_reply(p.reply_to, [](const State& st) {
            return "paid " + std::to_string(st.paid);
          });
        },
        [&](Refund& r) {
          if (s.refunded > 0) return Effect::reply(r.reply_to, "refunded already");  // stores nothing, sends nothing
          return Effect::persist(Refunded{s.paid}).then_reply(r.reply_to, [](const State& st) {
            return "refunded " + std::to_string(st.refunded);
          });
        });
  }
  void on_event(State& s, const Event& e) const {
    troupe::match(e, [&](const Paid& p) { s.paid = p.amount; }, [&](const Refunded& r) { s.refunded = r.amount; });
  }
  std::vector<troupe::SideEffect> side_effects(const Event& e) const {
    if (const auto* r = std::get_if<Refunded>(&e)) {
      if (bug) return {troupe::SideEffect{"", ""}};
      return {troupe::SideEffect{"refund", std::to_string(r->amount)}};
    }
    return {};
  }
  bool bug = false;
};

troupe::EventCodecs<RefundEvent> refund_codecs() {
  troupe::EventCodecs<RefundEvent> c;
  c.add<Paid>(
      "Paid", 1, [](const Paid& e, troupe::ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, troupe::ByteReader& r) -> Result<Paid> { return r.finish(Paid{r.i64()}); });
  c.add<Refunded>(
      "Refunded", 1, [](const Refunded& e, troupe::ByteWriter& w) { w.i64(e.amount); },
      [](std::uint32_t, troupe::ByteReader& r) -> Result<Refunded> { return r.finish(Refunded{r.i64()}); });
  return c;
}

class SideEffects : public troupe::testkit::ManualClockTest {
 protected:
  troupe::EntityRegistry<Refunder> registry(bool bug = false) {
    troupe::EntitySettings es;
    es.type_name = "pay";
    es.log = false;
    auto r = troupe::EntityRegistry<Refunder>::start(system, journal, es, refund_codecs(),
                                                     [bug](const std::string&) { return Refunder{bug}; });
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return *r;
  }
  template <class Make>
  Result<std::string> ask(troupe::EntityRegistry<Refunder>& reg, const std::string& id, Make make) {
    auto f = reg.ask<std::string>(id, make, 5s);
    settle();
    return f.get();
  }
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
};

// proves: A1
TEST_F(SideEffects, an_event_that_calls_for_a_side_effect_stores_it_in_its_append_keyed_by_id_seq_and_index) {
  auto reg = registry();
  ASSERT_EQ(*ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Pay{700, std::move(t)}; }), "paid 700");
  EXPECT_EQ(js::read_outbox(*journal, OutboxQuery{OutboxStatus::pending, 10})->pending, 0u);
  for (int i = 0; i < 10; ++i)  // ten repeated refunds: one event, one record
    ASSERT_TRUE(ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Refund{std::move(t)}; }).ok());
  auto v = js::read_outbox(*journal, OutboxQuery{OutboxStatus::pending, 10});
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->entries.size(), 1u);
  EXPECT_EQ(v->entries[0].record, (OutboxRecord{"pay|p1/2/0", "refund", "700"}));
  EXPECT_EQ(v->entries[0].seq, 2u);
  EXPECT_EQ(js::replay(*journal, "pay|p1")->size(), 2u);
}

// proves: A1
TEST_F(SideEffects, recovery_replays_events_without_recording_their_side_effects_again) {
  {
    auto reg = registry();
    ASSERT_TRUE(ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Pay{5, std::move(t)}; }).ok());
    ASSERT_TRUE(ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Refund{std::move(t)}; }).ok());
    reg.begin_stop();
    settle();
  }
  auto reg = registry();
  EXPECT_EQ(*ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Refund{std::move(t)}; }), "refunded already");
  EXPECT_EQ(js::read_outbox(*journal, OutboxQuery{})->pending, 1u);
}

TEST_F(SideEffects, a_bad_side_effect_fails_the_command_and_stores_nothing) {
  auto reg = registry(true);
  ASSERT_TRUE(ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Pay{5, std::move(t)}; }).ok());
  auto r = ask(reg, "p1", [](troupe::ReplyTo<std::string> t) { return Refund{std::move(t)}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  EXPECT_EQ(js::replay(*journal, "pay|p1")->size(), 1u);
  EXPECT_EQ(js::read_outbox(*journal, OutboxQuery{})->pending, 0u);
}

TEST_F(SideEffects, a_registry_with_side_effects_refuses_a_journal_without_an_outbox) {
  class Plain final : public troupe::ForwardingJournal {
   public:
    using ForwardingJournal::ForwardingJournal;
    bool stores_outbox() const noexcept override { return false; }
  };
  troupe::EntitySettings es;
  es.type_name = "pay";
  auto r = troupe::EntityRegistry<Refunder>::start(system, std::make_shared<Plain>(journal), es, refund_codecs());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("keeps no outbox"), std::string::npos) << r.error().message();
}

}  // namespace
