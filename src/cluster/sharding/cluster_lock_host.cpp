// The owner's side of the cluster-wide keyed lock, serving a shard: an
// Acquire is queued behind the key's holder (or held while the shard
// starts, or sent on to the shard's owner), a grant tells the caller, a
// Release frees the key, and a shard that moves away denies what it holds
// so that its callers ask the next owner.

#include "cluster_lock_host.hpp"

namespace troupe::cluster::detail::cluster_lock {

void Host::receive(HostMsg& m) {
  std::visit(
      [&](auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, HostStart>) {
          start(x.shard, x.epoch);
        } else if constexpr (std::is_same_v<T, HostStop>) {
          stop(x.shard, x.epoch);
        } else if constexpr (std::is_same_v<T, FromWire>) {
          from_wire(x.from, x.msg);
        } else if constexpr (std::is_same_v<T, Located>) {
          located(x);
        } else if constexpr (std::is_same_v<T, NodeLeft>) {
          node_left(x.node);
        } else if constexpr (std::is_same_v<T, QueryDone>) {
          query_done(x.shard, x.epoch);
        } else {
          auto it = shards_.find(x.shard);
          if (it != shards_.end() && it->second.epoch == x.epoch && it->second.phase == Phase::grace)
            open(x.shard, it->second);
        }
      },
      m);
}

void Host::on_stop() {
  for (auto& [shard, h] : shards_) close(shard, h);
  shards_.clear();
  for (auto& [shard, q] : unstarted_)
    for (auto& w : q) deny_retry(w.from, w.acquire, {});
  unstarted_.clear();
  core_.reset();  // as Client::on_stop
}

void Host::grant_later(Hosted& h, const std::string& from, Acquire a, TimePoint arrived) {
  auto core = core_;
  auto promises = h.promises;
  auto granted = std::make_shared<std::atomic<std::uint64_t>>(0);
  Clock* clock = &core_->system->clock();
  std::uint32_t shard = a.shard;
  std::uint64_t req = a.req;
  std::string key = a.key;
  h.lock->lock(key, [=](const LockLease& lease) {
    Promise<std::monostate> p;
    auto f = p.future();
    promises->put(lease.token(), std::move(p));
    granted->store(lease.token(), std::memory_order_release);
    auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(clock->now() - arrived).count();
    if (!core->send(from, Grant{req, shard, key, lease.token(), static_cast<std::uint64_t>(std::max<std::int64_t>(0, waited))}).ok()) {
      // The caller is out of reach: free the key at once.
      if (auto mine = promises->take(lease.token())) mine->set_value(std::monostate{});
    }
    return f;
  }).then([core, promises, granted, from, req, key](Result<std::monostate> r) {
    std::uint64_t token = granted->load(std::memory_order_acquire);
    if (token != 0) {
      (void)promises->take(token);  // a lease that expired here; a late Release finds nothing
      return;
    }
    if (r.ok()) return;
    const Error& e = r.error();
    bool moving = e.code() == ErrorCode::shutting_down;
    (void)core->send(from, Deny{req, key, static_cast<std::uint32_t>(e.code()), e.message(), moving, {}});
  });
}

void Host::from_wire(const std::string& from, Wire& m) {
  if (auto* a = std::get_if<Acquire>(&m)) return acquire(from, std::move(*a));
  if (auto* r = std::get_if<Release>(&m)) return release(*r);
  if (auto* q = std::get_if<QueryReply>(&m)) return query_reply(from, *q);
}

void Host::acquire(const std::string& from, Acquire a) {
  if (a.shard >= core_->cluster.shard_count || core_->shard_of_key(a.key) != a.shard) {
    (void)core_->send(from, Deny{a.req, a.key, static_cast<std::uint32_t>(ErrorCode::protocol_error),
                                 "keyed lock '" + cfg().name + "': key '" + a.key + "' is not in shard " +
                                     std::to_string(a.shard) + " of " + std::to_string(core_->cluster.shard_count) +
                                     " (do the nodes agree on shard_count?)",
                                 false, {}});
    return;
  }
  auto it = shards_.find(a.shard);
  if (it == shards_.end()) {
    // Not started here: perhaps a hand-off to this node is running.
    std::string f = from;
    core_->directory->locate(core_->type, a.shard,
                             [self = self(), f, a](Result<ShardDirectory::Location> r) mutable {
                               Result<std::string> owner = r.ok() ? Result<std::string>(std::move(r.value().owner))
                                                                  : Result<std::string>(std::move(r).error());
                               (void)self.tell(Located{std::move(f), std::move(a), std::move(owner)});
                             });
    return;
  }
  Hosted& h = it->second;
  if (h.phase == Phase::open) return grant_later(h, from, std::move(a), now());
  if (h.buffer.size() >= core_->cluster.buffer_per_shard) return deny_full(from, a);
  h.buffer.push_back(Waiting{from, std::move(a), now()});
}

void Host::located(Located& l) {
  if (auto it = shards_.find(l.acquire.shard); it != shards_.end()) return acquire(l.from, std::move(l.acquire));
  if (l.owner.ok() && l.owner.value() == core_->self) {
    auto& q = unstarted_[l.acquire.shard];
    if (q.size() >= core_->cluster.buffer_per_shard) return deny_full(l.from, l.acquire);
    q.push_back(Waiting{std::move(l.from), std::move(l.acquire), now()});
    return;
  }
  deny_retry(l.from, l.acquire, l.owner.ok() ? l.owner.value() : std::string());
}

void Host::release(const Release& r) {
  auto it = shards_.find(r.shard);
  if (it == shards_.end()) return;  // moved on; the new owner learnt of the hold from its holder
  Hosted& h = it->second;
  if (h.phase != Phase::open) {
    h.foreign.erase(r.token);  // released before the shard opened
    return;
  }
  if (auto p = h.promises->take(r.token)) p->set_value(std::monostate{});
}

void Host::stop(std::uint32_t shard, std::uint64_t epoch) {
  auto it = shards_.find(shard);
  if (it != shards_.end() && it->second.epoch <= epoch) {
    close(shard, it->second);
    shards_.erase(it);
  }
  if (auto q = unstarted_.find(shard); q != unstarted_.end()) {
    for (auto& w : q->second) deny_retry(w.from, w.acquire, {});
    unstarted_.erase(q);
  }
  core_->forget_owner(shard, core_->self);
  // Holders keep their keys: the next owner asks them before it grants.
  core_->directory->released(core_->type, shard, epoch);
}

void Host::close(std::uint32_t shard, Hosted& h) {
  cancel_timer("query-" + std::to_string(shard));
  cancel_timer("grace-" + std::to_string(shard));
  for (auto& w : h.buffer) deny_retry(w.from, w.acquire, {});
  h.buffer.clear();
  // The stand-in blocks' promises: dropping them ends those blocks (their
  // futures answer no_reply) and frees what the blocks hold, the promise
  // map included. Outside its lock: the blocks' continuations take it.
  std::unordered_map<std::uint64_t, Promise<std::monostate>> dropped;
  {
    std::lock_guard lk(h.promises->mu);
    dropped.swap(h.promises->by_token);
  }
  dropped.clear();
  if (h.lock) {
    h.lock->stop();
    std::lock_guard lk(core_->hosted_mu);
    LockStats s = h.lock->stats();
    core_->retired.waits += s.waits;
    core_->retired.keys_freed += s.keys_freed + s.live_keys;
    core_->hosted_locks.erase(shard);
  }
}

void Host::deny_retry(const std::string& from, const Acquire& a, std::string hint) {
  (void)core_->send(from, Deny{a.req, a.key, static_cast<std::uint32_t>(ErrorCode::unreachable),
                               "shard " + std::to_string(a.shard) + " of keyed lock '" + cfg().name +
                                   "' is not served on '" + core_->self + "'",
                               true, std::move(hint)});
}

void Host::deny_full(const std::string& from, const Acquire& a) {
  (void)core_->send(from, Deny{a.req, a.key, static_cast<std::uint32_t>(ErrorCode::buffer_overflow),
                               "keyed lock '" + cfg().name + "': shard " + std::to_string(a.shard) +
                                   " is starting and holds " + std::to_string(core_->cluster.buffer_per_shard) +
                                   " requests already",
                               false, {}});
}

ActorRef<HostMsg> spawn_host(ActorSystem& system, std::string name, const std::weak_ptr<Core>& core) {
  return system.spawn<Host>(SpawnOptions{.name = std::move(name)}, core);
}

}  // namespace troupe::cluster::detail::cluster_lock
