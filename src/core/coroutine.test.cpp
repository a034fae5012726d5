// Coroutines: Task outside actors (sync_wait, into_future, detach, nesting,
// exceptions), co_await on a Future, and coroutine handlers inside actors:
// where they resume, what the actor does while one is suspended, and what a
// stop or restart does to a suspended one.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/core/task.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Future;
using troupe::Promise;
using troupe::ReplyTo;
using troupe::Result;
using troupe::Task;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

// --- outside actors --------------------------------------------------------------

Task<int> plus_one(Future<int> f) {
  Result<int> r = co_await std::move(f);
  co_return r.ok() ? *r + 1 : -1;
}

Task<int> twice_plus_one(Future<int> a, Future<int> b) {
  int x = co_await plus_one(std::move(a));
  int y = co_await plus_one(std::move(b));
  co_return x + y;
}

TEST(Task, does_nothing_until_started_and_frees_its_frame_when_dropped) {
  bool ran = false;
  auto body = [&]() -> Task<> {
    ran = true;
    co_return;
  };
  {
    Task<> t = body();
    EXPECT_TRUE(static_cast<bool>(t));
  }
  EXPECT_FALSE(ran);
  EXPECT_TRUE(troupe::sync_wait(body()).ok());
  EXPECT_TRUE(ran);
}

TEST(Task, awaits_a_ready_future_without_suspending) {
  Promise<int> p;
  auto f = p.future();
  p.set_value(41);
  Result<int> r = troupe::sync_wait(plus_one(std::move(f)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
}

TEST(Task, resumes_on_the_thread_that_completes_the_future) {
  Promise<int> p;
  std::thread::id resumed_on;
  auto body = [&](Future<int> f) -> Task<int> {
    Result<int> r = co_await std::move(f);
    resumed_on = std::this_thread::get_id();
    co_return *r;
  };
  Future<int> out = troupe::into_future(body(p.future()));
  EXPECT_FALSE(out.ready());  // suspended on the future
  std::thread::id completer;
  std::thread t([&] {
    completer = std::this_thread::get_id();
    p.set_value(7);
  });
  t.join();
  Result<int> r = out.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 7);
  EXPECT_EQ(resumed_on, completer);
}

TEST(Task, nested_tasks_run_in_order_and_return_their_values) {
  Promise<int> a, b;
  Future<int> out = troupe::into_future(twice_plus_one(a.future(), b.future()));
  b.set_value(10);  // the second await has not started yet: it finds it ready
  EXPECT_FALSE(out.ready());
  a.set_value(1);
  Result<int> r = out.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 13);
}

TEST(Task, an_error_in_a_future_is_a_value_never_an_exception) {
  Promise<int> p;
  auto body = [](Future<int> f) -> Task<std::string> {
    Result<int> r = co_await std::move(f);
    co_return r.ok() ? std::string("ok") : std::string(troupe::to_string(r.error().code()));
  };
  Future<std::string> out = troupe::into_future(body(p.future()));
  p.set_error(Error(ErrorCode::timeout, "late"));
  EXPECT_EQ(*out.get(), "timeout");
  Promise<int> dropped;
  Future<std::string> out2 = troupe::into_future(body(dropped.future()));
  dropped = Promise<int>();  // dropped without a result
  EXPECT_EQ(*out2.get(), "no_reply");
}

struct Boom : std::runtime_error {
  Boom() : std::runtime_error("boom") {}
};

TEST(Task, an_exception_reaches_the_awaiting_task_and_then_the_future_unchanged) {
  auto thrower = []() -> Task<int> {
    throw Boom();
    co_return 0;
  };
  auto outer = [&]() -> Task<int> {
    try {
      co_return co_await thrower();
    } catch (const Boom&) {
      co_return 5;
    }
  };
  EXPECT_EQ(*troupe::sync_wait(outer()), 5);
  Result<int> r = troupe::sync_wait(thrower());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::handler_failed);
  EXPECT_THROW(r.error().rethrow_if_exception(), Boom);
}

TEST(Task, a_detached_task_runs_to_its_end_and_frees_itself) {
  Promise<int> p;
  auto seen = std::make_shared<std::atomic<int>>(0);
  auto body = [](Future<int> f, std::shared_ptr<std::atomic<int>> out) -> Task<> {
    Result<int> r = co_await std::move(f);
    out->store(*r);
  };
  troupe::detach(body(p.future(), seen));
  EXPECT_EQ(seen->load(), 0);
  EXPECT_EQ(seen.use_count(), 2);  // the frame holds it
  p.set_value(3);
  EXPECT_EQ(seen->load(), 3);
  EXPECT_EQ(seen.use_count(), 1);  // the frame is gone
}

// --- inside actors ---------------------------------------------------------------

struct Double {
  int n = 0;
  ReplyTo<int> reply;
};
struct Keep {
  ReplyTo<int> reply;
};
struct AnswerKept {
  int n = 0;
};
using ServerMsg = std::variant<Double, Keep, AnswerKept>;

// Answers Double at once; keeps Keep's reply target until AnswerKept.
struct Server : troupe::Actor<ServerMsg> {
  void receive(ServerMsg& m) {
    troupe::match(
        m, [&](Double& d) { d.reply(2 * d.n); }, [&](Keep& k) { kept.push_back(std::move(k.reply)); },
        [&](AnswerKept& a) {
          for (auto& r : kept) r.reply(a.n);
          kept.clear();
        });
  }
  std::vector<ReplyTo<int>> kept;
};

// What the coroutine client reports to the test.
struct Got {
  std::string what;
  int value = 0;
};
struct Note {  // a plain message, handled while a handler is suspended
  std::string text;
};
struct AskDouble {
  int n = 0;
};
struct AskKept {};
struct AwaitFuture {
  std::shared_ptr<Future<int>> f;
};
struct ThrowAfterAwait {};
struct AskElsewhere {};
using ClientMsg = std::variant<AskDouble, AskKept, Note, AwaitFuture, ThrowAfterAwait, AskElsewhere>;

// Sets *flag when destroyed: a local of a suspended handler.
struct Sentinel {
  std::shared_ptr<std::atomic<bool>> flag;
  ~Sentinel() {
    if (flag) flag->store(true);
  }
};

struct Client : troupe::Actor<ClientMsg> {
  Client(ActorRef<ServerMsg> s, ActorRef<Got> o, std::shared_ptr<std::atomic<bool>> d)
      : server(std::move(s)), out(std::move(o)), destroyed(std::move(d)) {}

  troupe::Task<> receive(ClientMsg m) {
    if (auto* a = std::get_if<AskDouble>(&m)) {
      Result<int> r = co_await ask<int>(
          server, [n = a->n](ReplyTo<int> rt) { return Double{n, std::move(rt)}; }, 1s);
      out.tell(Got{r.ok() ? "double" : std::string(troupe::to_string(r.error().code())), r.ok() ? *r : 0});
    } else if (std::holds_alternative<AskKept>(m)) {
      Sentinel local{destroyed};
      std::size_t notes_before = notes.size();
      Result<int> r = co_await ask<int>(
          server, [](ReplyTo<int> rt) { return Keep{std::move(rt)}; }, 10s);
      ++resumed;
      // Notes handled while this handler was suspended are visible here.
      out.tell(Got{r.ok() ? "kept" : std::string(troupe::to_string(r.error().code())),
                   static_cast<int>(notes.size() - notes_before)});
    } else if (auto* n = std::get_if<Note>(&m)) {
      notes.push_back(n->text);
      out.tell(Got{"note", static_cast<int>(notes.size())});
    } else if (auto* f = std::get_if<AwaitFuture>(&m)) {
      Result<int> r = co_await std::move(*f->f);
      bool on_test_thread = std::this_thread::get_id() == test_thread;
      out.tell(Got{on_test_thread ? "future on the test thread" : "future", r.ok() ? *r : -1});
    } else if (std::holds_alternative<ThrowAfterAwait>(m)) {
      (void)co_await ask<int>(
          server, [](ReplyTo<int> rt) { return Double{1, std::move(rt)}; }, 1s);
      throw std::runtime_error("after the await");
    } else if (std::holds_alternative<AskElsewhere>(m)) {
      // An ask awaitable awaited by a task that is not this actor's handler.
      auto awaitable = ask<int>(
          server, [](ReplyTo<int> rt) { return Double{1, std::move(rt)}; }, 1s);
      auto other = [](decltype(awaitable) aw) -> Task<int> {
        Result<int> r = co_await std::move(aw);
        co_return r.ok() ? 0 : static_cast<int>(r.error().code());
      };
      Result<int> code = troupe::sync_wait(other(std::move(awaitable)));
      out.tell(Got{"elsewhere", *code});
    }
  }
  void on_stop() {
    // Suspended handlers are destroyed before on_stop runs.
    out.tell(Got{destroyed && destroyed->load() ? "stopped after the frame" : "stopped", resumed});
  }

  ActorRef<ServerMsg> server;
  ActorRef<Got> out;
  std::shared_ptr<std::atomic<bool>> destroyed;
  std::vector<std::string> notes;
  int resumed = 0;
  std::thread::id test_thread = std::this_thread::get_id();
};

class CoroutineHandlers : public ManualClockTest {
 protected:
  TestProbe<Got> probe{system};
  ActorRef<ServerMsg> server = system.spawn<Server>();
  std::shared_ptr<std::atomic<bool>> destroyed = std::make_shared<std::atomic<bool>>(false);
};

TEST_F(CoroutineHandlers, an_awaited_ask_yields_the_reply) {
  auto c = system.spawn<Client>(server, probe.ref(), destroyed);
  c.tell(AskDouble{21});
  Got g = probe.expect_message();
  EXPECT_EQ(g.what, "double");
  EXPECT_EQ(g.value, 42);
}

TEST_F(CoroutineHandlers, the_actor_keeps_receiving_while_a_handler_is_suspended) {
  auto c = system.spawn<Client>(server, probe.ref(), destroyed);
  c.tell(AskKept{});
  settle();
  c.tell(Note{"a"});
  c.tell(Note{"b"});
  EXPECT_EQ(probe.expect_message().what, "note");
  EXPECT_EQ(probe.expect_message().value, 2);
  server.tell(AnswerKept{9});
  Got g = probe.expect_message();
  EXPECT_EQ(g.what, "kept");
  EXPECT_EQ(g.value, 2);  // both notes ran between the handler's start and its resumption
}

TEST_F(CoroutineHandlers, an_ask_timeout_and_a_dead_target_are_values) {
  auto c = system.spawn<Client>(server, probe.ref(), destroyed);
  c.tell(AskKept{});
  settle();
  advance(10s);
  EXPECT_EQ(probe.expect_message().what, "timeout");
  server.stop();
  settle();
  c.tell(AskDouble{1});
  EXPECT_EQ(probe.expect_message().what, "dead_letter");
}

TEST_F(CoroutineHandlers, an_awaited_future_resumes_in_the_actor_not_on_the_completing_thread) {
  auto c = system.spawn<Client>(server, probe.ref(), destroyed);
  Promise<int> p;
  auto f = std::make_shared<Future<int>>(p.future());
  c.tell(AwaitFuture{f});
  settle();
  p.set_value(5);  // on the test thread
  Got g = probe.expect_message();
  EXPECT_EQ(g.what, "future");
  EXPECT_EQ(g.value, 5);
}

TEST_F(CoroutineHandlers, a_stop_destroys_a_suspended_handler_and_drops_the_late_reply) {
  auto c = system.spawn<Client>(server, probe.ref(), destroyed);
  c.tell(AskKept{});
  settle();
  EXPECT_FALSE(destroyed->load());
  c.stop();
  Got g = probe.expect_message();
  EXPECT_EQ(g.what, "stopped after the frame");
  EXPECT_TRUE(destroyed->load());
  server.tell(AnswerKept{1});  // the reply to the destroyed handler
  settle();
  EXPECT_EQ(g.value, 0);
  probe.expect_no_message(50ms);
}

TEST_F(CoroutineHandlers, a_restart_destroys_suspended_handlers_and_a_late_reply_resumes_nothing) {
  auto c = system.spawn<Client>(troupe::SpawnOptions{.supervision = troupe::Supervision::restart()}, server,
                                probe.ref(), destroyed);
  c.tell(AskKept{});
  settle();
  c.tell(ThrowAfterAwait{});  // resumes, throws: supervision restarts the actor
  EXPECT_EQ(probe.expect_message().what, "stopped after the frame");
  EXPECT_TRUE(destroyed->load());
  server.tell(AnswerKept{1});  // answers the destroyed handler's ask
  settle();
  probe.expect_no_message(50ms);
  c.tell(AskDouble{2});  // the new incarnation works
  EXPECT_EQ(probe.expect_message().value, 4);
  EXPECT_EQ(system.stats().restarts, 1u);
}

TEST_F(CoroutineHandlers, an_ask_awaited_outside_the_askers_handlers_is_refused) {
  auto c = system.spawn<Client>(server, probe.ref(), destroyed);
  c.tell(AskElsewhere{});
  Got g = probe.expect_message();
  EXPECT_EQ(g.what, "elsewhere");
  EXPECT_EQ(g.value, static_cast<int>(ErrorCode::invalid_argument));
}

// A task started from on_start, not from a message.
struct Starter : troupe::Actor<int> {
  Starter(ActorRef<ServerMsg> s, ActorRef<Got> o) : server(std::move(s)), out(std::move(o)) {}
  void on_start() { start_task(run()); }
  void receive(int&) {}
  troupe::Task<> run() {
    Result<int> r = co_await ask<int>(
        server, [](ReplyTo<int> rt) { return Double{8, std::move(rt)}; }, 1s);
    out.tell(Got{"started", *r});
  }
  ActorRef<ServerMsg> server;
  ActorRef<Got> out;
};

TEST_F(CoroutineHandlers, start_task_runs_a_task_as_a_handler_of_the_actor) {
  system.spawn<Starter>(server, probe.ref());
  Got g = probe.expect_message();
  EXPECT_EQ(g.what, "started");
  EXPECT_EQ(g.value, 16);
}

// Many handlers suspended at once, resumed by replies from other threads,
// mixed with plain messages; the actor's plain counter is never touched
// concurrently (ThreadSanitizer) and every handler resumes exactly once.
struct Counting : troupe::Actor<int> {
  Counting(ActorRef<ServerMsg> s, ActorRef<Got> o, int n) : server(std::move(s)), out(std::move(o)), total(n) {}
  troupe::Task<> receive(int n) {
    ++count;
    if (n >= 0) {
      Result<int> r = co_await ask<int>(
          server, [n](ReplyTo<int> rt) { return Double{n, std::move(rt)}; }, 10s);
      if (r.ok() && *r == 2 * n) ++count;
    }
    if (count == total) out.tell(Got{"all", count});
  }
  ActorRef<ServerMsg> server;
  ActorRef<Got> out;
  int total;
  int count = 0;
};

TEST(CoroutineHandlersRealTime, handlers_never_run_concurrently_with_the_actors_other_handlers) {
  troupe::ActorSystem sys(troupe::SystemConfig{.threads = 2});
  TestProbe<Got> probe(sys);
  constexpr int kAsks = 2000, kPlain = 2000;
  std::vector<ActorRef<ServerMsg>> servers;
  for (int i = 0; i < 4; ++i) servers.push_back(sys.spawn<Server>());
  auto c = sys.spawn<Counting>(servers[0], probe.ref(), 2 * kAsks + kPlain);
  std::thread t([&] {
    for (int i = 0; i < kPlain; ++i) c.tell(-1);
  });
  for (int i = 0; i < kAsks; ++i) c.tell(i);
  t.join();
  Got g = probe.expect_message(10s);
  EXPECT_EQ(g.value, 2 * kAsks + kPlain);
}

}  // namespace
