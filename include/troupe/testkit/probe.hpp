#pragma once
// TestProbe: an actor whose inbox a test can read.
//
// A test hands `probe.ref()` to the actors under test as a reply target (or
// asks the probe to watch one of them) and then states what must arrive:
//
//   troupe::testkit::TestProbe<Reply> probe(system);
//   counter.tell(Get{probe.ref()});
//   EXPECT_EQ(probe.expect<Count>().n, 3);
//   probe.expect_no_message();
//
// A failed expectation is recorded with gtest at the caller's line (through
// std::source_location). expect_message()/expect<T>() then throw
// `ExpectationFailed` to stop the test there, since they have no message to
// return; gtest reports the throw as well and moves on to the next test.
//
// Timeouts here are real time: they bound how long to wait for a message that
// a worker thread is producing, they never decide an outcome by themselves.
// Defaults are generous so that slow sanitizer builds do not flake. For
// "nothing arrives", prefer settling the system (ManualClockTest::settle())
// and checking pending() == 0 over a real-time expect_no_message().
//
// Ownership: the probe owns the actor it spawns (and any watcher helpers)
// and stops them when destroyed; the system owns their memory. The inbox is
// shared with the actor, so a late message after the probe is gone is
// harmless. Destroy a probe before or after its system: both are safe.
// Thread safety: ref() and pending() may be used from any thread; the
// expect_* members are meant for the test's own thread.

#include <cxxabi.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/testkit/detail/probe_inbox.hpp"

namespace troupe::testkit {

// Thrown by a probe expectation that failed (after ADD_FAILURE), so that the
// test stops at that line instead of continuing with an invented message.
class ExpectationFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class Msg>
class TestProbe {
 public:
  static constexpr Duration kDefaultTimeout = std::chrono::seconds(3);

  explicit TestProbe(ActorSystem& system, std::string name = "probe")
      : system_(&system), name_(std::move(name)), inbox_(std::make_shared<detail::ProbeInbox<Msg>>()) {
    ref_ = system.spawn<detail::ProbeActor<Msg>>(SpawnOptions{.name = name_}, inbox_);
    if (!ref_) ADD_FAILURE() << "TestProbe '" << name_ << "': the system refused the spawn (shut down?)";
  }
  ~TestProbe() {
    for (auto& w : watchers_) w.stop();
    ref_.stop();
  }
  TestProbe(const TestProbe&) = delete;
  TestProbe& operator=(const TestProbe&) = delete;

  // Where actors under test send their messages.
  const ActorRef<Msg>& ref() const noexcept { return ref_; }

  // The next message, waiting up to `timeout`. Fails the test (and throws
  // ExpectationFailed) if none arrives.
  Msg expect_message(Duration timeout = kDefaultTimeout,
                     std::source_location where = std::source_location::current()) {
    if (auto m = inbox_->pop_for(timeout)) return std::move(*m);
    fail(where, "expected a message within " + std::to_string(detail::to_ms(timeout)) + " ms, got none");
  }

  // The next message, which must hold the alternative T of the variant
  // protocol Msg. Fails the test (and throws) on timeout or on another
  // alternative; the message is consumed either way.
  template <class T>
    requires detail::is_variant_v<Msg>
  T expect(Duration timeout = kDefaultTimeout, std::source_location where = std::source_location::current()) {
    auto m = inbox_->pop_for(timeout);
    if (!m) {
      fail(where, "expected " + detail::demangle(typeid(T).name()) + " within " +
                      std::to_string(detail::to_ms(timeout)) + " ms, got nothing");
    }
    if (auto* t = std::get_if<T>(&*m)) return std::move(*t);
    fail(where, "expected " + detail::demangle(typeid(T).name()) + ", got " + detail::held_type_name(*m));
  }

  // `n` messages in arrival order; fails (and throws) if fewer arrive, each
  // within `timeout` of the previous one.
  std::vector<Msg> expect_messages(std::size_t n, Duration timeout = kDefaultTimeout,
                                   std::source_location where = std::source_location::current()) {
    std::vector<Msg> out;
    out.reserve(n);
    while (out.size() < n) {
      auto m = inbox_->pop_for(timeout);
      if (!m) {
        fail(where, "expected " + std::to_string(n) + " messages, got " + std::to_string(out.size()) +
                        " (waited " + std::to_string(detail::to_ms(timeout)) + " ms for the next)");
      }
      out.push_back(std::move(*m));
    }
    return out;
  }

  // Waits `d` of real time and fails the test (without throwing) if a
  // message arrives meanwhile. The message is consumed.
  void expect_no_message(Duration d = std::chrono::milliseconds(100),
                         std::source_location where = std::source_location::current()) {
    if (auto m = inbox_->pop_for(d)) {
      record(where, "expected no message within " + std::to_string(detail::to_ms(d)) + " ms, got " +
                        detail::held_type_name(*m));
    }
  }

  // The next message if one arrives within `timeout`, without judging.
  std::optional<Msg> try_receive(Duration timeout = Duration::zero()) { return inbox_->pop_for(timeout); }

  // Messages the probe actor has received and no expectation has consumed.
  // Messages still in its mailbox are not counted: settle the system first.
  std::size_t pending() const { return inbox_->size(); }

  // Delivers `target`'s Down notice to this probe (as Msg(Down)) when it
  // terminates; at once if it already has.
  template <class M>
    requires std::constructible_from<Msg, Down>
  void watch(const ActorRef<M>& target) {
    watchers_.push_back(system_->spawn<detail::ProbeWatcher<Msg, M>>(target, ref_));
  }

 private:
  void record(const std::source_location& where, const std::string& what) const {
    ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line())) << "TestProbe '" << name_ << "': " << what;
  }
  [[noreturn]] void fail(const std::source_location& where, const std::string& what) const {
    record(where, what);
    throw ExpectationFailed("TestProbe '" + name_ + "': " + what);
  }

  ActorSystem* system_;
  std::string name_;
  std::shared_ptr<detail::ProbeInbox<Msg>> inbox_;
  ActorRef<Msg> ref_;
  std::vector<ActorRef<Down>> watchers_;
};

}  // namespace troupe::testkit
