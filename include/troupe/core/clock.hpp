#pragma once
// Time sources for the runtime (SPEC X3).
//
// Every timer, receive timeout and ask timeout in troupe reads time through a
// `Clock`. Production uses `SystemClock`; tests use `ManualClock`, where time
// moves only when the test calls `advance`, and advancing fires every timer
// that became due, one by one in deadline order (ties in the order they were
// started), on the calling thread.
//
// Two readings are offered: `now()` is monotonic and drives timers;
// `wall_now()` is calendar time, for timestamps that must mean something
// after a restart (event times in the journal). A ManualClock moves both
// together.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace troupe {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;
using WallTime = std::chrono::time_point<std::chrono::system_clock, Duration>;

// Duration literals (10ms, 5s), for code that opts in with
// `using namespace troupe::literals;`. troupe's headers do not bring any
// namespace into the user's.
namespace literals {
using std::chrono_literals::operator""h;
using std::chrono_literals::operator""min;
using std::chrono_literals::operator""s;
using std::chrono_literals::operator""ms;
using std::chrono_literals::operator""us;
using std::chrono_literals::operator""ns;
}  // namespace literals

// `now + d`, clamped: a negative `d` gives `now`, an overflow gives
// TimePoint::max() (a deadline that never comes).
inline TimePoint deadline_after(TimePoint now, Duration d) noexcept {
  if (d <= Duration::zero()) return now;
  if (now.time_since_epoch() > TimePoint::max().time_since_epoch() - d) return TimePoint::max();
  return now + d;
}

// Abstract time source. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
  virtual WallTime wall_now() const = 0;
  // now(), possibly lagging by up to a few milliseconds, for bookkeeping that
  // tolerates it and runs on every message (a lock's idle times, the lease
  // check of a block that already returned). Never later than now().
  virtual TimePoint coarse_now() const { return now(); }
  // True for clocks whose time moves only by explicit advance(); the runtime
  // then runs no timer thread and fires timers from advance() instead.
  virtual bool is_manual() const noexcept { return false; }
};

// The real clocks: steady_clock for timers, system_clock for wall time.
// Stateless, shareable across threads.
class SystemClock final : public Clock {
 public:
  TimePoint now() const override;
  WallTime wall_now() const override;
  // CLOCK_MONOTONIC_COARSE: the same time base as now(), a tick behind at
  // most, several times cheaper to read.
  TimePoint coarse_now() const override;
  static std::shared_ptr<SystemClock> instance();
};

// A clock that moves only when told to. Shared by the test and the actor
// systems that use it; all members are thread-safe.
class ManualClock final : public Clock {
 public:
  // Something that keeps timers against this clock (the runtime's timer
  // service). `fire_due(t)` must fire, in order, every timer due at or before t.
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual TimePoint next_deadline() = 0;  // TimePoint::max() when none
    virtual void fire_due(TimePoint until) = 0;
  };

  explicit ManualClock(WallTime wall_start = WallTime{std::chrono::hours(24 * 365 * 56)});

  TimePoint now() const override;
  WallTime wall_now() const override;
  bool is_manual() const noexcept override { return true; }

  // Moves time forward by `d`, stopping at each timer deadline on the way so
  // that timers fire in deadline order and each sees now() == its deadline.
  // Timers started by a fire are honoured if they fall within the step.
  void advance(Duration d);
  // The earliest timer deadline of the listeners; TimePoint::max() when no
  // timer is pending. For stepping from one deadline to the next
  // (ManualClockTest::advance_settled).
  TimePoint next_deadline();
  // Sets wall time only (simulates a restart at a later date); monotonic time
  // and timers are unaffected.
  void set_wall(WallTime t);

  void add_listener(Listener* l);
  void remove_listener(Listener* l);

 private:
  mutable std::mutex mu_;
  std::recursive_mutex advance_mu_;  // one advance at a time; fires may re-enter now()
  TimePoint now_{};
  Duration wall_offset_{};
  std::vector<Listener*> listeners_;
};

}  // namespace troupe
