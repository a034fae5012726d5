#pragma once
// How a shard region finds a shard's owner (sharding.hpp): it asks the
// directory, waits in the shard's buffer meanwhile, sends what waited once
// the owner is known, and locates again, after a growing pause, when the
// owner it knew is gone. Members of RegionCore (region_core.hpp).

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

#include "troupe/cluster/detail/region_core.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/detail/timer_service.hpp"

namespace troupe::cluster::detail {

// The owner we knew is gone from the address book (it left or died,
// possibly before its shards moved when we located this one); with sh.mu
// held. What waits, and what comes next, stays in the buffer until the
// directory names an owner that can be reached. Asking it again at once
// would most likely name the same node, so the next locate waits a
// little, longer each time.
template <class B>
void RegionCore<B>::owner_gone(Shard& sh, std::uint32_t s) {
  sh.owner.clear();
  locate_later(sh, s);
}

template <class B>
class RegionCore<B>::RelocateTimer final : public troupe::detail::TimerService::Node {
 public:
  RelocateTimer(std::weak_ptr<RegionCore> core, std::uint32_t s) : core_(std::move(core)), shard_(s) {}

 private:
  void fire() noexcept override {
    if (auto c = core_.lock()) c->relocate(shard_);
  }
  std::weak_ptr<RegionCore> core_;
  std::uint32_t shard_;
};

// Arms the shard's relocate timer after a growing pause (once); false if
// the actor system no longer runs timers. With sh.mu held.
template <class B>
bool RegionCore<B>::arm_relocate(Shard& sh, std::uint32_t s) {
  if (sh.relocate_armed) return true;
  sh.relocate_delay = sh.relocate_delay == Duration::zero() ? kFirstRelocatePause
                                                            : std::min<Duration>(2 * sh.relocate_delay, kMaxRelocatePause);
  auto& timers = troupe::detail::timers_of(system->impl());
  auto* t = new RelocateTimer(this->weak_from_this(), s);
  bool armed = timers.schedule(t, deadline_after(timers.clock().now(), sh.relocate_delay));
  t->release();
  sh.relocate_armed = armed;
  return armed;
}

// Locates the shard again after a growing pause; with sh.mu held.
template <class B>
void RegionCore<B>::locate_later(Shard& sh, std::uint32_t s) {
  sh.phase = Phase::locating;
  if (arm_relocate(sh, s)) return;
  // The actor system is shutting down: no timer fires any more.
  sh.phase = Phase::unknown;
  auto waiting = take_buffer(sh);
  for (auto& p : waiting)
    refuse(p.cmd, region_system_stopping_error(directory->self()));
}

template <class B>
void RegionCore<B>::relocate(std::uint32_t s) {
  Shard& sh = shards[s];
  {
    std::lock_guard lk(sh.mu);
    sh.relocate_armed = false;
    // Still waiting for a start that placement promised: looked up again,
    // in case the shard moved on before it started here.
    if (sh.phase == Phase::waiting) sh.phase = Phase::locating;
    if (sh.phase != Phase::locating) return;
  }
  locate(s);
}

template <class B>
void RegionCore<B>::locate(std::uint32_t s) {
  std::weak_ptr<RegionCore> w = this->shared_from_this();
  directory->locate(settings.entity.type_name, s, [w, s](Result<ShardDirectory::Location> loc) {
    if (auto c = w.lock()) c->located(s, std::move(loc));
  });
}

template <class B>
void RegionCore<B>::located(std::uint32_t s, Result<ShardDirectory::Location> loc) {
  Shard& sh = shards[s];
  std::unique_lock lk(sh.mu);
  if (sh.phase != Phase::locating) return;  // started meanwhile
  if (!loc.ok()) {
    sh.phase = Phase::unknown;
    auto waiting = take_buffer(sh);
    lk.unlock();
    for (auto& p : waiting) refuse(p.cmd, loc.error());
    return;
  }
  if (loc.value().owner == directory->self()) {
    // Ours, but start() has not come yet (a hand-off in progress, or the
    // directory's start is on its way): wait for it, and look again now
    // and then, should it move on before it starts here (a draining node
    // passes on what is placed on it).
    sh.phase = Phase::waiting;
    sh.epoch = loc.value().epoch;
    (void)arm_relocate(sh, s);
    return;
  }
  sh.phase = Phase::remote;
  sh.owner = loc.value().owner;
  sh.epoch = loc.value().epoch;
  flush(sh, s);
}

// Empties the shard's buffer into the caller's hands; with sh.mu held.
template <class B>
auto RegionCore<B>::take_buffer(Shard& sh) -> std::deque<Pending> {
  std::deque<Pending> out;
  out.swap(sh.buffer);
  buffered.fetch_sub(out.size(), std::memory_order_relaxed);
  return out;
}

// Sends what waited, in order; with sh.mu held and a phase of local or
// remote. Should the owner turn out gone on the way (a send finds it
// removed from the address book), the rest waits for the next one.
template <class B>
void RegionCore<B>::flush(Shard& sh, std::uint32_t s) {
  auto waiting = take_buffer(sh);
  for (auto& p : waiting) {
    // A re-sent ask whose asker gave up while it waited: nobody to answer.
    if (p.resent && !reply_pending(p.cmd)) continue;
    troupe::detail::BorrowedTraceScope scope(p.trace);
    if (sh.phase == Phase::local) {
      deliver_local(sh, std::move(p.id), std::move(p.cmd));
    } else if (sh.phase == Phase::remote) {
      send_remote(sh, s, std::move(p.id), std::move(p.cmd), p.hops);
    } else {
      (void)hold(sh, std::move(p.id), std::move(p.cmd), p.hops, p.resent);
    }
  }
}

template <class B>
void RegionCore<B>::node_left(std::string_view node) {
  for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
    Shard& sh = shards[s];
    std::unique_lock lk(sh.mu);
    if (sh.phase == Phase::remote && sh.owner == node) {
      sh.phase = Phase::unknown;
      sh.owner.clear();
    }
  }
}

}  // namespace troupe::cluster::detail
