// Back-pressured process manager: bounded running and buffered processes,
// refusal at once, slots freed whatever ends a process, throttle, reply on
// acceptance or on completion.
// Every throttle and timer runs on the manual clock (X3); real-time waits
// only bound how long a test waits for worker threads.

#include "troupe/patterns/process_manager.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Future;
using troupe::ProcessHandle;
using troupe::ProcessId;
using troupe::ProcessManager;
using troupe::Result;

// What a process threw, with a payload to check that the caller got this very object.
struct Boom : std::runtime_error {
  explicit Boom(int c) : std::runtime_error("boom " + std::to_string(c)), code(c) {}
  int code;
};

// How a test process behaves.
enum class Script {
  hold,                       // waits until the test completes its handle
  complete_at_start,          // completes in on_start (and does not stop itself)
  complete_on_first_message,  // on_start tells itself Go; completes on it
  complete_after_10ms,        // completes on a 10 ms timer
  fail_on_first_message,      // handle.fail(invalid_argument)
  throw_on_first_message,
  throw_in_on_start,
  throw_in_constructor,
  throw_in_become,           // a become() behaviour throws
  throw_once_then_complete,  // throws in its first incarnation, completes in the next
  complete_then_throw,
  stop_itself,
};

struct Go {};
struct Tick {};
using ScriptMsg = std::variant<Go, Tick>;

// Shared by the test and its processes: who started, who is alive, which
// processes wait for the test.
struct Board {
  std::mutex mu;
  std::vector<int> started;                              // values, in the order the manager started them
  std::vector<std::pair<ProcessHandle<int>, int>> held;  // hold processes not yet completed by the test
  std::vector<ActorRef<ScriptMsg>> held_refs;
  std::atomic<int> live{0};  // process objects alive now
  std::atomic<int> max_live{0};
  std::atomic<int> incarnations{0};

  void enter() {
    int n = ++live;
    int seen = max_live.load();
    while (n > seen && !max_live.compare_exchange_weak(seen, n)) {
    }
  }
  void leave() { --live; }

  // The manager builds processes on its own thread, in the order it starts
  // them; on_start then runs wherever a worker picks the actor up.
  void note_built(int value) {
    std::lock_guard lk(mu);
    started.push_back(value);
  }
  void note_start(int value, Script s, const ProcessHandle<int>& h, ActorRef<ScriptMsg> self) {
    std::lock_guard lk(mu);
    if (s == Script::hold) {
      held.emplace_back(h, value);
      held_refs.push_back(std::move(self));
    }
  }
  std::vector<int> started_values() {
    std::lock_guard lk(mu);
    return started;
  }
  std::size_t started_count() {
    std::lock_guard lk(mu);
    return started.size();
  }
  // Completes every held process with its value; how many there were.
  int finish_held() {
    std::vector<std::pair<ProcessHandle<int>, int>> h;
    {
      std::lock_guard lk(mu);
      h.swap(held);
    }
    for (auto& [handle, value] : h) handle.complete(value);
    return static_cast<int>(h.size());
  }
  ProcessHandle<int> held_handle(std::size_t i) {
    std::lock_guard lk(mu);
    return held.at(i).first;
  }
  ProcessHandle<int> handle_for(int value) {
    std::lock_guard lk(mu);
    for (auto& [h, v] : held)
      if (v == value) return h;
    return {};
  }
  ActorRef<ScriptMsg> held_ref(std::size_t i) {
    std::lock_guard lk(mu);
    return held_refs.at(i);
  }
  // Refs and handles point back at actors that point at this board.
  void clear() {
    std::lock_guard lk(mu);
    held.clear();
    held_refs.clear();
  }
};

struct Scripted : troupe::Actor<ScriptMsg> {
  using result_type = int;

  Scripted(ProcessHandle<int> h, std::shared_ptr<Board> b, Script s, int v)
      : handle(std::move(h)), board(std::move(b)), script(s), value(v) {
    if (script == Script::throw_in_constructor) throw Boom(value);
    board->enter();
    board->note_built(value);
  }
  ~Scripted() { board->leave(); }

  void on_start() {
    int incarnation = board->incarnations.fetch_add(1);
    board->note_start(value, script, handle, self());
    switch (script) {
      case Script::complete_at_start:
        handle.complete(value);
        break;
      case Script::complete_after_10ms:
        start_timer("done", 10ms, Tick{});
        break;
      case Script::throw_in_on_start:
        throw Boom(value);
      case Script::throw_in_become:
        become([this](ScriptMsg&) { throw Boom(value); });
        self().tell(Go{});
        break;
      case Script::throw_once_then_complete:
        if (incarnation > 0) {
          handle.complete(value);
        } else {
          self().tell(Go{});
        }
        break;
      case Script::stop_itself:
        stop();
        break;
      case Script::hold:
        break;
      default:
        self().tell(Go{});
    }
  }

  void receive(ScriptMsg& m) {
    if (std::holds_alternative<Tick>(m)) {
      handle.complete(value);
      return;
    }
    switch (script) {
      case Script::complete_on_first_message:
        handle.complete(value);
        break;
      case Script::fail_on_first_message:
        handle.fail(Error(ErrorCode::invalid_argument, "order " + std::to_string(value) + " is not payable"));
        break;
      case Script::complete_then_throw:
        handle.complete(value);
        throw Boom(value);
      case Script::throw_on_first_message:
      case Script::throw_once_then_complete:
        throw Boom(value);
      default:
        break;
    }
  }

  ProcessHandle<int> handle;
  std::shared_ptr<Board> board;
  Script script;
  int value;
};

using Manager = ProcessManager<Scripted>;

// Waits (real time, generously) for a future; a stuck one fails the test.
template <class T>
Result<T> await(Future<T>& f) {
  if (!f.wait_for(10s)) {
    ADD_FAILURE() << "a future was not completed within 10 s";
    return Error(ErrorCode::timeout, "test gave up waiting");
  }
  return f.get();
}
template <class T>
Result<T> await(Future<T>&& f) {
  return await(f);
}

class Processes : public troupe::testkit::ManualClockTest {
 protected:
  ~Processes() override {
    system.shutdown();
    board->clear();
  }

  Manager start(Manager::Settings s) {
    auto r = Manager::start(system, std::move(s));
    if (!r.ok()) throw std::runtime_error("start failed: " + r.error().to_string());
    return std::move(r).value();
  }

  Future<int> run(const Manager& pm, Script s, int v) { return pm.submit(board, s, v); }

  // Completes held processes until the manager holds nothing.
  void finish_everything(const Manager& pm) {
    for (int i = 0; i < 1000 && pm.stats().outstanding > 0; ++i) {
      board->finish_held();
      settle();
    }
    EXPECT_EQ(pm.stats().outstanding, 0u);
  }

  std::shared_ptr<Board> board = std::make_shared<Board>();
};

// --- P1: bounded running, bounded buffer, refusal at once ---------------------------

// proves: P1
TEST_F(Processes, a_full_manager_refuses_at_once_with_buffer_overflow_naming_its_bounds) {
  auto pm = start({.name = "orders", .max_running = 2, .buffer = 3});
  std::vector<Future<int>> accepted;
  for (int i = 0; i < 5; ++i) accepted.push_back(run(pm, Script::hold, i));
  settle();
  auto s = pm.stats();
  EXPECT_EQ(s.running, 2u);
  EXPECT_EQ(s.buffered, 3u);
  EXPECT_EQ(s.outstanding, 5u);
  EXPECT_EQ(s.accepted, 5u);
  EXPECT_EQ(board->started_count(), 2u);

  auto refused = run(pm, Script::hold, 99);
  EXPECT_TRUE(refused.ready()) << "a refusal is complete on return, without a message hop";
  auto r = refused.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::buffer_overflow);
  EXPECT_NE(r.error().message().find("'orders'"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("2 running"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("3 waiting"), std::string::npos) << r.error().message();
  auto refused_submit = pm.enqueue(board, Script::hold, 100);
  ASSERT_TRUE(refused_submit.ready());
  EXPECT_EQ(refused_submit.get().error().code(), ErrorCode::buffer_overflow);
  settle();
  s = pm.stats();
  EXPECT_EQ(s.refused, 2u);
  EXPECT_EQ(s.outstanding, 5u);
  EXPECT_EQ(s.accepted, 5u);

  // Nothing else was lost: every accepted request runs, first in first out.
  finish_everything(pm);
  for (int i = 0; i < 5; ++i) {
    auto v = await(accepted[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(*v, i);
  }
  EXPECT_EQ(board->started_values(), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pm.stats().completed, 5u);
  EXPECT_EQ(pm.stats().peak_running, 2u);
  EXPECT_EQ(pm.stats().peak_buffered, 3u);
  EXPECT_LE(board->max_live.load(), 2);
}

// A process whose argument is a string, to see what a refusal does to it.
struct Echo : troupe::Actor<Go> {
  using result_type = std::string;
  Echo(ProcessHandle<std::string> h, std::shared_ptr<std::vector<ProcessHandle<std::string>>> w,
       std::string t)
      : handle(std::move(h)), waiting(std::move(w)), text(std::move(t)) {}
  void on_start() {
    if (text == "hold") {
      waiting->push_back(handle);  // only the test's thread reads it, after settle()
    } else {
      handle.complete(text);
    }
  }
  void receive(Go&) {}
  ProcessHandle<std::string> handle;
  std::shared_ptr<std::vector<ProcessHandle<std::string>>> waiting;
  std::string text;
};

// proves: P1
TEST_F(Processes, a_refused_request_leaves_its_arguments_untouched) {
  auto waiting = std::make_shared<std::vector<ProcessHandle<std::string>>>();
  auto pm = ProcessManager<Echo>::start(system, {.name = "echo", .max_running = 1, .buffer = 0}).value();
  auto first = pm.submit(waiting, std::string("hold"));
  settle();
  ASSERT_EQ(waiting->size(), 1u);

  std::string text = "a long argument that would be moved from if it were consumed";
  auto refused = pm.submit(waiting, std::move(text));
  ASSERT_TRUE(refused.ready());
  EXPECT_EQ(refused.get().error().code(), ErrorCode::buffer_overflow);
  EXPECT_EQ(text, "a long argument that would be moved from if it were consumed");  // NOLINT: not moved from

  (*waiting)[0].complete("first");
  EXPECT_EQ(*await(first), "first");
  auto second = pm.submit(waiting, std::move(text));
  EXPECT_EQ(*await(second), "a long argument that would be moved from if it were consumed");
  waiting->clear();
}

// proves: P1
TEST_F(Processes, the_bound_is_exact_under_many_concurrent_submitters) {
  auto pm = start({.name = "exact", .max_running = 4, .buffer = 8});
  constexpr int kThreads = 8;
  constexpr int kEach = 200;
  std::vector<std::vector<Future<int>>> per_thread(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto f = pm.submit(board, Script::hold, t * 1000 + i);
        per_thread[static_cast<std::size_t>(t)].push_back(std::move(f));
      }
    });
  }
  for (auto& th : threads) th.join();
  settle();
  // Nothing completes while they submit: exactly max_running + buffer get in.
  auto s = pm.stats();
  EXPECT_EQ(s.accepted, 12u);
  EXPECT_EQ(s.refused, static_cast<std::uint64_t>(kThreads * kEach - 12));
  EXPECT_EQ(s.running, 4u);
  EXPECT_EQ(s.buffered, 8u);
  EXPECT_EQ(board->live.load(), 4);
  int refused = 0;
  std::vector<Future<int>*> in;
  for (auto& v : per_thread) {
    for (auto& f : v) {
      if (f.ready()) {
        auto r = f.get();
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), ErrorCode::buffer_overflow);
        ++refused;
      } else {
        in.push_back(&f);
      }
    }
  }
  EXPECT_EQ(refused, kThreads * kEach - 12);
  ASSERT_EQ(in.size(), 12u);
  finish_everything(pm);
  for (auto* f : in) EXPECT_TRUE(await(*f).ok());
  EXPECT_LE(board->max_live.load(), 4);
  EXPECT_EQ(pm.stats().completed, 12u);
}

// proves: P1, P2
TEST_F(Processes, live_processes_never_exceed_max_running_while_many_threads_submit_and_slots_churn) {
  auto pm = start({.name = "churn", .max_running = 4, .buffer = 8});
  constexpr int kThreads = 6;
  constexpr int kEach = 300;
  std::atomic<bool> done{false};
  std::atomic<int> violations{0};
  std::thread sampler([&] {
    while (!done.load()) {
      auto s = pm.stats();
      if (s.running > 4 || s.buffered > 8 || s.outstanding > 12 || board->live.load() > 4) ++violations;
      std::this_thread::yield();
    }
  });
  std::vector<std::vector<std::pair<int, Future<int>>>> per_thread(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        int v = t * 1000 + i;
        per_thread[static_cast<std::size_t>(t)].emplace_back(v,
                                                             run(pm, Script::complete_on_first_message, v));
      }
    });
  }
  for (auto& th : threads) th.join();
  std::uint64_t ok = 0, overflow = 0;
  for (auto& v : per_thread) {
    for (auto& [value, f] : v) {
      auto r = await(f);
      if (r.ok()) {
        EXPECT_EQ(*r, value);
        ++ok;
      } else {
        EXPECT_EQ(r.error().code(), ErrorCode::buffer_overflow) << r.error().to_string();
        ++overflow;
      }
    }
  }
  done = true;
  sampler.join();
  settle();
  auto s = pm.stats();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(ok + overflow, static_cast<std::uint64_t>(kThreads * kEach));
  EXPECT_EQ(s.accepted, ok);
  EXPECT_EQ(s.completed, ok);
  EXPECT_EQ(s.refused, overflow);
  EXPECT_EQ(s.outstanding, 0u);
  EXPECT_LE(s.peak_running, 4u);
  EXPECT_LE(s.peak_buffered, 8u);
  EXPECT_LE(board->max_live.load(), 4);
  EXPECT_EQ(board->live.load(), 0);
}

// proves: P1, P2, X3
TEST_F(Processes, a_sustained_tenfold_overload_stays_bounded_and_every_accepted_process_completes) {
  constexpr std::size_t kN = 8, kB = 16;
  constexpr int kRounds = 50;
  auto pm = start({.name = "overload", .max_running = kN, .buffer = kB});
  // Each process takes 10 ms; every 10 ms callers ask for ten times what completes.
  std::vector<std::pair<int, Future<int>>> accepted;
  std::uint64_t refused = 0;
  int next = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::size_t in_round = 0;
    for (std::size_t i = 0; i < 10 * kN; ++i) {
      int v = next++;
      auto f = run(pm, Script::complete_after_10ms, v);
      if (f.ready()) {
        EXPECT_EQ(f.get().error().code(), ErrorCode::buffer_overflow);
        ++refused;
      } else {
        accepted.emplace_back(v, std::move(f));
        ++in_round;
      }
    }
    // Round 0 fills slots and buffer; afterwards exactly the slots freed by
    // the previous round's completions are taken again.
    EXPECT_EQ(in_round, round == 0 ? kN + kB : kN) << "round " << round;
    settle();
    auto s = pm.stats();
    EXPECT_EQ(s.running, kN);
    EXPECT_EQ(s.buffered, kB);
    EXPECT_EQ(s.outstanding, kN + kB);
    EXPECT_LE(board->live.load(), static_cast<int>(kN));
    EXPECT_LE(system.stats().actors_live, kN + 1) << "process actors beyond the bound (plus the manager)";
    advance(10ms);
  }
  for (int i = 0; i < 5 && pm.stats().outstanding > 0; ++i) advance(10ms);
  auto s = pm.stats();
  EXPECT_EQ(s.outstanding, 0u);
  EXPECT_EQ(s.accepted, kN + kB + (kRounds - 1) * kN);
  EXPECT_EQ(s.refused, refused);
  EXPECT_EQ(s.accepted + s.refused, static_cast<std::uint64_t>(kRounds) * 10 * kN);
  EXPECT_EQ(s.completed, s.accepted);
  EXPECT_EQ(s.peak_running, kN);
  EXPECT_EQ(s.peak_buffered, kB);
  EXPECT_LE(board->max_live.load(), static_cast<int>(kN));
  for (auto& [v, f] : accepted) {
    auto r = await(f);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(*r, v);
  }
}

// --- P2: every end frees the slot ----------------------------------------------------

// proves: P2
TEST_F(Processes, a_process_that_throws_frees_its_slot_and_its_caller_can_rethrow_the_exception) {
  auto pm = start({.name = "throwing", .max_running = 1, .buffer = 0});
  for (Script s : {Script::throw_on_first_message, Script::throw_in_on_start}) {
    auto f = run(pm, s, 7);
    auto r = await(f);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::handler_failed);
    EXPECT_NE(r.error().message().find("boom 7"), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("throwing/"), std::string::npos) << r.error().message();
    try {
      r.error().rethrow_if_exception();
      ADD_FAILURE() << "the original exception was not kept";
    } catch (const Boom& b) {
      EXPECT_EQ(b.code, 7);
    }
    // With one slot and no buffer, the slot is free by the time the caller hears.
    auto next = run(pm, Script::complete_on_first_message, 8);
    EXPECT_EQ(*await(next), 8);
  }
  auto s = pm.stats();
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.completed, 2u);
  EXPECT_EQ(s.refused, 0u);
  EXPECT_EQ(board->live.load(), 0);
}

// proves: P2
TEST_F(Processes, a_process_whose_constructor_throws_fails_its_request_and_frees_its_slot) {
  auto pm = start({.name = "unbuildable", .max_running = 1, .buffer = 0});
  auto f = run(pm, Script::throw_in_constructor, 3);
  auto r = await(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::handler_failed);
  EXPECT_THROW(r.error().rethrow_if_exception(), Boom);
  auto next = run(pm, Script::complete_at_start, 4);
  EXPECT_EQ(*await(next), 4);
  EXPECT_EQ(pm.stats().failed, 1u);
}

// proves: P2
TEST_F(Processes, an_exception_from_a_become_behaviour_fails_the_request_with_its_text) {
  auto pm = start({.name = "becoming", .max_running = 1, .buffer = 0});
  auto f = run(pm, Script::throw_in_become, 5);
  auto r = await(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::handler_failed);
  EXPECT_NE(r.error().message().find("boom 5"), std::string::npos) << r.error().message();
  auto next = run(pm, Script::complete_at_start, 6);
  EXPECT_EQ(*await(next), 6);
}

// proves: P2
TEST_F(Processes, a_process_that_fails_gives_its_caller_its_error) {
  auto pm = start({.name = "failing", .max_running = 1, .buffer = 0});
  auto f = run(pm, Script::fail_on_first_message, 9);
  auto r = await(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(r.error().message(), "order 9 is not payable");
  EXPECT_EQ(*await(run(pm, Script::complete_at_start, 10)), 10);
  EXPECT_EQ(pm.stats().failed, 1u);
}

// proves: P2
TEST_F(Processes, a_process_that_stops_itself_without_completing_frees_its_slot) {
  auto pm = start({.name = "quitter", .max_running = 1, .buffer = 0});
  auto f = run(pm, Script::stop_itself, 1);
  auto r = await(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::no_reply);
  EXPECT_NE(r.error().message().find("stopped without completing"), std::string::npos) << r.error().message();
  EXPECT_EQ(*await(run(pm, Script::complete_at_start, 2)), 2);
}

// proves: P2
TEST_F(Processes, a_process_stopped_by_someone_else_frees_its_slot) {
  auto pm = start({.name = "stopped", .max_running = 1, .buffer = 0});
  auto f = run(pm, Script::hold, 1);
  settle();
  EXPECT_EQ(run(pm, Script::hold, 2).get().error().code(), ErrorCode::buffer_overflow);
  board->held_ref(0).stop();
  auto r = await(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::no_reply);
  EXPECT_EQ(*await(run(pm, Script::complete_at_start, 3)), 3);
  EXPECT_EQ(board->live.load(), 0);
}

// proves: P2
TEST_F(Processes, a_completed_process_actor_has_terminated_before_its_caller_is_answered) {
  auto pm = start({.name = "sequential", .max_running = 1, .buffer = 0});
  // complete_at_start does not stop itself: the manager stops it.
  for (int i = 0; i < 20; ++i) {
    auto f = run(pm, Script::complete_at_start, i);
    auto r = await(f);
    ASSERT_TRUE(r.ok()) << "run " << i << ": " << r.error().to_string();
    EXPECT_EQ(*r, i);
    EXPECT_EQ(board->live.load(), 0) << "the process object outlived its answer";
  }
  EXPECT_EQ(pm.stats().refused, 0u);
}

// proves: P2, P4
TEST_F(Processes, a_process_can_be_completed_from_another_thread_and_only_the_first_completion_counts) {
  auto pm = start({.name = "remote", .max_running = 2, .buffer = 0});
  auto f = run(pm, Script::hold, 1);
  settle();
  auto h = board->held_handle(0);
  EXPECT_FALSE(h.done());
  bool first = false;
  std::thread other([&] { first = h.complete(42); });
  other.join();
  EXPECT_TRUE(first);
  EXPECT_TRUE(h.done());
  EXPECT_FALSE(h.complete(43));
  EXPECT_FALSE(h.fail(Error(ErrorCode::timeout, "too late")));
  EXPECT_EQ(*await(f), 42);
  settle();
  EXPECT_EQ(board->live.load(), 0) << "the manager stops a completed process";
  EXPECT_FALSE(h.complete(44)) << "completing after the end does nothing";
}

// proves: P2
TEST_F(Processes, a_throw_after_completing_keeps_the_result) {
  auto pm = start({.name = "late-throw", .max_running = 1, .buffer = 0});
  EXPECT_EQ(*await(run(pm, Script::complete_then_throw, 11)), 11);
  EXPECT_EQ(pm.stats().completed, 1u);
  EXPECT_EQ(pm.stats().failed, 0u);
}

// proves: P2
TEST_F(Processes, under_restart_supervision_a_process_keeps_its_slot_and_completes_in_a_later_incarnation) {
  auto pm = start({.name = "restarting",
                   .max_running = 1,
                   .buffer = 0,
                   .process_options = {.supervision = troupe::Supervision::restart()}});
  auto f = run(pm, Script::throw_once_then_complete, 12);
  EXPECT_EQ(*await(f), 12);
  EXPECT_EQ(board->incarnations.load(), 2);
  EXPECT_EQ(pm.stats().completed, 1u);
  EXPECT_EQ(pm.stats().peak_running, 1u);
  EXPECT_EQ(board->live.load(), 0);
}

// proves: P2
TEST_F(Processes, stopping_the_manager_answers_every_buffered_and_running_request) {
  std::mutex mu;
  std::vector<std::pair<ProcessId, Result<int>>> outcomes;
  auto pm = start({.name = "stopping",
                   .max_running = 2,
                   .buffer = 3,
                   .on_outcome = [&](ProcessId id, const Result<int>& r) {
                     std::lock_guard lk(mu);
                     outcomes.emplace_back(id, r);
                   }});
  std::vector<Future<int>> runs;
  for (int i = 0; i < 4; ++i) runs.push_back(run(pm, Script::hold, i));
  auto submitted = pm.enqueue(board, Script::hold, 4);
  ProcessId id = *submitted.get();
  settle();
  EXPECT_EQ(pm.stats().running, 2u);
  EXPECT_EQ(pm.stats().buffered, 3u);
  auto h = board->held_handle(0);

  pm.stop();
  settle();
  EXPECT_TRUE(pm.stopped());
  for (auto& f : runs) {
    auto r = await(f);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
    EXPECT_NE(r.error().message().find("'stopping'"), std::string::npos) << r.error().message();
  }
  {
    std::lock_guard lk(mu);
    ASSERT_EQ(outcomes.size(), 1u);
    EXPECT_EQ(outcomes[0].first, id);
    EXPECT_EQ(outcomes[0].second.error().code(), ErrorCode::shutting_down);
  }
  EXPECT_EQ(board->live.load(), 0) << "the running process actors were stopped too";
  EXPECT_FALSE(h.complete(1)) << "a process of a stopped manager can no longer complete";
  auto late = run(pm, Script::hold, 5);
  ASSERT_TRUE(late.ready());
  EXPECT_EQ(late.get().error().code(), ErrorCode::shutting_down);
  auto s = pm.stats();
  EXPECT_EQ(s.cancelled, 5u);
  EXPECT_EQ(s.outstanding, 0u);
  EXPECT_EQ(s.running, 0u);
  EXPECT_EQ(s.buffered, 0u);
  EXPECT_EQ(s.accepted, 5u);
}

// proves: P2
TEST_F(Processes, the_system_s_shutdown_answers_every_request) {
  auto pm = start({.name = "shutdown", .max_running = 1, .buffer = 2});
  std::vector<Future<int>> runs;
  for (int i = 0; i < 3; ++i) runs.push_back(run(pm, Script::hold, i));
  settle();
  system.shutdown();
  for (auto& f : runs) {
    auto r = await(f);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  }
  auto late = pm.enqueue(board, Script::hold, 3);
  ASSERT_TRUE(late.ready());
  EXPECT_EQ(late.get().error().code(), ErrorCode::shutting_down);
  EXPECT_EQ(board->live.load(), 0);
  EXPECT_EQ(pm.stats().cancelled, 3u);
  EXPECT_EQ(pm.stats().accepted, 3u);
}

// --- P3: throttle ----------------------------------------------------------------------

// proves: P3, X3
TEST_F(Processes, the_throttle_starts_exactly_the_permitted_number_per_second) {
  auto pm =
      start({.name = "throttled", .max_running = 100, .buffer = 100, .starts_per_second = 10, .burst = 1});
  std::vector<Future<int>> fs;
  for (int i = 0; i < 25; ++i) fs.push_back(run(pm, Script::complete_at_start, i));
  settle();
  EXPECT_EQ(board->started_count(), 1u);
  EXPECT_EQ(pm.stats().buffered, 24u);
  advance(99ms);
  EXPECT_EQ(board->started_count(), 1u) << "the second start is due at 100 ms, not before";
  advance(1ms);
  EXPECT_EQ(board->started_count(), 2u);
  // One start every 100 ms, exactly: 11 in the first second (at 0, 100, ..., 1000 ms).
  for (int k = 2; k <= 10; ++k) {
    advance(99ms);
    EXPECT_EQ(board->started_count(), static_cast<std::size_t>(k)) << "at " << (k * 100 - 1) << " ms";
    advance(1ms);
    EXPECT_EQ(board->started_count(), static_cast<std::size_t>(k + 1)) << "at " << (k * 100) << " ms";
  }
  advance_in_steps(1400ms, 100ms);
  EXPECT_EQ(board->started_count(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(*await(fs[static_cast<std::size_t>(i)]), i);
  auto order = board->started_values();
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << "first in, first started";
}

// proves: P3, X3
TEST_F(Processes, the_throttle_allows_a_burst_after_an_idle_period_and_then_its_rate) {
  auto pm = start({.name = "bursty", .max_running = 100, .buffer = 100, .starts_per_second = 10, .burst = 3});
  for (int i = 0; i < 5; ++i) (void)pm.enqueue(board, Script::complete_at_start, i);
  settle();
  EXPECT_EQ(board->started_count(), 3u) << "a full bucket: three at once";
  advance(99ms);
  EXPECT_EQ(board->started_count(), 3u);
  advance(1ms);
  EXPECT_EQ(board->started_count(), 4u);
  advance(100ms);
  EXPECT_EQ(board->started_count(), 5u);
  // Idle long enough to refill the bucket: a burst again.
  advance(1s);
  for (int i = 5; i < 10; ++i) (void)pm.enqueue(board, Script::complete_at_start, i);
  settle();
  EXPECT_EQ(board->started_count(), 8u);
  advance_in_steps(200ms, 100ms);
  EXPECT_EQ(board->started_count(), 10u);
  EXPECT_EQ(pm.stats().completed, 10u);
}

// proves: P1, P3
TEST_F(Processes, a_throttled_manager_still_counts_waiting_requests_against_its_bound) {
  auto pm = start({.name = "slow-start", .max_running = 2, .buffer = 1, .starts_per_second = 1, .burst = 1});
  std::vector<Future<int>> fs;
  for (int i = 0; i < 3; ++i) fs.push_back(run(pm, Script::hold, i));
  EXPECT_EQ(run(pm, Script::hold, 3).get().error().code(), ErrorCode::buffer_overflow);
  settle();
  auto s = pm.stats();
  EXPECT_EQ(s.running, 1u);
  EXPECT_EQ(s.buffered, 2u) << "a request with a free slot but no token waits in the buffer";
  EXPECT_LE(s.running + s.buffered, 3u);
  advance(1s);
  EXPECT_EQ(pm.stats().running, 2u);
  advance(1s);
  EXPECT_EQ(pm.stats().running, 2u) << "no slot free: the token does not start a third";
  board->finish_held();
  settle();
  EXPECT_EQ(pm.stats().running, 1u);
  board->finish_held();
  settle();
  for (auto& f : fs) EXPECT_TRUE(await(f).ok());
}

// --- P4: reply on acceptance or on completion ------------------------------------------

// proves: P4
TEST_F(Processes, submit_answers_on_completion_and_enqueue_answers_on_acceptance) {
  std::mutex mu;
  std::vector<std::pair<ProcessId, Result<int>>> outcomes;
  auto pm = start({.name = "replies",
                   .max_running = 4,
                   .buffer = 4,
                   .on_outcome = [&](ProcessId id, const Result<int>& r) {
                     std::lock_guard lk(mu);
                     outcomes.emplace_back(id, r);
                   }});
  auto accepted = pm.enqueue(board, Script::hold, 1);
  ASSERT_TRUE(accepted.ready()) << "enqueue answers on acceptance, before the process even started";
  auto id = accepted.get();
  ASSERT_TRUE(id.ok());
  auto completed = run(pm, Script::hold, 2);
  settle();
  EXPECT_FALSE(completed.ready()) << "submit answers only when the process finished";
  EXPECT_EQ(board->handle_for(1).id(), *id);
  board->finish_held();
  settle();
  EXPECT_EQ(*await(completed), 2);
  std::lock_guard lk(mu);
  ASSERT_EQ(outcomes.size(), 1u) << "on_outcome hears of submitted processes only";
  EXPECT_EQ(outcomes[0].first, *id);
  ASSERT_TRUE(outcomes[0].second.ok());
  EXPECT_EQ(*outcomes[0].second, 1);
  EXPECT_EQ(pm.stats().completed, 2u);
}

// proves: P4, P2
TEST_F(Processes, enqueued_processes_report_failures_with_their_exception_to_on_outcome) {
  std::mutex mu;
  std::vector<std::pair<ProcessId, Result<int>>> outcomes;
  auto pm = start({.name = "reported",
                   .max_running = 1,
                   .buffer = 8,
                   .on_outcome = [&](ProcessId id, const Result<int>& r) {
                     std::lock_guard lk(mu);
                     outcomes.emplace_back(id, r);
                   }});
  auto a = *pm.enqueue(board, Script::throw_on_first_message, 1).get();
  auto b = *pm.enqueue(board, Script::fail_on_first_message, 2).get();
  auto c = *pm.enqueue(board, Script::complete_on_first_message, 3).get();
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  settle();
  std::lock_guard lk(mu);
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[0].first, a);
  EXPECT_EQ(outcomes[0].second.error().code(), ErrorCode::handler_failed);
  EXPECT_THROW(outcomes[0].second.error().rethrow_if_exception(), Boom);
  EXPECT_EQ(outcomes[1].first, b);
  EXPECT_EQ(outcomes[1].second.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(outcomes[2].first, c);
  EXPECT_EQ(*outcomes[2].second, 3);
  auto s = pm.stats();
  EXPECT_EQ(s.completed, 1u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.accepted, s.completed + s.failed + s.cancelled + s.outstanding);
}

// A process with nothing to return.
struct Chore : troupe::Actor<Go> {
  using result_type = void;
  explicit Chore(ProcessHandle<void> h) : handle(std::move(h)) {}
  void on_start() { self().tell(Go{}); }
  void receive(Go&) { handle.complete(); }
  ProcessHandle<void> handle;
};

// proves: P4
TEST_F(Processes, a_process_without_a_result_completes_a_void_future) {
  auto pm = ProcessManager<Chore>::start(system, {.name = "chores", .max_running = 1, .buffer = 1}).value();
  auto f = pm.submit();
  auto r = await(f);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(pm.stats().completed, 1u);
}

// --- X1: settings ------------------------------------------------------------------------

// proves: X1
TEST_F(Processes, bad_settings_are_refused_with_a_message_that_names_the_setting) {
  auto expect_bad = [&](Manager::Settings s, const std::string& needle) {
    auto r = Manager::start(system, std::move(s));
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
  };
  expect_bad({.name = ""}, "name is empty");
  expect_bad({.name = "m", .max_running = 0}, "max_running is 0");
  expect_bad({.name = "m", .max_running = 2, .buffer = std::numeric_limits<std::size_t>::max()}, "overflows");
  expect_bad({.name = "m", .starts_per_second = std::numeric_limits<double>::quiet_NaN()}, "NaN");
  expect_bad({.name = "m", .starts_per_second = std::numeric_limits<double>::infinity()}, "infinite");
  expect_bad({.name = "m", .starts_per_second = -1}, "negative");
  expect_bad({.name = "m", .starts_per_second = 1e-12}, "below");
  expect_bad({.name = "m", .starts_per_second = 5, .burst = 0}, "burst is 0");
  auto ok = Manager::start(
      system, {.name = "fine", .max_running = 1, .buffer = 0, .starts_per_second = 0, .burst = 0});
  EXPECT_TRUE(ok.ok()) << "burst is ignored without a throttle";
  EXPECT_EQ(system.stats().actors_live, 1u) << "only the valid manager was spawned";
}

}  // namespace
