// What the node watches and shows: the entity types, locks, process
// managers and job services an application registers (start_jobs starts a
// job service on the node's journal and watches it; start_outbox its outbox
// dispatcher), their health checks,
// and the rates, latency and counters the dashboard plots.


#include "node_impl.hpp"
#include "troupe/cluster/cluster_jobs.hpp"

namespace troupe::node {

void Node::add_entity_type(EntityTypeView view) {
  std::lock_guard lk(impl_->mu);
  impl_->types.push_back(std::move(view));
}

void Node::watch_lock(std::string name, KeyedLock lock) {
  std::lock_guard lk(impl_->mu);
  impl_->locks.emplace_back(std::move(name), std::move(lock));
}
void Node::watch_process_manager(std::string name, std::function<ProcessStats()> stats) {
  std::lock_guard lk(impl_->mu);
  impl_->managers.emplace_back(std::move(name), std::move(stats));
}
void Node::watch_jobs(std::string name, JobService jobs) {
  watch_health("jobs/" + name, [jobs] { return jobs.health(); });
  std::lock_guard lk(impl_->mu);
  impl_->jobs.emplace_back(std::move(name), std::move(jobs));
}
Result<OutboxDispatcher> Node::start_outbox(OutboxHandlers handlers, OutboxSettings settings) {
  {
    std::lock_guard lk(impl_->mu);
    if (impl_->outbox) return Error(ErrorCode::invalid_argument, "the node runs an outbox dispatcher already");
  }
  if (settings.owner.empty()) settings.owner = config_.id;
  auto d = OutboxDispatcher::start(*system_, journal_, std::move(settings), std::move(handlers));
  if (!d) return std::move(d).error();
  std::lock_guard lk(impl_->mu);
  impl_->outbox = *d;
  return d;
}

void Node::watch_health(std::string service, std::function<Result<void>()> check) {
  std::lock_guard lk(impl_->mu);
  for (auto& [name, existing] : impl_->health_checks) {
    if (name == service) {
      existing = std::move(check);
      return;
    }
  }
  impl_->health_checks.emplace_back(std::move(service), std::move(check));
}

std::vector<std::pair<std::string, Result<void>>> Node::Impl::check_health() const {
  std::vector<std::pair<std::string, std::function<Result<void>()>>> checks;
  {
    std::lock_guard lk(mu);
    checks = health_checks;
  }
  std::vector<std::pair<std::string, Result<void>>> out;
  out.reserve(checks.size());
  for (auto& [name, check] : checks) {
    try {
      out.emplace_back(name, check());
    } catch (...) {
      out.emplace_back(name, Error::from_exception(std::current_exception(), "its health check threw"));
    }
  }
  // A projection that stopped on a failure is down until restarted, with
  // where it stopped (it never skips the event).
  for (const auto& s : projection_statuses()) {
    if (s.state != ProjectionState::failed || !s.failure) {
      out.emplace_back("projection/" + s.key, Result<void>{});
      continue;
    }
    const ProjectionFailure& f = *s.failure;
    out.emplace_back("projection/" + s.key,
                     Error(f.error.code(), "stopped at " + f.persistence_id + " seq " + std::to_string(f.seq) +
                                               " (offset " + f.offset.to_string() + ") after " +
                                               std::to_string(f.attempts) + " tries: " + f.error.message()));
  }
  return out;
}

nlohmann::json Node::health() const {
  bool up = true;
  json services = json::object();
  for (const auto& [name, r] : impl_->check_health()) {
    if (r.ok()) {
      services[name] = {{"up", true}};
      continue;
    }
    up = false;
    services[name] = {{"up", false}, {"code", std::string(to_string(r.error().code()))}, {"message", r.error().message()}};
  }
  return {{"status", up ? "ok" : "unhealthy"}, {"node", config_.id}, {"services", services}};
}

Result<JobService> Node::start_jobs(JobSettings settings, JobTranslator translator, JobWorkers workers) {
  if (settings.journal && settings.journal != journal_)
    return Error(ErrorCode::invalid_argument,
                 "job service '" + settings.name +
                     "': settings.journal: start_jobs runs the service on the node's journal; leave it empty");
  settings.journal = journal_;
  std::string name = settings.name;
  Result<JobService> started = [&]() -> Result<JobService> {
    if (!cluster_) return JobService::start(*system_, std::move(settings), std::move(translator), std::move(workers));
    cluster::ClusterJobSettings cs;
    cs.shard_count = config_.jobs.shard_count;
    return cluster::start_job_service(*system_, cluster_->remoting(), cluster_->directory(), std::move(settings),
                                      std::move(translator), std::move(workers), cs);
  }();
  if (!started.ok()) return started;
  if (cluster_) {
    // Runs in drain() after the cluster's leave, which has handed the
    // queue shards off: this stops the rest (routing, the keeper thread)
    // while the directory and remoting it uses still exist. The node
    // destroys the cluster before it shuts the actor system down, so the
    // service's own shutdown hook would come too late.
    stoppers_.push_back([service = *started] { (void)service.stop(); });
    // The first node up placed every queue shard on itself: a node that
    // joins takes its share now, so each node runs its own shards and
    // enqueues without a network hop. A moved shard is handed off (its
    // running jobs finish first, the rest wait in its log).
    const std::string type = cluster::job_queue_type(name);
    {
      std::lock_guard lk(impl_->mu);
      impl_->job_queues.push_back(type);
    }
    // While a rolling update runs two app versions it waits (the new
    // members get what is placed or handed off meanwhile); the node that
    // joins last, when one version remains, balances them.
    auto moved = cluster_->coordinator().rebalance(cluster::detail::shard_group(type));
    std::move(moved).then([type](Result<cluster::RebalanceReport> r) {
      if (!r.ok())
        log::warn(log::Component::node, "balancing the queue shards failed",
                  {{"queue", type}, {"error", r.error().to_string()}});
      else if (r->outcome == cluster::RebalanceOutcome::versions_mixed)
        log::info(log::Component::node, "the queue shards stay where they are until one app version remains",
                  {{"queue", type}, {"reason", r->waiting_reason()}});
    });
  }
  watch_jobs(name, *started);
  return started;
}
void Node::add_rate(std::string name, std::function<std::uint64_t()> total) {
  std::lock_guard lk(impl_->mu);
  impl_->rates.emplace_back(std::move(name), std::move(total));
}
void Node::set_latency(std::string name, std::shared_ptr<Histogram> histogram) {
  std::lock_guard lk(impl_->mu);
  impl_->latency_name = std::move(name);
  impl_->latency = std::move(histogram);
  impl_->last_latency.clear();
}
void Node::add_counter(std::string name, std::function<std::uint64_t()> value) {
  std::lock_guard lk(impl_->mu);
  impl_->counters.emplace_back(std::move(name), std::move(value));
}

}  // namespace troupe::node
