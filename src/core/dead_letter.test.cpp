// Dead letters: messages to actors that have stopped are refused, counted and
// reported, never a crash.
// An undeliverable message is a clear outcome, not a crash; dead letters
// are counted and reported.

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <optional>
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
using troupe::DeadLetter;
using troupe::Delivery;
using troupe::SpawnOptions;
using troupe::testkit::Gate;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

struct Letter {
  int n = 0;
};
struct Quit {};
struct Hold {
  Gate* entered = nullptr;
  Gate* release = nullptr;
  bool stop_after = false;
};
using MailMsg = std::variant<Letter, Quit, Hold>;

struct Recipient : troupe::Actor<MailMsg> {
  explicit Recipient(ActorRef<int> r) : read(std::move(r)) {}
  void receive(MailMsg& m) {
    troupe::match(
        m, [&](Letter& l) { read.tell(l.n); }, [&](Quit&) { stop(); },
        [&](Hold& h) {
          h.entered->open();
          ASSERT_TRUE(h.release->wait());
          if (h.stop_after) stop();
        });
  }
  ActorRef<int> read;
};

// Everything the on_dead_letter hook saw, with the thread it ran on.
struct Recorded {
  std::mutex mu;
  std::vector<DeadLetter> letters;
  std::vector<std::thread::id> threads;
  std::vector<DeadLetter> snapshot() {
    std::lock_guard lk(mu);
    return letters;
  }
};

troupe::SystemConfig recording(const std::shared_ptr<Recorded>& rec) {
  troupe::SystemConfig c;
  c.on_dead_letter = [rec](const DeadLetter& d) {
    std::lock_guard lk(rec->mu);
    rec->letters.push_back(d);
    rec->threads.push_back(std::this_thread::get_id());
  };
  return c;
}

class DeadLetters : public ManualClockTest {
 protected:
  DeadLetters() : DeadLetters(std::make_shared<Recorded>()) {}
  explicit DeadLetters(std::shared_ptr<Recorded> r)
      : ManualClockTest(recording(r)), rec(std::move(r)), read(system, "read") {}

  ActorRef<MailMsg> stopped_recipient(std::string name) {
    auto a = system.spawn<Recipient>(SpawnOptions{.name = std::move(name)}, read.ref());
    a.tell(Quit{});
    settle();
    EXPECT_TRUE(a.terminated());
    return a;
  }

  std::shared_ptr<Recorded> rec;
  TestProbe<int> read;
};

TEST_F(DeadLetters, a_tell_to_a_stopped_actor_is_a_dead_letter_counted_and_reported_with_its_type) {
  auto a = stopped_recipient("postbox");
  auto before = system.stats().dead_letters;
  EXPECT_EQ(a.tell(Letter{1}), Delivery::dead_letter);
  EXPECT_EQ(system.stats().dead_letters, before + 1);
  auto seen = rec->snapshot();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].recipient, "postbox");
  EXPECT_NE(seen[0].message_type.find("Letter"), std::string::npos) << seen[0].message_type;
  EXPECT_EQ(seen[0].message_type.find("Recipient"), std::string::npos) << seen[0].message_type;
  std::lock_guard lk(rec->mu);
  EXPECT_EQ(rec->threads[0], std::this_thread::get_id()) << "the hook runs on the sending thread";
}

TEST_F(DeadLetters, every_refused_tell_is_counted_exactly) {
  auto a = stopped_recipient("postbox");
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.tell(Letter{i}), Delivery::dead_letter);
  EXPECT_EQ(system.stats().dead_letters, 100u);
  EXPECT_EQ(rec->snapshot().size(), 100u);
  EXPECT_EQ(read.pending(), 0u);
}

TEST_F(DeadLetters, messages_queued_behind_a_self_stop_become_dead_letters) {
  auto a = system.spawn<Recipient>(SpawnOptions{.name = "quitter"}, read.ref());
  Gate entered, release;
  a.tell(Hold{&entered, &release, /*stop_after=*/true});
  ASSERT_TRUE(entered.wait());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.tell(Letter{i}), Delivery::delivered);
  release.open();
  settle();
  EXPECT_TRUE(a.terminated());
  EXPECT_EQ(read.pending(), 0u) << "a message behind the stop was handled";
  EXPECT_EQ(system.stats().dead_letters, 5u);
  auto seen = rec->snapshot();
  ASSERT_EQ(seen.size(), 5u);
  for (auto& d : seen) EXPECT_EQ(d.recipient, "quitter");
}

// Regression (until d18dde2 drained messages were reported with the actor's
// type instead of the message's).
TEST_F(DeadLetters, messages_queued_behind_a_stop_are_reported_with_the_message_type) {
  auto a = system.spawn<Recipient>(SpawnOptions{.name = "quitter"}, read.ref());
  Gate entered, release;
  a.tell(Hold{&entered, &release, /*stop_after=*/true});
  ASSERT_TRUE(entered.wait());
  a.tell(Letter{1});
  release.open();
  settle();
  auto seen = rec->snapshot();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_NE(seen[0].message_type.find("Letter"), std::string::npos) << seen[0].message_type;
  EXPECT_EQ(seen[0].message_type.find("Recipient"), std::string::npos) << seen[0].message_type;
}

TEST_F(DeadLetters, a_stop_request_lets_already_queued_messages_be_handled_first) {
  auto a = system.spawn<Recipient>(read.ref());
  Gate entered, release;
  a.tell(Hold{&entered, &release});
  ASSERT_TRUE(entered.wait());
  a.tell(Letter{1});
  a.tell(Letter{2});
  a.stop();
  a.tell(Letter{3});  // behind the stop
  release.open();
  settle();
  EXPECT_EQ(read.expect_messages(2, 0ms), (std::vector<int>{1, 2}));
  EXPECT_EQ(read.pending(), 0u);
  EXPECT_EQ(system.stats().dead_letters, 1u);
}

// Watches `target` from on_start, which queues the watch request in the
// target's mailbox before `watching` opens, and forwards the Down.
struct Watcher : troupe::Actor<troupe::Down> {
  Watcher(ActorRef<MailMsg> t, Gate* w, ActorRef<troupe::Down> o)
      : target(std::move(t)), watching(w), out(std::move(o)) {}
  void on_start() {
    watch(target);
    watching->open();
  }
  void receive(troupe::Down& d) { out.tell(std::move(d)); }
  ActorRef<MailMsg> target;
  Gate* watching;
  ActorRef<troupe::Down> out;
};

// A watch request still queued when the actor stops is answered like the
// registered watchers, after every leftover message has been counted: the
// Down never overtakes the dead letters it follows.
TEST_F(DeadLetters, a_watch_queued_behind_a_stop_hears_down_only_after_every_leftover_is_counted) {
  TestProbe<troupe::Down> downs(system, "downs");
  auto a = system.spawn<Recipient>(SpawnOptions{.name = "quitter"}, read.ref());
  Gate entered, release, watching;
  a.tell(Hold{&entered, &release, /*stop_after=*/true});
  ASSERT_TRUE(entered.wait());
  a.tell(Letter{1});
  a.tell(Letter{2});
  system.spawn<Watcher>(a, &watching, downs.ref());
  ASSERT_TRUE(watching.wait());  // queued behind the Hold and the letters
  std::optional<troupe::Down> early;
  {
    // The hook runs under this lock: holding it stalls the count at the
    // first leftover, so a Down sent before the count is done shows here.
    std::unique_lock lk(rec->mu);
    release.open();
    early = downs.try_receive(200ms);
  }
  EXPECT_FALSE(early.has_value()) << "Down arrived while the leftovers were still being counted";
  auto d = early ? std::move(*early) : downs.expect_message();
  EXPECT_EQ(d.reason, troupe::ExitReason::normal);
  EXPECT_EQ(system.stats().dead_letters, 2u);
  EXPECT_EQ(rec->snapshot().size(), 2u);
}

TEST_F(DeadLetters, a_tell_through_an_empty_ref_is_a_dead_letter_not_a_crash) {
  ActorRef<MailMsg> empty;
  EXPECT_EQ(empty.tell(Letter{1}), Delivery::dead_letter);
  empty.stop();  // harmless
  EXPECT_TRUE(empty.terminated());
}

TEST_F(DeadLetters, stopping_a_stopped_actor_is_harmless) {
  auto a = stopped_recipient("twice");
  a.stop();
  a.stop();
  settle();
  EXPECT_TRUE(a.terminated());
  EXPECT_EQ(system.stats().dead_letters, 0u) << "a stop request is not a dead letter";
}

TEST_F(DeadLetters, a_throwing_dead_letter_hook_never_fails_the_sender) {
  troupe::SystemConfig c;
  c.threads = 1;
  c.log_dead_letters = false;
  c.on_dead_letter = [](const DeadLetter&) { throw std::runtime_error("hook"); };
  troupe::ActorSystem sys(c);
  auto a = sys.spawn<Recipient>(ActorRef<int>{});
  a.tell(Quit{});
  ASSERT_TRUE(sys.wait_idle());
  Delivery d{};
  EXPECT_NO_THROW(d = a.tell(Letter{1}));
  EXPECT_EQ(d, Delivery::dead_letter);
  EXPECT_EQ(sys.stats().dead_letters, 1u);
}

TEST_F(DeadLetters, dead_letters_from_many_threads_are_all_counted) {
  auto a = stopped_recipient("gone");
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t)
    senders.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) a.tell(Letter{i});
    });
  for (auto& s : senders) s.join();
  EXPECT_EQ(system.stats().dead_letters, 4000u);
  EXPECT_EQ(rec->snapshot().size(), 4000u);
}

TEST_F(DeadLetters, replies_to_a_stopped_asker_are_dead_letters_not_crashes) {
  // The reply target is a probe that is already gone.
  auto gone = std::make_unique<TestProbe<int>>(system, "gone");
  auto target = gone->ref();
  gone.reset();
  settle();
  ASSERT_TRUE(target.terminated());
  auto a = system.spawn<Recipient>(target);
  a.tell(Letter{1});
  settle();
  EXPECT_EQ(system.stats().dead_letters, 1u);
  auto seen = rec->snapshot();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].recipient, "gone");
  EXPECT_EQ(seen[0].message_type, "int");
}

}  // namespace
