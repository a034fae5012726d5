#pragma once
// ManualClockTest: a gtest fixture with an actor system on virtual time
// (SPEC X3).
//
// With the manual clock, time moves only by advance(): no timer, receive
// timeout, ask timeout or restart back-off ever fires on its own, so a test
// states exactly when each deadline passes and never sleeps.
//
//   class Timers : public troupe::testkit::ManualClockTest {};
//   TEST_F(Timers, a_timer_fires_at_its_deadline) {
//     auto a = system.spawn<Alarm>(probe.ref());
//     settle();
//     advance(99ms);   // nothing yet
//     advance(1ms);    // fires; its message has been handled on return
//   }
//
// advance(d) fires every timer due within `d` on the test thread, in deadline
// order (ties in start order), and then waits until every actor has handled
// everything those fires sent. One caveat follows from actors running on
// worker threads: a timer that a *handler* starts in reaction to a fire is
// armed at whatever now() the handler reads, which during a long advance may
// already be the end of the step. When handlers re-arm (receive timeouts,
// a handler that restarts its own timer), use advance_settled(), which stops
// at every deadline and settles there, or advance one period at a time with
// advance_in_steps().
//
// Ownership: the fixture owns the clock (shared with the system) and the
// system; the system is destroyed (shut down) at the end of each test.
// Thread safety: the fixture is used from the test's thread only; the clock
// and the system themselves are thread-safe.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "troupe/core/actor_system.hpp"
#include "troupe/core/clock.hpp"

namespace troupe::testkit {

// Moves `clock` forward by `d` one timer deadline at a time, calling
// `settle` (waits until the systems on the clock are idle) before, at each
// deadline and at the end: every handler of a fire runs with now() at its
// deadline, and a timer it arms that falls within `d` fires within this
// call. Deterministic however slow the build. For fixtures with systems of
// their own; ManualClockTest::advance_settled is this on its one system.
template <class Settle>
void advance_settled(ManualClock& clock, Duration d, Settle&& settle) {
  const TimePoint end = clock.now() + d;
  settle();
  for (TimePoint next = clock.next_deadline(); next <= end; next = clock.next_deadline()) {
    clock.advance(std::max(next - clock.now(), Duration::zero()));
    settle();
  }
  clock.advance(end - clock.now());
  settle();
}

class ManualClockTest : public ::testing::Test {
 protected:
  // Real-time bound for settle(): a system that is not idle by then is
  // stuck (a blocked handler, a message loop), which is a test failure.
  static constexpr Duration kSettleTimeout = std::chrono::seconds(10);

  ManualClockTest() : ManualClockTest(SystemConfig{}) {}

  // For fixtures that need more of the config (an on_dead_letter hook, a
  // throughput, ...). The clock is always the fixture's; threads default to
  // 2; failure and dead-letter logging are off so that tests that provoke
  // them stay quiet.
  explicit ManualClockTest(SystemConfig config)
      : clock(std::make_shared<ManualClock>()), system(configure(std::move(config), clock)) {}

  // Moves virtual time forward by `d`, firing what falls due, then waits
  // until every actor has handled what the fires sent.
  void advance(Duration d) {
    clock->advance(d);
    settle();
  }

  // advance(step) repeatedly until `total` has passed (the last step may be
  // shorter): for handlers that re-arm timers from a fire.
  void advance_in_steps(Duration total, Duration step) {
    for (Duration done{}; done < total; done += step) advance(std::min(step, total - done));
  }

  // Moves virtual time forward by `d` one timer deadline at a time,
  // settling the system at each (testkit::advance_settled).
  void advance_settled(Duration d) {
    testkit::advance_settled(*clock, d, [this] { settle(); });
  }

  // Waits until no actor has anything left to do. Pending timers do not
  // count: they wait for advance().
  void settle() {
    if (!system.wait_idle(kSettleTimeout)) {
      ADD_FAILURE() << "the actor system did not become idle within "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(kSettleTimeout).count()
                    << " ms (a handler blocked or messages loop forever)";
    }
  }

  TimePoint now() const { return clock->now(); }

  std::shared_ptr<ManualClock> clock;
  ActorSystem system;

 private:
  static SystemConfig configure(SystemConfig c, std::shared_ptr<ManualClock> clk) {
    if (c.threads == 0) c.threads = 2;
    c.clock = std::move(clk);
    c.log_failures = false;
    c.log_dead_letters = false;
    return c;
  }
};

}  // namespace troupe::testkit
