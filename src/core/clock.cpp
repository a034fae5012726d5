#include "troupe/core/clock.hpp"

#include <time.h>

#include <algorithm>

namespace troupe {

TimePoint SystemClock::now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
}

TimePoint SystemClock::coarse_now() const {
  // libstdc++'s steady_clock is CLOCK_MONOTONIC; the coarse variant reads the
  // same clock as of the last tick.
  timespec ts{};
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0) return now();
  return TimePoint{std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)};
}

WallTime SystemClock::wall_now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
}

std::shared_ptr<SystemClock> SystemClock::instance() {
  static auto clock = std::make_shared<SystemClock>();
  return clock;
}

ManualClock::ManualClock(WallTime wall_start)
    : now_(TimePoint{} + std::chrono::hours(1)), wall_offset_(wall_start.time_since_epoch() - now_.time_since_epoch()) {}

TimePoint ManualClock::now() const {
  std::lock_guard lk(mu_);
  return now_;
}

WallTime ManualClock::wall_now() const {
  std::lock_guard lk(mu_);
  return WallTime{now_.time_since_epoch() + wall_offset_};
}

void ManualClock::set_wall(WallTime t) {
  std::lock_guard lk(mu_);
  wall_offset_ = t.time_since_epoch() - now_.time_since_epoch();
}

void ManualClock::advance(Duration d) {
  std::lock_guard adv(advance_mu_);
  TimePoint target;
  {
    std::lock_guard lk(mu_);
    target = now_ + std::max(d, Duration::zero());
  }
  for (;;) {
    // Find the earliest deadline among all listeners; fire it (and anything
    // due at the same instant) with now() set to that deadline.
    std::vector<Listener*> ls;
    {
      std::lock_guard lk(mu_);
      ls = listeners_;
    }
    TimePoint next = TimePoint::max();
    for (auto* l : ls) next = std::min(next, l->next_deadline());
    if (next > target) break;
    {
      std::lock_guard lk(mu_);
      if (next > now_) now_ = next;
    }
    for (auto* l : ls) l->fire_due(next);
  }
  std::lock_guard lk(mu_);
  now_ = target;
}

TimePoint ManualClock::next_deadline() {
  std::lock_guard adv(advance_mu_);  // listeners are not removed meanwhile
  std::vector<Listener*> ls;
  {
    std::lock_guard lk(mu_);
    ls = listeners_;
  }
  TimePoint next = TimePoint::max();
  for (auto* l : ls) next = std::min(next, l->next_deadline());
  return next;
}

void ManualClock::add_listener(Listener* l) {
  std::lock_guard lk(mu_);
  listeners_.push_back(l);
}

void ManualClock::remove_listener(Listener* l) {
  std::lock_guard adv(advance_mu_);  // not while an advance is using it
  std::lock_guard lk(mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), l), listeners_.end());
}

}  // namespace troupe
