// Keyed lock: exclusive per key, FIFO, parallel across keys, wait and lease
// timeouts with fencing tokens, typed results, idle-state cleanup.
// Every timeout runs on the manual clock (X3).

#include "troupe/patterns/keyed_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Future;
using troupe::KeyedLock;
using troupe::KeyedLockSettings;
using troupe::LockLease;
using troupe::Promise;
using troupe::Result;

class KeyedLockTest : public troupe::testkit::ManualClockTest {
 protected:
  KeyedLock make(KeyedLockSettings s = {}) {
    if (s.name == "lock") s.name = "accounts";
    auto r = KeyedLock::start(system, s);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return std::move(r).value();
  }

  // An asynchronous block that holds its key until the test completes it.
  struct Held {
    std::shared_ptr<Promise<int>> promise = std::make_shared<Promise<int>>();
    std::shared_ptr<std::optional<LockLease>> lease = std::make_shared<std::optional<LockLease>>();
    auto block() {
      return [p = promise, l = lease](const LockLease& got) {
        *l = got;
        return p->future();
      };
    }
  };
};

// --- L1: exclusive, FIFO, parallel ---------------------------------------------

// proves: L1
TEST(KeyedLockRealTime, HundredConcurrentLockersOnOneKeyNeverOverlap) {
  troupe::ActorSystem sys(troupe::SystemConfig{.threads = 2, .log_dead_letters = false});
  auto lock = KeyedLock::start(sys, {.name = "one-key"}).value();
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  std::atomic<int> done{0};
  std::vector<std::thread> helpers;  // complete asynchronous blocks elsewhere
  std::mutex helpers_mu;
  std::vector<Future<int>> results;
  std::mutex results_mu;
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        int n = t * 25 + i;
        Future<int> f = [&]() -> Future<int> {
          if (n % 2 == 0) {  // synchronous block
            return lock.lock("k", [&, n](const LockLease&) {
              int now_inside = ++inside;
              int seen = max_inside.load();
              while (now_inside > seen && !max_inside.compare_exchange_weak(seen, now_inside)) {}
              --inside;
              return n;
            });
          }
          // asynchronous block: finishes on another thread
          return lock.lock("k", [&, n](const LockLease&) {
            int now_inside = ++inside;
            int seen = max_inside.load();
            while (now_inside > seen && !max_inside.compare_exchange_weak(seen, now_inside)) {}
            auto p = std::make_shared<Promise<int>>();
            auto fut = p->future();
            std::lock_guard g(helpers_mu);
            helpers.emplace_back([&, p, n] {
              std::this_thread::yield();
              --inside;
              p->set_value(n);
            });
            return fut;
          });
        }();
        std::lock_guard g(results_mu);
        results.push_back(std::move(f));
      }
    });
  }
  for (auto& c : callers) c.join();
  for (auto& f : results) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    ++done;
  }
  {
    std::lock_guard g(helpers_mu);
    for (auto& h : helpers) h.join();
  }
  EXPECT_EQ(done.load(), 100);
  EXPECT_EQ(max_inside.load(), 1);
  auto st = lock.stats();
  EXPECT_EQ(st.grants, 100u);
  EXPECT_EQ(st.waiting, 0u);
  sys.shutdown();
}

// proves: L1
TEST_F(KeyedLockTest, RequestsForOneKeyRunInArrivalOrder) {
  auto lock = make();
  Held first;
  auto f0 = lock.lock("k", first.block());
  std::vector<int> order;
  std::mutex mu;
  std::vector<Future<int>> fs;
  for (int i = 1; i <= 10; ++i) {
    fs.push_back(lock.lock("k", [&, i](const LockLease&) {
      std::lock_guard g(mu);
      order.push_back(i);
      return i;
    }));
  }
  settle();
  EXPECT_TRUE(order.empty());  // all wait behind the holder
  EXPECT_EQ(lock.stats().waiting, 10u);
  first.promise->set_value(0);
  for (auto& f : fs) ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(*f0.get(), 0);
}

// proves: L1
TEST_F(KeyedLockTest, DifferentKeysDoNotWaitForEachOther) {
  auto lock = make({.shards = 1});  // same shard: parallel even so
  Held a;
  auto fa = lock.lock("a", a.block());
  auto fb = lock.lock("b", [](const LockLease&) { return 2; });
  EXPECT_EQ(*fb.get(), 2);
  EXPECT_FALSE(fa.ready());
  a.promise->set_value(1);
  EXPECT_EQ(*fa.get(), 1);
}

// --- L2: wait timeout -----------------------------------------------------------

// proves: L2, X3
TEST_F(KeyedLockTest, WaitTimeoutAnswersAcquireTimeoutAndTheBlockNeverRuns) {
  auto lock = make({.wait_timeout = 2s});
  Held holder;
  auto f0 = lock.lock("k", holder.block());
  std::atomic<bool> ran{false};
  auto f1 = lock.lock("k", [&](const LockLease&) {
    ran = true;
    return 1;
  });
  settle();
  advance(1999ms);
  EXPECT_FALSE(f1.ready());
  advance(1ms);
  auto r = f1.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::acquire_timeout);
  EXPECT_EQ(r.error().message(), "keyed lock 'accounts': key 'k' not acquired within 2s");
  holder.promise->set_value(0);
  EXPECT_EQ(*f0.get(), 0);
  settle();
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(lock.stats().acquire_timeouts, 1u);
  EXPECT_EQ(lock.stats().waiting, 0u);
}

// proves: L2
TEST_F(KeyedLockTest, TimedOutWaiterLeavesTheOthersInOrder) {
  auto lock = make({.wait_timeout = 2s});
  Held holder;
  auto f0 = lock.lock("k", holder.block());
  auto early = lock.lock("k", [](const LockLease&) { return 1; });
  settle();
  advance(1s);
  auto later = lock.lock("k", [](const LockLease&) { return 2; });
  settle();
  advance(1s);  // `early` times out, `later` still has a second
  EXPECT_EQ(early.get().error().code(), ErrorCode::acquire_timeout);
  EXPECT_FALSE(later.ready());
  holder.promise->set_value(0);
  EXPECT_EQ(*later.get(), 2);
}

// proves: L2
TEST_F(KeyedLockTest, ZeroWaitIsATryLock) {
  auto lock = make({.wait_timeout = 0s});
  Held holder;
  auto f0 = lock.lock("k", holder.block());
  auto busy = lock.lock("k", [](const LockLease&) { return 1; });
  EXPECT_EQ(busy.get().error().code(), ErrorCode::acquire_timeout);
  auto other = lock.lock("other", [](const LockLease&) { return 2; });
  EXPECT_EQ(*other.get(), 2);
  holder.promise->set_value(0);
  EXPECT_EQ(*f0.get(), 0);
  EXPECT_EQ(*lock.lock("k", [](const LockLease&) { return 3; }).get(), 3);
}

// The waiter's wait (2 s) ends long before the holder's lease (10 s): the
// waiter gets AcquireTimeout and never runs; the holder keeps the key, its
// lease stays current, and no grant is made until it finishes.
// proves: L2, L3
TEST_F(KeyedLockTest, AWaiterThatTimesOutWhileTheHoldersLeaseIsValidNeverRunsAndTheHolderKeepsTheKey) {
  auto lock = make({.wait_timeout = 2s, .lease = 10s});
  Held holder;
  auto f_holder = lock.lock("k", holder.block());
  std::atomic<bool> ran{false};
  auto f_waiter = lock.lock("k", [&](const LockLease&) {
    ran = true;
    return 1;
  });
  settle();
  ASSERT_TRUE(holder.lease->has_value());
  const LockLease& lease = **holder.lease;
  advance(2s);
  auto r = f_waiter.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::acquire_timeout);
  // Eight seconds of lease left: the holder still has the key, alone.
  EXPECT_TRUE(lease.is_current());
  EXPECT_FALSE(f_holder.ready());
  advance(7999ms);
  EXPECT_TRUE(lease.is_current());
  EXPECT_FALSE(f_holder.ready());
  EXPECT_EQ(lock.stats().grants, 1u);
  holder.promise->set_value(5);
  auto done = f_holder.get();
  ASSERT_TRUE(done.ok()) << done.error().to_string();
  EXPECT_EQ(*done, 5);
  settle();
  EXPECT_FALSE(ran.load());
  auto st = lock.stats();
  EXPECT_EQ(st.grants, 1u);
  EXPECT_EQ(st.acquire_timeouts, 1u);
  EXPECT_EQ(st.lease_expiries, 0u);
  // The next grant's token follows the holder's: the waiter never had one.
  EXPECT_EQ(*lock.lock("k", [](const LockLease& l) { return l.token(); }).get(), lease.token() + 1);
  EXPECT_FALSE(ran.load());
}

// --- L3: lease expiry and fencing -----------------------------------------------

// proves: L3, X3
TEST_F(KeyedLockTest, LeaseExpiryPassesTheLockOnAndFencesTheLateBlock) {
  auto lock = make({.wait_timeout = 60s, .lease = 10s});
  Held old;
  auto f_old = lock.lock("k", old.block());
  std::optional<LockLease> next_lease;
  auto f_next = lock.lock("k", [&](const LockLease& l) {
    next_lease = l;
    return 7;
  });
  settle();
  ASSERT_TRUE(old.lease->has_value());
  const LockLease& stale = **old.lease;
  EXPECT_TRUE(stale.is_current());
  advance(9999ms);
  EXPECT_FALSE(f_old.ready());
  advance(1ms);
  auto r = f_old.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::lease_expired);
  EXPECT_NE(r.error().message().find("ran past its lease of 10s"), std::string::npos) << r.error().message();
  EXPECT_EQ(*f_next.get(), 7);  // the next waiter got the lock
  ASSERT_TRUE(next_lease);
  EXPECT_GT(next_lease->token(), stale.token());
  EXPECT_FALSE(stale.is_current());
  // The old block finishes late: its result goes nowhere, nothing breaks.
  old.promise->set_value(99);
  settle();
  auto st = lock.stats();
  EXPECT_EQ(st.lease_expiries, 1u);
  EXPECT_EQ(st.grants, 2u);
  // and the key still works
  EXPECT_EQ(*lock.lock("k", [](const LockLease& l) { return l.is_current() ? 1 : 0; }).get(), 1);
}

// proves: L3
TEST_F(KeyedLockTest, SynchronousBlockThatOverrunsItsLeaseAnswersLeaseExpired) {
  auto lock = make({.lease = 1s});
  auto f = lock.lock("k", [&](const LockLease&) {
    clock->advance(2s);  // the block takes two (virtual) seconds
    return 1;
  });
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::lease_expired);
  EXPECT_EQ(*lock.lock("k", [](const LockLease&) { return 2; }).get(), 2);
}

// proves: L3
TEST_F(KeyedLockTest, TokensIncreasePerKeyAndAcrossARestartOfTheLock) {
  std::vector<std::uint64_t> tokens;
  {
    auto lock = make();
    for (int i = 0; i < 3; ++i) tokens.push_back(*lock.lock("k", [](const LockLease& l) { return l.token(); }).get());
    lock.stop();
  }
  clock->set_wall(clock->wall_now() + 1s);  // a restart, a moment later
  auto again = make();
  tokens.push_back(*again.lock("k", [](const LockLease& l) { return l.token(); }).get());
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]);
}

// proves: L3
TEST_F(KeyedLockTest, TokensStartAboveAGivenFirstTokenWhatEverTheClock) {
  constexpr std::uint64_t first = std::uint64_t{7} << 40;
  auto lock = make({.first_token = first});
  auto a = *lock.lock("k", [](const LockLease& l) { return l.token(); }).get();
  auto b = *lock.lock("k", [](const LockLease& l) { return l.token(); }).get();
  EXPECT_EQ(a, first + 1);
  EXPECT_EQ(b, first + 2);
}

// proves: L3
TEST_F(KeyedLockTest, LeaseIsNotCurrentAfterTheBlockFinished) {
  auto lock = make();
  std::optional<LockLease> kept;
  bool inside = false;
  ASSERT_TRUE(lock.lock("k", [&](const LockLease& l) {
                    kept = l;
                    inside = l.is_current();
                    return 0;
                  })
                  .get()
                  .ok());
  EXPECT_TRUE(inside);
  EXPECT_FALSE(kept->is_current());
  EXPECT_EQ(kept->key(), "k");
}

// --- L4: typed results and exceptions --------------------------------------------

struct Receipt {
  std::string account;
  long balance = 0;
};

struct Overdrawn : std::runtime_error {
  long by;
  explicit Overdrawn(long b) : std::runtime_error("overdrawn by " + std::to_string(b)), by(b) {}
};

// proves: L4
TEST_F(KeyedLockTest, TheCallerGetsTheBlocksOwnType) {
  auto lock = make();
  Future<Receipt> f = lock.lock("acct", [](const LockLease& l) { return Receipt{l.key(), 42}; });
  auto r = f.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->account, "acct");
  EXPECT_EQ(r->balance, 42);

  Future<std::monostate> v = lock.lock("acct", [](const LockLease&) {});
  EXPECT_TRUE(v.get().ok());

  Future<long> e = lock.lock("acct", [](const LockLease&) -> Result<long> {
    return Error(ErrorCode::invalid_argument, "amount must be positive");
  });
  auto er = e.get();
  ASSERT_FALSE(er.ok());
  EXPECT_EQ(er.error(), Error(ErrorCode::invalid_argument, "amount must be positive"));
  EXPECT_EQ(lock.stats().block_failures, 1u);
}

// proves: L4, L1
TEST_F(KeyedLockTest, ABlockThatThrowsFreesTheLockAndTheCallerGetsTheException) {
  auto lock = make();
  auto f = lock.lock("acct", [](const LockLease&) -> long { throw Overdrawn(5); });
  auto next = lock.lock("acct", [](const LockLease&) { return 1; });
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::handler_failed);
  EXPECT_EQ(r.error().message(), "the block for key 'acct' threw: overdrawn by 5");
  try {
    r.error().rethrow_if_exception();
    FAIL() << "expected Overdrawn";
  } catch (const Overdrawn& o) {
    EXPECT_EQ(o.by, 5);
  }
  EXPECT_EQ(*next.get(), 1);
}

// proves: L4
TEST_F(KeyedLockTest, AnAsynchronousBlocksErrorReachesTheCallerAsIs) {
  auto lock = make();
  Held h;
  auto f = lock.lock("k", h.block());
  auto next = lock.lock("k", [](const LockLease&) { return 2; });
  settle();
  h.promise->set_error(Error(ErrorCode::timeout, "gateway did not answer"));
  EXPECT_EQ(f.get().error(), Error(ErrorCode::timeout, "gateway did not answer"));
  EXPECT_EQ(*next.get(), 2);
}

// proves: L4, L1
TEST_F(KeyedLockTest, AnAsynchronousBlockThatThrowsBeforeReturningFreesTheLock) {
  auto lock = make();
  auto f = lock.lock("k", [](const LockLease&) -> Future<int> { throw std::logic_error("no future"); });
  EXPECT_EQ(f.get().error().code(), ErrorCode::handler_failed);
  EXPECT_EQ(*lock.lock("k", [](const LockLease&) { return 3; }).get(), 3);
}

// proves: L4
TEST_F(KeyedLockTest, ADroppedFutureInsideTheBlockAnswersNoReplyAndFreesTheKey) {
  auto lock = make();
  auto f = lock.lock("k", [](const LockLease&) {
    Promise<int> p;
    return p.future();  // p is dropped here
  });
  EXPECT_EQ(f.get().error().code(), ErrorCode::no_reply);
  EXPECT_EQ(*lock.lock("k", [](const LockLease&) { return 4; }).get(), 4);
}

// --- L5: idle cleanup -----------------------------------------------------------

// proves: L5, X3
TEST_F(KeyedLockTest, IdleKeyStateIsFreedAfterIdleAfter) {
  auto lock = make({.idle_after = 60s});
  std::uint64_t t1 = *lock.lock("k", [](const LockLease& l) { return l.token(); }).get();
  settle();
  EXPECT_EQ(lock.stats().live_keys, 1u);
  advance(59s);
  EXPECT_EQ(lock.stats().live_keys, 1u);
  advance(1s);
  EXPECT_EQ(lock.stats().live_keys, 0u);
  EXPECT_EQ(lock.stats().keys_freed, 1u);
  // A fresh state for the same key keeps the tokens growing.
  std::uint64_t t2 = *lock.lock("k", [](const LockLease& l) { return l.token(); }).get();
  EXPECT_GT(t2, t1);
}

// proves: L5
TEST_F(KeyedLockTest, AKeyInUseIsNeverFreed) {
  auto lock = make({.wait_timeout = 600s, .lease = 600s, .idle_after = 1s});
  Held h;
  auto f = lock.lock("busy", h.block());
  auto waiter = lock.lock("busy", [](const LockLease&) { return 5; });
  settle();
  advance(10s);
  EXPECT_EQ(lock.stats().live_keys, 1u);
  EXPECT_EQ(lock.stats().keys_freed, 0u);
  h.promise->set_value(1);
  EXPECT_EQ(*f.get(), 1);
  EXPECT_EQ(*waiter.get(), 5);
  settle();
  advance(1s);
  EXPECT_EQ(lock.stats().live_keys, 0u);
}

// proves: L5
TEST_F(KeyedLockTest, AKeyUsedAgainBeforeItsIdleTimeIsKept) {
  auto lock = make({.idle_after = 10s});
  ASSERT_TRUE(lock.lock("k", [](const LockLease&) { return 0; }).get().ok());
  settle();
  advance(9s);
  ASSERT_TRUE(lock.lock("k", [](const LockLease&) { return 0; }).get().ok());
  settle();
  advance(9s);  // 18 s after first use, 9 s after the last
  EXPECT_EQ(lock.stats().live_keys, 1u);
  advance(1s);
  EXPECT_EQ(lock.stats().live_keys, 0u);
}

// proves: L5
TEST_F(KeyedLockTest, TenThousandIdleKeysAreAllFreedInBoundedSteps) {
  auto lock = make({.idle_after = 5s, .shards = 2});
  std::vector<Future<int>> fs;
  for (int i = 0; i < 10000; ++i) fs.push_back(lock.lock("key-" + std::to_string(i), [](const LockLease&) { return 0; }));
  for (auto& f : fs) ASSERT_TRUE(f.get().ok());
  settle();
  EXPECT_EQ(lock.stats().live_keys, 10000u);
  advance(5s);
  EXPECT_EQ(lock.stats().live_keys, 0u);
  EXPECT_EQ(lock.stats().keys_freed, 10000u);
}

// proves: L5, L3
TEST_F(KeyedLockTest, AnExpiredHolderPinsItsKeyUntilItsLateResultArrives) {
  auto lock = make({.lease = 1s, .idle_after = 1s});
  Held h;
  auto f = lock.lock("k", h.block());
  settle();
  advance(1s);
  EXPECT_EQ(f.get().error().code(), ErrorCode::lease_expired);
  advance(5s);
  EXPECT_EQ(lock.stats().live_keys, 1u);  // the late completion still has to find its key
  h.promise->set_value(1);
  settle();
  advance(1s);
  EXPECT_EQ(lock.stats().live_keys, 0u);
}

// --- stop, shutdown and bad input -------------------------------------------------

// proves: L2, X1
TEST_F(KeyedLockTest, StopAnswersWaitersAndHoldersAndLaterRequests) {
  auto lock = make();
  Held h;
  auto held = lock.lock("k", h.block());
  auto waiting = lock.lock("k", [](const LockLease&) { return 1; });
  settle();
  lock.stop();
  settle();
  EXPECT_EQ(held.get().error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(waiting.get().error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(lock.lock("k", [](const LockLease&) { return 2; }).get().error().code(), ErrorCode::shutting_down);
  h.promise->set_value(3);  // the late block finds the lock gone: nothing breaks
  settle();
}

// proves: X1
TEST_F(KeyedLockTest, BadSettingsAreRefusedWithTheirName) {
  auto check = [&](KeyedLockSettings s, const std::string& msg) {
    auto r = KeyedLock::start(system, s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
    EXPECT_EQ(r.error().message(), msg);
  };
  check({.name = ""}, "keyed lock: name must not be empty");
  check({.name = "l", .wait_timeout = -1s}, "keyed lock 'l': wait_timeout must not be negative");
  check({.name = "l", .lease = 0s}, "keyed lock 'l': lease must be positive");
  check({.name = "l", .idle_after = 0s}, "keyed lock 'l': idle_after must be positive");
  check({.name = "l", .shards = 1 << 20}, "keyed lock 'l': shards must be at most 65536");
  auto ok = KeyedLock::start(system, {.name = "l", .shards = 3});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->settings().shards, 4u);
}

// proves: L2, X1
TEST(KeyedLockShutdown, SystemShutdownAnswersEveryone) {
  Promise<int> never;
  Future<int> held = Promise<int>().future();
  Future<int> waiting = Promise<int>().future();
  {
    troupe::ActorSystem sys(troupe::SystemConfig{.threads = 2, .log_dead_letters = false});
    auto lock = KeyedLock::start(sys, {.name = "s"}).value();
    held = lock.lock("k", [&](const LockLease&) { return never.future(); });
    waiting = lock.lock("k", [](const LockLease&) { return 1; });
    ASSERT_TRUE(sys.wait_idle(10s));
    sys.shutdown();
    EXPECT_EQ(lock.lock("k", [](const LockLease&) { return 2; }).get().error().code(), ErrorCode::shutting_down);
  }
  EXPECT_EQ(held.get().error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(waiting.get().error().code(), ErrorCode::shutting_down);
  never.set_value(0);  // after the system is gone: harmless
}

}  // namespace
