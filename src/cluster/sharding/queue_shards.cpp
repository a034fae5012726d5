// The queue shards a cluster-wide job service runs on this node: each one
// a local JobService over the shard's fenced log, started when placement
// gives the shard to this node, drained and stopped when placement asks it
// back or the node loses its lease, read again after a fault, and stopped
// together when the service stops. Most steps run on the keeper's thread
// (cluster_jobs_impl.hpp says which do not).

#include <algorithm>
#include <thread>

#include "cluster_jobs_impl.hpp"
#include "troupe/persist/fenced_journal.hpp"

namespace troupe::cluster::detail::jobs {

JobSettings Core::shard_settings(std::uint32_t shard, std::uint64_t epoch) {
  JobSettings s = settings;
  s.name = settings.name + "/" + std::to_string(shard);
  // The shard's log is written under the placement epoch (SPEC E9): once a
  // newer owner raised its fence, nothing this incarnation appends is
  // stored, however late it wakes up.
  s.journal = FencedJournal::open(settings.journal, Fence{"jobs/" + s.name, epoch});
  // Paused until start_shard has checked that placement still wants it
  // here (a hand-off or a fence may arrive while its log is read).
  s.start_paused = true;
  if (settings.on_outcome) {
    s.on_outcome = [fn = settings.on_outcome, shard](JobId id, const Job& j, const JobOutcome& o) {
      fn(global_id(shard, id), j, o);
    };
  }
  return s;
}

void Core::begin_hand_off(std::uint32_t shard) {
  std::lock_guard lk(mu);
  wanted.erase(shard);
  std::erase_if(serving, [&](const auto& s) { return s.first == shard; });
  auto h = hosted.find(shard);
  if (h == hosted.end() || !h->second.service) return;
  h->second.service->pause();
  h->second.drain_until = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(cluster.stop_bound);
}

void Core::fence_shard(std::uint32_t shard) {
  fenced.store(true, std::memory_order_relaxed);
  std::optional<JobService> svc;
  {
    std::lock_guard lk(mu);
    wanted.erase(shard);
    std::erase_if(serving, [&](const auto& s) { return s.first == shard; });
    if (auto h = hosted.find(shard); h != hosted.end() && h->second.service) svc = h->second.service;
  }
  if (svc) (void)svc->stop(Duration::zero());  // starts the stop; does not wait
}

void Core::unserve(std::uint32_t shard) {
  std::lock_guard lk(mu);
  std::erase_if(serving, [&](const auto& s) { return s.first == shard; });
}

void Core::rebuild_serving() {
  serving.clear();
  // Not a shard placement has asked back (being handed off or stopped).
  for (auto& [shard, h] : hosted)
    if (h.service && wanted.count(shard) && h.service->health().ok()) serving.emplace_back(shard, *h.service);
}

void Core::start_shard(std::uint32_t shard, std::uint64_t epoch) {
  {
    std::lock_guard lk(mu);
    auto w = wanted.find(shard);
    if (w == wanted.end() || w->second != epoch || stopped.load()) return;
    if (auto h = hosted.find(shard); h != hosted.end() && h->second.service) return;
  }
  auto svc = JobService::start(*system, shard_settings(shard, epoch), translator, workers);
  std::unique_lock lk(mu);
  if (auto w = wanted.find(shard); svc.ok() && (w == wanted.end() || w->second != epoch || stopped.load())) {
    // Asked back while it started: it never ran a job here.
    lk.unlock();
    (void)svc->stop(cluster.stop_bound);
    return;
  }
  fenced.store(false, std::memory_order_relaxed);  // owning shards again
  if (!svc.ok()) {
    log("queue shard " + std::to_string(shard) + " could not start: " + svc.error().to_string());
    faults.insert_or_assign(shard, shard_fault(shard, "could not start", svc.error()));
    std::weak_ptr<Core> weak = weak_from_this();
    keeper.post(
        [weak, shard, epoch] {
          if (auto c = weak.lock()) c->start_shard(shard, epoch);
        },
        cluster.restart_delay);
    return;
  }
  faults.erase(shard);
  if (!paused) svc->resume();
  hosted.insert_or_assign(shard, Hosted{epoch, std::move(svc).value(), std::nullopt});
  rebuild_serving();
}

void Core::stop_and_retire(std::uint32_t shard, JobService& svc) {
  if (auto r = svc.stop(cluster.stop_bound); !r.ok())
    log("queue shard " + std::to_string(shard) + ": " + r.error().to_string());
  std::lock_guard lk(mu);
  retire(shard, svc);
}

void Core::retire(std::uint32_t shard, JobService& svc) {
  JobStats s = svc.stats();
  add_stats(retired, s);
  for (auto& d : svc.dead_letters()) {
    d.id = global_id(shard, d.id);
    retired_dead.push_back(std::move(d));
    if (retired_dead.size() > settings.dead_letter_capacity) retired_dead.pop_front();
  }
}

void Core::stop_shard(std::uint32_t shard, std::uint64_t epoch, bool immediate) {
  std::optional<JobService> svc;
  std::optional<std::chrono::steady_clock::time_point> drain_until;
  {
    std::lock_guard lk(mu);
    faults.erase(shard);
    if (auto h = hosted.find(shard); h != hosted.end()) {
      svc = std::move(h->second.service);
      drain_until = h->second.drain_until;
      hosted.erase(h);
      rebuild_serving();
    }
  }
  if (svc) {
    if (!immediate && drain_until) {
      while (svc->stats().active > 0 && std::chrono::steady_clock::now() < *drain_until &&
             !fenced.load(std::memory_order_relaxed))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop_and_retire(shard, *svc);
  }
  {
    std::lock_guard lk(mu);
    if (auto p = pending_release.find(shard); p != pending_release.end() && p->second == epoch)
      pending_release.erase(p);
  }
  directory->released(type, shard, epoch);
}

void Core::sweep() {
  std::vector<std::pair<std::uint32_t, std::uint64_t>> again;
  {
    std::lock_guard lk(mu);
    rebuild_serving();  // a shard unserved after one refusal that came back
    for (auto& [shard, h] : hosted) {
      if (!h.service) continue;
      if (auto ok = h.service->health(); !ok.ok()) {
        faults.insert_or_assign(shard, shard_fault(shard, "stopped", ok.error()));
        again.emplace_back(shard, h.epoch);
      }
    }
  }
  for (auto [shard, epoch] : again) {
    std::optional<JobService> svc;
    {
      std::lock_guard lk(mu);
      auto h = hosted.find(shard);
      if (h == hosted.end() || !h->second.service) continue;
      svc = std::move(h->second.service);
      h->second.service.reset();
      rebuild_serving();
    }
    stop_and_retire(shard, *svc);
    log("queue shard " + std::to_string(shard) + " is read from its log again");
    start_shard(shard, epoch);
  }
}

void Core::add_stats(JobStats& to, const JobStats& s) {
  for (const auto& l : s.queued_by_priority) {
    auto it = std::find_if(to.queued_by_priority.begin(), to.queued_by_priority.end(),
                           [&](const JobQueueLevel& x) { return x.priority == l.priority; });
    if (it == to.queued_by_priority.end())
      to.queued_by_priority.push_back(l);
    else
      it->depth += l.depth;
  }
  std::sort(to.queued_by_priority.begin(), to.queued_by_priority.end(),
            [](const JobQueueLevel& a, const JobQueueLevel& b) { return a.priority > b.priority; });
  to.queued += s.queued;
  to.waiting_retry += s.waiting_retry;
  to.active += s.active;
  to.idle += s.idle;
  to.submitted += s.submitted;
  to.accepted += s.accepted;
  to.recovered += s.recovered;
  to.succeeded += s.succeeded;
  to.failed += s.failed;
  to.timed_out += s.timed_out;
  to.retried += s.retried;
  to.dead_lettered += s.dead_lettered;
  to.dead_letters_dropped += s.dead_letters_dropped;
  to.refused += s.refused;
  to.watchdog_resets += s.watchdog_resets;
  to.late_completions += s.late_completions;
  to.journal_appends += s.journal_appends;
  to.journal_failures += s.journal_failures;
}

bool Core::shutdown(Duration bound) {
  if (stopped.exchange(true, std::memory_order_acq_rel)) return true;
  (void)remoting->unpublish(type);
  keeper.stop();  // finishes the step it is in; drops the rest
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(bound);
  std::vector<std::pair<std::uint32_t, JobService>> services;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> asked_back;
  {
    std::lock_guard lk(mu);
    serving.clear();
    for (auto& [shard, h] : hosted) {
      if (h.service) services.emplace_back(shard, *h.service);
      if (!wanted.count(shard)) asked_back.emplace_back(shard, h.epoch);
    }
    for (auto& [shard, epoch] : pending_release)
      if (!hosted.count(shard)) asked_back.emplace_back(shard, epoch);
  }
  // Starts every stop at once (a zero bound does not wait), then waits.
  for (auto& [shard, svc] : services) (void)svc.stop(Duration::zero());
  bool all = true;
  for (auto& [shard, svc] : services) {
    auto left = std::max(Duration::zero(),
                         std::chrono::duration_cast<Duration>(until - std::chrono::steady_clock::now()));
    all = svc.stop(left).ok() && all;
  }
  {
    std::lock_guard lk(mu);
    for (auto& [shard, svc] : services) retire(shard, svc);
    hosted.clear();
    wanted.clear();
    pending_release.clear();
  }
  for (auto& [shard, epoch] : asked_back) directory->released(type, shard, epoch);
  directory->detach(type);
  router.stop();
  intake.stop();
  return all;
}

}  // namespace troupe::cluster::detail::jobs
