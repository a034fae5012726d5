// Future continuations and Promise: the one asynchronous result type every
// pattern (keyed lock, process manager, job service) hands to its callers.
// Typed results and exceptions reach the caller as they are, no casts (what
// L4 builds on); no test here sleeps.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>

#include "troupe/core.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Future;
using troupe::Promise;
using troupe::Result;

struct Boom : std::runtime_error {
  int code;
  explicit Boom(int c) : std::runtime_error("boom " + std::to_string(c)), code(c) {}
};

TEST(Promise, ValueReachesGet) {
  Promise<std::string> p;
  auto f = p.future();
  EXPECT_FALSE(f.ready());
  p.set_value("done");
  EXPECT_FALSE(p.pending());
  auto r = f.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "done");
}

TEST(Promise, VoidPromiseCompletesAVoidFuture) {
  Promise<void> p;
  auto f = p.future();
  bool ran = false;
  p.set_value();
  EXPECT_TRUE(f.get().ok());
  Promise<void> failing;
  failing.future().then([&](Result<void> r) { ran = !r.ok() && r.error().code() == ErrorCode::timeout; });
  failing.set_error(Error(ErrorCode::timeout, "late"));
  EXPECT_TRUE(ran);
}

TEST(Promise, FirstCompletionWins) {
  Promise<int> p;
  auto f = p.future();
  p.set_value(1);
  p.set_value(2);
  p.set_error(Error(ErrorCode::timeout, "late"));
  EXPECT_EQ(*f.get(), 1);
}

TEST(Promise, DroppedWithoutResultAnswersNoReply) {
  Future<int> f = [] {
    Promise<int> p;
    return p.future();
  }();
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::no_reply);
}

TEST(Promise, MovedFromPromiseIsNotPending) {
  Promise<int> p;
  auto f = p.future();
  Promise<int> q = std::move(p);
  EXPECT_FALSE(p.pending());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_TRUE(q.pending());
  q.set_value(3);
  EXPECT_EQ(*f.get(), 3);
}

TEST(Promise, ExceptionIsKeptAsThrown) {
  Promise<int> p;
  auto f = p.future();
  try {
    throw Boom(7);
  } catch (...) {
    p.set_exception(std::current_exception(), "block for 'k'");
  }
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::handler_failed);
  EXPECT_EQ(r.error().message(), "block for 'k': boom 7");
  ASSERT_TRUE(r.error().exception());
  try {
    r.error().rethrow_if_exception();
    FAIL() << "expected the original exception";
  } catch (const Boom& b) {
    EXPECT_EQ(b.code, 7);  // the very object, not a copy of its message
  }
}

TEST(Error, WithoutExceptionRethrowIsANoOp) {
  Error e(ErrorCode::timeout, "x");
  EXPECT_FALSE(e.exception());
  EXPECT_NO_THROW(e.rethrow_if_exception());
  Error n = Error::from_exception(nullptr, "ctx");
  EXPECT_EQ(n.message(), "ctx: no exception");
  try {
    throw 42;
  } catch (...) {
    EXPECT_EQ(Error::from_exception(std::current_exception(), "ctx").message(),
              "ctx: a non-standard exception");
  }
}

TEST(Promise, GetBlocksUntilAnotherThreadCompletes) {
  for (int i = 0; i < 200; ++i) {  // races a blocked get() against the completion
    Promise<int> p;
    auto f = p.future();
    std::thread t([&] { p.set_value(i); });
    EXPECT_EQ(*f.get(), i);
    t.join();
  }
}

TEST(FutureThen, ContinuationRacingCompletionRunsExactlyOnce) {
  for (int i = 0; i < 200; ++i) {
    Promise<int> p;
    auto f = p.future();
    std::atomic<int> runs{0};
    std::thread t([&] { p.set_value(i); });
    std::move(f).then([&](Result<int>) { ++runs; });
    t.join();
    EXPECT_EQ(runs.load(), 1);
  }
}

TEST(FutureThen, RunsAtOnceWhenAlreadyComplete) {
  Promise<int> p;
  auto f = p.future();
  p.set_value(5);
  int seen = 0;
  std::move(f).then([&](Result<int> r) { seen = *r; });
  EXPECT_EQ(seen, 5);
}

TEST(FutureThen, RunsOnTheCompletingThread) {
  Promise<int> p;
  auto f = p.future();
  std::atomic<int> seen{0};
  std::thread::id ran_on;
  std::move(f).then([&](Result<int> r) {
    ran_on = std::this_thread::get_id();
    seen = *r;
  });
  EXPECT_EQ(seen.load(), 0);
  std::thread t([&] { p.set_value(9); });
  auto completer = t.get_id();
  t.join();
  EXPECT_EQ(seen.load(), 9);
  EXPECT_EQ(ran_on, completer);
}

TEST(FutureThen, MoveOnlyContinuationChainsIntoAnotherPromise) {
  Promise<int> first;
  Promise<std::string> second;
  auto out = second.future();
  first.future().then([p = std::move(second)](Result<int> r) mutable {
    if (r) p.set_value("got " + std::to_string(*r));
    else p.set_error(std::move(r).error());
  });
  first.set_value(4);
  EXPECT_EQ(*out.get(), "got 4");
}

TEST(FutureThen, DroppedPromiseReachesTheContinuation) {
  std::optional<ErrorCode> code;
  {
    Promise<int> p;
    p.future().then([&](Result<int> r) { code = r.error().code(); });
  }
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, ErrorCode::no_reply);
}

TEST(FutureThen, ThrowingContinuationDoesNotReachTheCompleter) {
  Promise<int> p;
  p.future().then([](Result<int>) { throw std::runtime_error("continuation"); });
  EXPECT_NO_THROW(p.set_value(1));
}

// An ask's future takes a continuation too: the reply, or the timeout.
struct Echo : troupe::Actor<std::variant<std::pair<int, troupe::ReplyTo<int>>>> {
  void receive(message_type& m) {
    auto& [n, reply] = std::get<0>(m);
    reply.reply(n + 1);
  }
};

struct Ping {
  troupe::ReplyTo<void> reply;
};
struct Acker : troupe::Actor<Ping> {
  void receive(Ping& p) { p.reply.reply(); }
};

TEST(FutureThen, AskingForNothingButDoneWorksWithVoid) {
  troupe::ActorSystem sys(troupe::SystemConfig{.threads = 2, .log_dead_letters = false});
  auto acker = sys.spawn<Acker>();
  auto r = sys.ask<void>(acker, [](troupe::ReplyTo<void> rt) { return Ping{std::move(rt)}; }, 10s).get();
  EXPECT_TRUE(r.ok());
  sys.shutdown();
}

TEST(FutureThen, AskFutureTakesAContinuation) {
  troupe::ActorSystem sys(troupe::SystemConfig{.threads = 2, .log_dead_letters = false});
  auto echo = sys.spawn<Echo>();
  Promise<int> done;
  auto out = done.future();
  sys.ask<int>(echo, [](troupe::ReplyTo<int> r) { return std::pair<int, troupe::ReplyTo<int>>{41, std::move(r)}; },
               10s)
      .then([p = std::move(done)](Result<int> r) mutable { p.set_result(std::move(r)); });
  EXPECT_EQ(*out.get(), 42);
  sys.shutdown();
}

}  // namespace
