// The remote path of a cluster-wide job service: the Router sends jobs to
// queue shards on other nodes when this node serves none (locating owners,
// retrying after a move), and the Intake takes the jobs other nodes send to
// this node's shards.

#include <algorithm>
#include <climits>

#include "cluster_jobs_impl.hpp"

namespace troupe::cluster::detail::jobs {

void Router::receive(RouterMsg& m) {
  auto core = core_.lock();
  if (!core) return;
  if (owners_.empty()) {
    owners_.resize(core->cluster.shard_count);
    locating_.resize(core->cluster.shard_count, false);
  }
  match(
      m, [&](Route& r) { route(std::move(r.req)); },
      [&](Located& l) {
        locating_[l.shard] = false;
        owners_[l.shard] = l.owner;
        auto w = waiting_.find(l.shard);
        if (w == waiting_.end()) return;
        auto reqs = std::move(w->second);
        waiting_.erase(w);
        for (auto& r : reqs) {
          if (l.owner.empty() || l.owner == core->self)
            later(std::move(r));
          else
            send(l.shard, l.owner, std::move(r));
        }
      },
      [&](Moved& mv) {
        if (owners_[mv.shard] == mv.owner) owners_[mv.shard].clear();
        later(std::move(mv.req));
      },
      [&](NodeGone& g) {
        for (auto& o : owners_)
          if (o == g.node) o.clear();
      });
}

void Router::on_stop() {
  for (auto& [shard, reqs] : waiting_)
    for (auto& r : reqs) r->fail(Error(ErrorCode::shutting_down, "the job service has stopped"));
  waiting_.clear();
  keep_.reset();
}

void Router::later(std::shared_ptr<Req> r) {
  auto core = core_.lock();
  if (!core) return;
  if (r->give_up && now() + kRetryDelay >= *r->give_up) {
    return r->fail(Error(
        ErrorCode::timeout,
        "job service '" + core->settings.name + "': no queue shard took the job within " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(core->cluster.route_timeout).count()) +
            " ms (shards moving, or no node serves one)"));
  }
  std::string key = "retry-" + std::to_string(++next_key_);
  start_timer(std::move(key), kRetryDelay, Route{std::move(r)});
}

void Router::route(std::shared_ptr<Req> r) {
  auto core = core_.lock();
  if (!core) return;
  if (!r->give_up) r->give_up = deadline_after(now(), core->cluster.route_timeout);
  if (core->stopped.load(std::memory_order_acquire))
    return r->fail(Error(ErrorCode::shutting_down, "job service '" + core->settings.name + "' is stopping"));
  // A shard of this node may have started meanwhile.
  if (core->pick_local()) return core->dispatch(std::move(r));
  const std::uint32_t n = core->cluster.shard_count;
  for (std::uint32_t k = 0; k < n; ++k) {
    std::uint32_t shard = (next_ + k) % n;
    const std::string& owner = owners_[shard];
    if (owner.empty() || owner == core->self) continue;
    next_ = shard + 1;
    return send(shard, owner, std::move(r));
  }
  // No known owner elsewhere: ask placement for the next shard (it
  // allocates one that has no owner).
  std::uint32_t shard = next_++ % n;
  waiting_[shard].push_back(std::move(r));
  if (locating_[shard]) return;
  locating_[shard] = true;
  core->directory->locate(core->type, shard, [self = self(), shard](Result<ShardDirectory::Location> loc) {
    (void)self.tell(Located{shard, loc.ok() ? loc.value().owner : std::string()});
  });
}

void Router::send(std::uint32_t shard, const std::string& owner, std::shared_ptr<Req> r) {
  auto core = core_.lock();
  if (!core) return;
  ++r->tries;
  Duration remaining = *r->give_up - now();
  if (remaining <= Duration::zero()) remaining = kRetryDelay;
  if (r->want_outcome) {
    // A submit is answered with the outcome: every attempt's timeout and
    // back-off on top of the routing time.
    const JobSettings& js = core->settings;
    const Duration attempt = r->timeout.value_or(js.default_timeout);
    remaining += attempt * js.max_attempts + js.backoff_max * (js.max_attempts - 1);
  }
  auto ref = core->remoting->remote<RemoteJob>(owner, core->type, core->codecs);
  Future<RemoteAnswer> f = ref.template ask<RemoteAnswer>(
      [&](ReplyTo<RemoteAnswer> rt) {
        RemoteJob m;
        m.shard = shard;
        m.want_outcome = r->want_outcome;
        m.job = r->job;
        m.priority = r->priority;
        m.timeout_ns = r->timeout ? r->timeout->count() : 0;
        m.reply_to = std::move(rt);
        return m;
      },
      remaining);
  // Complete already: the send failed, so the owner never saw the job (it
  // left the address book, most likely having handed its shards off). The
  // job goes to the shard's next owner, as a moved shard's does.
  const bool unsent = f.ready();
  std::move(f).then([self = self(), r, shard, owner, unsent](Result<RemoteAnswer> a) {
    if (!a.ok() && unsent && a.error().code() == ErrorCode::unreachable) {
      if (self.tell(Moved{shard, owner, r}) != Delivery::delivered) r->fail(std::move(a).error());
      return;
    }
    if (!a.ok()) return r->fail(std::move(a).error());
    RemoteAnswer& ans = a.value();
    switch (ans.kind) {
      case RemoteAnswer::accepted:
        if (r->want_outcome)
          return r->fail(Error(ErrorCode::protocol_error, "an acceptance answered a submit"));
        return r->accepted->set_value(ans.id);
      case RemoteAnswer::finished:
        if (!r->want_outcome)
          return r->fail(Error(ErrorCode::protocol_error, "an outcome answered an enqueue"));
        return r->outcome->set_value(std::move(ans.outcome));
      case RemoteAnswer::moved:
        if (self.tell(Moved{shard, owner, r}) != Delivery::delivered)
          r->fail(Error(ErrorCode::shutting_down, "the job service is stopping"));
        return;
      default:
        return r->fail(Error(static_cast<ErrorCode>(ans.code), std::move(ans.message)));
    }
  });
}

void Intake::receive(RemoteJob& m) {
  auto core = core_.lock();
  auto moved = [&] {
    RemoteAnswer a;
    a.kind = RemoteAnswer::moved;
    m.reply_to.reply(std::move(a));
  };
  if (!core || core->stopped.load(std::memory_order_acquire)) return moved();
  std::optional<JobService> svc;
  {
    std::lock_guard lk(core->mu);
    for (auto& [shard, s] : core->serving)
      if (shard == m.shard) svc = s;
  }
  if (!svc) return moved();
  std::optional<Duration> timeout;
  if (m.timeout_ns != 0) timeout = Duration(m.timeout_ns);
  auto fail = [](ReplyTo<RemoteAnswer>& rt, Error e) {
    RemoteAnswer a;
    a.kind = RemoteAnswer::failed;
    a.code = static_cast<std::uint32_t>(e.code());
    a.message = e.message();
    rt.reply(std::move(a));
  };
  const int priority = static_cast<int>(std::clamp<std::int64_t>(m.priority, INT32_MIN, INT32_MAX));
  if (m.want_outcome) {
    svc->submit(std::move(m.job), priority, timeout)
        .then([rt = std::move(m.reply_to), fail](Result<JobOutcome> o) mutable {
          if (!o.ok()) return fail(rt, std::move(o).error());
          RemoteAnswer a;
          a.kind = RemoteAnswer::finished;
          a.outcome = std::move(o).value();
          rt.reply(std::move(a));
        });
  } else {
    svc->enqueue(std::move(m.job), priority, timeout)
        .then([rt = std::move(m.reply_to), fail, shard = m.shard](Result<JobId> id) mutable {
          RemoteAnswer a;
          if (id.ok()) {
            a.kind = RemoteAnswer::accepted;
            a.id = global_id(shard, id.value());
          } else if (not_taken(id.error())) {
            a.kind = RemoteAnswer::moved;  // not accepted: the caller sends it elsewhere
          } else {
            return fail(rt, std::move(id).error());
          }
          rt.reply(std::move(a));
        });
  }
}

}  // namespace troupe::cluster::detail::jobs
