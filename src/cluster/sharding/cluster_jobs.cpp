// Durable jobs across a cluster: a local JobService per queue shard this
// node owns, a keeper thread that starts and stops them as placement says,
// and the routing of jobs to them. See include/troupe/cluster/cluster_jobs.hpp
// for the contract and doc/jobs.md ("In a cluster") for the design.
//
// This file: start_job_service, the JobService's backend over all shards,
// and the dispatch of a job to a shard of this node. queue_shards.cpp starts
// and stops the shards; job_routing.cpp sends jobs to other nodes' shards
// and takes theirs; cluster_jobs_impl.hpp holds the state they share.

#include "troupe/cluster/cluster_jobs.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster_jobs_impl.hpp"

namespace troupe::cluster {
namespace detail::jobs {

// --- a job to a shard of this node ---------------------------------------------------

std::optional<std::pair<std::uint32_t, JobService>> Core::pick_local() const {
  std::lock_guard lk(mu);
  if (serving.empty()) return std::nullopt;
  return serving[rr.fetch_add(1, std::memory_order_relaxed) % serving.size()];
}

void Core::dispatch(std::shared_ptr<Req> r) {
  if (stopped.load(std::memory_order_acquire))
    return r->fail(Error(ErrorCode::shutting_down, "job service '" + settings.name + "' is stopping"));
  auto local = pick_local();
  if (!local) {
    if (router.tell(Route{r}) != Delivery::delivered)
      r->fail(Error(ErrorCode::shutting_down, "job service '" + settings.name + "' is stopping"));
    return;
  }
  auto [shard, svc] = std::move(*local);
  ++r->tries;
  std::weak_ptr<Core> weak = weak_from_this();
  auto retry_or = [weak, r, shard](Error e) {
    auto core = weak.lock();
    // Not accepted by a shard that is going (handed off, or stopped on a
    // fault): no job goes there again, and another shard takes this one.
    if (core && not_taken(e) && !core->stopped.load(std::memory_order_acquire) &&
        r->tries < 2 * core->cluster.shard_count + 4) {
      core->unserve(shard);
      return core->dispatch(r);
    }
    r->fail(std::move(e));
  };
  if (r->want_outcome) {
    // Not re-sent: a shard that stops answers its accepted jobs
    // shutting_down too (they run on its next owner), and a submit's
    // answer cannot tell those from a refusal.
    svc.submit(r->job, r->priority, r->timeout).then([r, weak, shard](Result<JobOutcome> o) mutable {
      if (o.ok()) return r->outcome->set_value(std::move(o).value());
      if (auto core = weak.lock(); core && not_taken(o.error())) core->unserve(shard);
      r->outcome->set_error(std::move(o).error());
    });
  } else {
    svc.enqueue(r->job, r->priority, r->timeout).then([r, shard, retry_or](Result<JobId> id) mutable {
      if (id.ok()) return r->accepted->set_value(global_id(shard, id.value()));
      retry_or(std::move(id).error());
    });
  }
}

}  // namespace detail::jobs

namespace {

using detail::job_wire_codecs;
using detail::RemoteJob;
using detail::jobs::Core;
using detail::jobs::global_id;
using detail::jobs::Intake;
using detail::jobs::kMaxShards;
using detail::jobs::NodeGone;
using detail::jobs::Req;
using detail::jobs::Router;
using detail::jobs::shard_fault;

// --- the JobService's backend -------------------------------------------------------

class Backend final : public troupe::detail::JobBackend {
 public:
  explicit Backend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  Future<JobOutcome> submit(Job job, int priority, std::optional<Duration> timeout) override {
    auto r = make(std::move(job), priority, timeout, true);
    Future<JobOutcome> f = r->outcome->future();
    core_->dispatch(std::move(r));
    return f;
  }
  Future<JobId> enqueue(Job job, int priority, std::optional<Duration> timeout) override {
    auto r = make(std::move(job), priority, timeout, false);
    Future<JobId> f = r->accepted->future();
    core_->dispatch(std::move(r));
    return f;
  }
  void pause() override { set_paused(true); }
  void resume() override { set_paused(false); }

  JobStats stats() const override {
    std::lock_guard lk(core_->mu);
    JobStats s = core_->retired;
    // Counters of a stopped service stay; what is queued or running now is
    // only the running services'.
    s.queued_by_priority.clear();
    s.queued = s.waiting_retry = s.active = s.idle = 0;
    for (auto& [shard, h] : core_->hosted)
      if (h.service) Core::add_stats(s, h.service->stats());
    return s;
  }
  std::vector<JobDeadLetter> dead_letters() const override {
    std::lock_guard lk(core_->mu);
    std::vector<JobDeadLetter> out(core_->retired_dead.begin(), core_->retired_dead.end());
    for (auto& [shard, h] : core_->hosted)
      if (h.service)
        for (auto& d : h.service->dead_letters()) {
          d.id = global_id(shard, d.id);
          out.push_back(std::move(d));
        }
    return out;
  }
  Result<void> stop(Duration bound) override {
    if (core_->shutdown(bound)) return {};
    return Error(ErrorCode::timeout,
                 "job service '" + core_->settings.name + "': a queue shard still running after " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(bound).count()) +
                     " ms");
  }
  Result<void> health() const override {
    std::lock_guard lk(core_->mu);
    if (!core_->faults.empty()) return core_->faults.begin()->second;
    for (auto& [shard, h] : core_->hosted) {
      if (!h.service) continue;
      if (auto ok = h.service->health(); !ok.ok()) return shard_fault(shard, "stopped", ok.error());
    }
    return {};
  }
  const JobSettings& settings() const noexcept override { return core_->settings; }

 private:
  static std::shared_ptr<Req> make(Job job, int priority, std::optional<Duration> timeout,
                                   bool want_outcome) {
    auto r = std::make_shared<Req>();
    r->job = std::move(job);
    r->priority = priority;
    r->timeout = timeout;
    r->want_outcome = want_outcome;
    if (want_outcome)
      r->outcome.emplace();
    else
      r->accepted.emplace();
    return r;
  }
  void set_paused(bool p) {
    std::lock_guard lk(core_->mu);
    core_->paused = p;
    // Not the shards being handed off or stopped: they stay paused.
    for (auto& [shard, h] : core_->hosted)
      if (h.service && !h.drain_until && core_->wanted.count(shard))
        p ? h.service->pause() : h.service->resume();
  }

  std::shared_ptr<Core> core_;
};

}  // namespace

Result<JobService> start_job_service(ActorSystem& system, Remoting& remoting, ShardDirectory& directory,
                                     JobSettings settings, JobTranslator translator, JobWorkers workers,
                                     ClusterJobSettings cluster) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "job service '" + settings.name + "': " + what);
  };
  if (auto ok = troupe::detail::check_job_settings(settings, translator, workers); !ok.ok())
    return std::move(ok).error();
  if (!settings.journal)
    return bad(
        "a cluster-wide job service needs the cluster's journal (settings.journal); without one, "
        "use JobService::start on each node");
  if (cluster.shard_count == 0 || cluster.shard_count > kMaxShards)
    return bad("shard_count must be 1.." + std::to_string(kMaxShards));
  if (cluster.route_timeout <= Duration::zero()) return bad("route_timeout must be positive");
  if (cluster.stop_bound <= Duration::zero()) return bad("stop_bound must be positive");
  if (cluster.restart_delay <= Duration::zero()) return bad("restart_delay must be positive");

  auto core = std::make_shared<Core>();
  core->system = &system;
  core->remoting = &remoting;
  core->directory = &directory;
  core->settings = std::move(settings);
  core->translator = std::move(translator);
  core->workers = std::move(workers);
  core->cluster = cluster;
  core->type = job_queue_type(core->settings.name);
  core->self = directory.self();
  core->codecs = std::make_shared<const MessageCodecs<RemoteJob>>(job_wire_codecs());
  core->paused = core->settings.start_paused;
  std::weak_ptr<Core> weak = core;

  core->router = system.spawn<Router>(SpawnOptions{.name = core->type + "-router"}, weak);
  core->intake = system.spawn<Intake>(SpawnOptions{.name = core->type + "-intake"}, weak);
  if (!core->router || !core->intake) {
    core->router.stop();
    core->intake.stop();
    return Error(ErrorCode::shutting_down,
                 "job service '" + core->settings.name + "': the actor system is shutting down");
  }
  if (auto r = remoting.publish<RemoteJob>(core->type, core->intake, job_wire_codecs()); !r.ok()) {
    core->router.stop();
    core->intake.stop();
    return bad("a job service of this name runs on this node already (" + r.error().message() + ")");
  }
  core->keeper.start(
      [weak] {
        if (auto c = weak.lock()) c->sweep();
      },
      core->cluster.restart_delay);

  ShardDirectory::Host host;
  host.start = [weak](std::uint32_t shard, std::uint64_t epoch) {
    auto c = weak.lock();
    if (!c) return;
    {
      std::lock_guard lk(c->mu);
      c->wanted.insert_or_assign(shard, epoch);
    }
    c->keeper.post([weak, shard, epoch] {
      if (auto c2 = weak.lock()) c2->start_shard(shard, epoch);
    });
  };
  host.stop = [weak](std::uint32_t shard, std::uint64_t epoch, bool immediate) {
    auto c = weak.lock();
    if (!c) return;
    {
      std::lock_guard lk(c->mu);
      c->pending_release.insert_or_assign(shard, epoch);
    }
    if (immediate)
      c->fence_shard(shard);
    else
      c->begin_hand_off(shard);
    c->keeper.post([weak, shard, epoch, immediate] {
      if (auto c2 = weak.lock()) c2->stop_shard(shard, epoch, immediate);
    });
  };
  host.node_left = [weak](std::string_view node) {
    // Placement moves the node's shards by itself; the router stops sending
    // to it.
    if (auto c = weak.lock()) (void)c->router.tell(NodeGone{std::string(node)});
  };
  host.roles = cluster.roles;
  if (auto r = directory.attach(core->type, cluster.shard_count, std::move(host)); !r.ok()) {
    core->keeper.stop();
    (void)remoting.unpublish(core->type);
    core->router.stop();
    core->intake.stop();
    return std::move(r).error();
  }
  // Every shard gets an owner now, so each one's log has a node that runs
  // it (a shard nobody located would otherwise wait for its first job).
  for (std::uint32_t s = 0; s < cluster.shard_count; ++s)
    directory.locate(core->type, s, [](Result<ShardDirectory::Location>) {});
  (void)system.add_shutdown_hook([weak] {
    if (auto c = weak.lock()) (void)c->shutdown(c->cluster.stop_bound);
  });
  return troupe::detail::make_job_service(std::make_shared<Backend>(std::move(core)));
}

}  // namespace troupe::cluster
