// The system's message counters: what the node reports as mailbox depth and
// message rates (SystemStats::messages_delivered / messages_taken /
// mailbox_depth). The depth must come back to zero when the system is idle,
// whatever the messages went through: stash and unstash, a stop with
// messages still queued.

#include <gtest/gtest.h>

#include <atomic>
#include <variant>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"

namespace {

using namespace std::chrono_literals;

struct Block {
  troupe::testkit::Gate* entered = nullptr;
  troupe::testkit::Gate* release = nullptr;
};
struct Work {};
struct Hold {};
struct Let {};
using Msg = std::variant<Block, Work, Hold, Let>;

// Blocks its thread on Block; stashes Work while held; counts Work handled.
struct Worker : troupe::Actor<Msg> {
  explicit Worker(std::atomic<int>* handled) : handled_(handled) {}
  void receive(Msg& m) {
    troupe::match(
        m,
        [&](Block& b) {
          b.entered->open();
          (void)b.release->wait();
        },
        [&](Work&) {
          if (held_) {
            (void)stash();
          } else {
            handled_->fetch_add(1);
          }
        },
        [&](Hold&) { held_ = true; }, [&](Let&) {
          held_ = false;
          unstash_all();
        });
  }
  std::atomic<int>* handled_;
  bool held_ = false;
};

troupe::SystemConfig quiet() {
  troupe::SystemConfig c;
  c.threads = 2;
  c.log_dead_letters = false;
  return c;
}

TEST(MessageStats, MessagesWaitingBehindABusyActorShowAsMailboxDepthUntilTaken) {
  troupe::ActorSystem sys(quiet());
  std::atomic<int> handled{0};
  auto a = sys.spawn<Worker>(&handled);
  troupe::testkit::Gate entered, release;
  a.tell(Block{&entered, &release});
  ASSERT_TRUE(entered.wait());
  for (int i = 0; i < 50; ++i) a.tell(Work{});
  auto busy = sys.stats();
  // The 50 queued, plus the Block being handled (counted when its
  // activation ends).
  EXPECT_EQ(busy.mailbox_depth, 51u);
  EXPECT_GE(busy.messages_delivered, 51u);
  release.open();
  ASSERT_TRUE(sys.wait_idle());
  auto idle = sys.stats();
  EXPECT_EQ(handled.load(), 50);
  EXPECT_EQ(idle.mailbox_depth, 0u);
  EXPECT_EQ(idle.messages_delivered, idle.messages_taken);
  EXPECT_EQ(idle.runnable_actors, 0u);
}

TEST(MessageStats, StashedMessagesCountOnceMoreWhenUnstashedAndTheDepthReturnsToZero) {
  troupe::ActorSystem sys(quiet());
  std::atomic<int> handled{0};
  auto a = sys.spawn<Worker>(&handled);
  a.tell(Hold{});
  for (int i = 0; i < 10; ++i) a.tell(Work{});
  ASSERT_TRUE(sys.wait_idle());
  auto held = sys.stats();
  EXPECT_EQ(held.mailbox_depth, 0u);  // stashed is not queued
  a.tell(Let{});
  ASSERT_TRUE(sys.wait_idle());
  auto after = sys.stats();
  EXPECT_EQ(handled.load(), 10);
  EXPECT_EQ(after.mailbox_depth, 0u);
  // 12 sent from outside, and the 10 unstashed went through the mailbox again.
  EXPECT_EQ(after.messages_delivered - held.messages_delivered, 1u + 10u);
}

TEST(MessageStats, MessagesLeftInTheMailboxOfAStoppedActorLeaveTheDepth) {
  troupe::ActorSystem sys(quiet());
  std::atomic<int> handled{0};
  auto a = sys.spawn<Worker>(&handled);
  troupe::testkit::Gate entered, release;
  a.tell(Block{&entered, &release});
  ASSERT_TRUE(entered.wait());
  for (int i = 0; i < 20; ++i) a.tell(Work{});
  a.stop();  // handled after the 20 before it; the 20 behind it are dropped
  for (int i = 0; i < 20; ++i) a.tell(Work{});
  release.open();
  ASSERT_TRUE(sys.wait_idle());
  auto s = sys.stats();
  EXPECT_EQ(handled.load(), 20);
  EXPECT_EQ(s.mailbox_depth, 0u);
  EXPECT_EQ(s.messages_delivered, s.messages_taken);
}

}  // namespace
