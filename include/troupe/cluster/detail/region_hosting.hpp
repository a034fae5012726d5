#pragma once
// The shards a region runs on this node (sharding.hpp): opening a shard's
// registry under its placement fence (SPEC E9), the graceful or immediate
// stop of a hand-off (E6) and its release to the directory, the region's
// stop, and the stats and processing episodes of the hosted shards.
// Members of RegionCore (region_core.hpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/cluster/detail/region_core.hpp"
#include "troupe/cluster/detail/region_routing.hpp"
#include "troupe/persist/entity.hpp"
#include "troupe/persist/fenced_journal.hpp"

namespace troupe::cluster::detail {

// Builds a region, publishes its inbox and attaches it to the directory
// (ShardRegion::start).
template <class B, class Core = RegionCore<B>>
Result<std::shared_ptr<Core>> open_region(ActorSystem& system, std::shared_ptr<Journal> journal, Remoting& remoting,
                                          ShardDirectory& directory, ShardRegionSettings settings,
                                          EventCodecs<typename Core::Event> event_codecs,
                                          MessageCodecs<typename Core::Command> codecs, typename Core::Factory factory,
                                          std::optional<StateCodec<typename Core::State>> snapshots) {
  const std::string type = settings.entity.type_name;
  if (auto ok = check_region(settings, {.message_codecs = !codecs.empty(),
                                        .journal = journal != nullptr,
                                        .event_codecs = !event_codecs.empty(),
                                        .state_codec = snapshots.has_value(),
                                        .can_build_behaviour = factory || std::is_default_constructible_v<B>});
      !ok.ok()) {
    return std::move(ok).error();
  }

  auto core = std::make_shared<Core>();
  core->system = &system;
  core->journal = std::move(journal);
  core->remoting = &remoting;
  core->directory = &directory;
  core->settings = std::move(settings);
  core->event_codecs = std::move(event_codecs);
  core->codecs = std::move(codecs);
  core->factory = std::move(factory);
  core->snapshots = std::move(snapshots);
  core->inbox_name = "region/" + type;
  core->shards = std::make_unique<typename Core::Shard[]>(core->settings.shard_count);

  auto published = remoting.add_inbox(core->inbox_name, std::make_shared<RegionInbox<B>>(core));
  if (!published.ok()) return std::move(published).error();
  std::weak_ptr<Core> w = core;
  ShardDirectory::Host host;
  host.start = [w](std::uint32_t s, std::uint64_t e) {
    if (auto c = w.lock()) c->start_shard(s, e);
  };
  host.stop = [w](std::uint32_t s, std::uint64_t e, bool immediate) {
    if (auto c = w.lock()) c->stop_shard(s, e, immediate);
  };
  host.node_left = [w](std::string_view n) {
    if (auto c = w.lock()) c->node_left(n);
  };
  host.roles = core->settings.roles;
  auto attached = directory.attach(type, core->settings.shard_count, std::move(host));
  if (!attached.ok()) {
    (void)remoting.unpublish(core->inbox_name);
    return std::move(attached).error();
  }
  return core;
}

template <class B>
Result<void> RegionCore<B>::stop(Duration bound) {
  stop_all();
  Duration b = bound;
  if (b <= Duration::zero())
    b = settings.entity.stop_timeout > Duration::zero() ? settings.entity.stop_timeout : std::chrono::seconds(31);
  auto until = std::chrono::steady_clock::now() + b;
  while (!all_stopped()) {
    if (std::chrono::steady_clock::now() >= until) {
      return Error(ErrorCode::timeout, "entity type '" + settings.entity.type_name + "': shards still stopping after " +
                                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(b).count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  directory->detach(settings.entity.type_name);
  (void)remoting->unpublish(inbox_name);
  return {};
}

template <class B>
void RegionCore<B>::start_shard(std::uint32_t s, std::uint64_t epoch) {
  if (s >= settings.shard_count) return;
  Shard& sh = shards[s];
  std::lock_guard lk(sh.mu);
  if (sh.phase == Phase::local) {
    sh.epoch = epoch;
    return;
  }
  if (sh.phase == Phase::stopping) {
    // Stopped and restarted here before the old registry finished: the
    // start goes on when it has (see retire()).
    sh.epoch = epoch;
    sh.restart_epoch = epoch;
    return;
  }
  open_host(sh, s, epoch);
}

template <class B>
void RegionCore<B>::open_host(Shard& sh, std::uint32_t s, std::uint64_t epoch) {
  EntitySettings es = settings.entity;
  es.shards = 1;
  // The shard's entities write under its placement epoch (SPEC E9): once a
  // newer owner has raised the shard's fence, nothing they append is
  // stored, however late this node wakes up. A directory without epochs
  // (0) leaves the journal's primary key as the only guard (E7).
  std::shared_ptr<Journal> writes =
      epoch == 0 ? journal
                 : std::shared_ptr<Journal>(FencedJournal::open(journal, shard_fence(settings.entity.type_name, s, epoch)));
  auto reg = EntityRegistry<B>::start(*system, writes, es, event_codecs, factory, snapshots);
  if (!reg.ok()) {
    // Only shutting_down can happen here (settings were checked at start).
    sh.phase = Phase::unknown;
    auto waiting = take_buffer(sh);
    for (auto& p : waiting) refuse(p.cmd, reg.error());
    return;
  }
  sh.host.emplace(std::move(reg.value()));
  sh.phase = Phase::local;
  sh.relocate_delay = Duration::zero();
  sh.owner = directory->self();
  sh.epoch = epoch;
  hosted.fetch_add(1, std::memory_order_relaxed);
  started.fetch_add(1, std::memory_order_relaxed);
  flush(sh, s);
}

template <class B>
void RegionCore<B>::stop_shard(std::uint32_t s, std::uint64_t epoch, bool immediate) {
  if (s >= settings.shard_count) return;
  Shard& sh = shards[s];
  std::unique_lock lk(sh.mu);
  if (sh.phase == Phase::stopping) {
    // Already stopping gracefully: a fence makes it immediate.
    if (immediate && sh.host) {
      EntityRegistry<B> reg = *sh.host;
      lk.unlock();
      reg.begin_immediate_stop();
    }
    return;
  }
  if (sh.phase != Phase::local) {
    // Not running here: nothing to hand off. What waited for it to start
    // here goes to wherever it is now.
    bool relocate = sh.phase == Phase::waiting && !sh.buffer.empty() && !stopping.load(std::memory_order_acquire);
    if (sh.phase == Phase::waiting) sh.phase = relocate ? Phase::locating : Phase::unknown;
    lk.unlock();
    directory->released(settings.entity.type_name, s, epoch);
    if (relocate) locate(s);
    return;
  }
  sh.phase = Phase::stopping;
  EntityRegistry<B> reg = *sh.host;
  lk.unlock();
  if (immediate) {
    reg.begin_immediate_stop();
  } else {
    reg.begin_stop();
  }
  std::weak_ptr<RegionCore> w = this->shared_from_this();
  reg.when_stopped([w, s, epoch] {
    if (auto c = w.lock()) c->retire(s, epoch);
  });
}

// The shard's entities have all stopped after stop_shard().
template <class B>
void RegionCore<B>::retire(std::uint32_t s, std::uint64_t epoch) {
  Shard& sh = shards[s];
  std::unique_lock lk(sh.mu);
  if (sh.host) {
    add_retired(sh.host->stats());
    // Its entities have stopped: its shutdown hook has nothing left to do,
    // and hooks of retired registries would pile up over many hand-offs.
    sh.host->abandon();
    sh.host.reset();
    hosted.fetch_sub(1, std::memory_order_relaxed);
  }
  handed_off.fetch_add(1, std::memory_order_relaxed);
  if (sh.restart_epoch && !stopping.load(std::memory_order_acquire)) {
    std::uint64_t e = *sh.restart_epoch;
    sh.restart_epoch.reset();
    lk.unlock();
    // The old incarnation is released first, then this node opens the
    // shard again at its new epoch.
    directory->released(settings.entity.type_name, s, epoch);
    lk.lock();
    if (sh.phase == Phase::stopping) open_host(sh, s, e);
    return;
  }
  sh.restart_epoch.reset();
  sh.phase = Phase::unknown;
  // Handed off: the new owner is looked up at once, whether or not
  // something waits, so that what still reaches this node for the shard
  // (from other nodes that have not heard yet) is forwarded to it without
  // asking placement again, which may be gone by then.
  bool relocate = !stopping.load(std::memory_order_acquire);
  if (relocate) sh.phase = Phase::locating;
  lk.unlock();
  directory->released(settings.entity.type_name, s, epoch);
  if (relocate) locate(s);
}

// Stops every shard hosted here (node leaving or region stopping) and
// waits, up to `bound`, for their entities. Later commands are refused.
template <class B>
void RegionCore<B>::stop_all() {
  stopping.store(true, std::memory_order_release);
  for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
    Shard& sh = shards[s];
    std::unique_lock lk(sh.mu);
    auto waiting = take_buffer(sh);
    bool local = sh.phase == Phase::local;
    std::uint64_t epoch = sh.epoch;
    lk.unlock();
    for (auto& p : waiting)
      refuse(p.cmd, region_stopping_error(settings.entity.type_name, directory->self()));
    if (local) stop_shard(s, epoch, false);
  }
}

template <class B>
bool RegionCore<B>::all_stopped() {
  for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
    std::lock_guard lk(shards[s].mu);
    if (shards[s].phase == Phase::local || shards[s].phase == Phase::stopping) return false;
  }
  return true;
}

template <class B>
void RegionCore<B>::add_retired(const EntityStats& e) {
  std::lock_guard lk(retired_mu);
  add_entity_stats(retired, e);
}

template <class B>
ShardRegionStats RegionCore<B>::stats() {
  ShardRegionStats st;
  st.shards_hosted = hosted.load();
  st.shards_started = started.load();
  st.shards_handed_off = handed_off.load();
  st.buffered = buffered.load();
  st.sent_remote = sent_remote.load();
  st.received_remote = received_remote.load();
  st.forwarded = forwarded.load();
  st.refused = refused.load();
  st.resent = resent.load();
  {
    std::lock_guard lk(retired_mu);
    st.entities = retired;
    st.entities.active = 0;
  }
  for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
    std::lock_guard lk(shards[s].mu);
    if (shards[s].host) add_entity_stats(st.entities, shards[s].host->stats());
  }
  return st;
}

// Entities of the shards hosted here in a processing episode, the
// longest first; `id` alone when given.
template <class B>
std::vector<ProcessingEntity> RegionCore<B>::processing(std::size_t limit) {
  std::vector<ProcessingEntity> all;
  for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
    std::lock_guard lk(shards[s].mu);
    if (!shards[s].host) continue;
    auto part = shards[s].host->processing(limit);
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  auto by_age = [](const ProcessingEntity& a, const ProcessingEntity& b) {
    return a.since_ms != b.since_ms ? a.since_ms < b.since_ms : a.id < b.id;
  };
  std::sort(all.begin(), all.end(), by_age);
  if (all.size() > limit) all.resize(limit);
  return all;
}

template <class B>
std::optional<ProcessingEntity> RegionCore<B>::processing_of(const std::string& id) {
  std::uint32_t s = cluster::shard_of(id, settings.shard_count);
  std::lock_guard lk(shards[s].mu);
  if (!shards[s].host) return std::nullopt;
  return shards[s].host->processing_of(id);
}

template <class B>
std::size_t RegionCore<B>::processing_count() {
  std::size_t n = 0;
  for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
    std::lock_guard lk(shards[s].mu);
    if (shards[s].host) n += shards[s].host->processing_count();
  }
  return n;
}

}  // namespace troupe::cluster::detail
