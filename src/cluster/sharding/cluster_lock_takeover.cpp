// A lock shard starting on its new owner: before it grants anything it asks
// every other node which keys of the shard their callers hold (granted by
// an earlier owner) and keeps those keys held. A node that cannot be asked,
// does not answer within query_timeout, or left less than a lease ago may
// hold any key: the shard then waits out a grace of one lease from its start
// before it opens. Requests that arrive meanwhile wait in the shard's buffer.


#include "cluster_lock_host.hpp"
#include "troupe/cluster/transport.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster::detail::cluster_lock {

void Host::start(std::uint32_t shard, std::uint64_t epoch) {
  if (auto it = shards_.find(shard); it != shards_.end()) {
    if (it->second.epoch >= epoch) return;
    close(shard, it->second);
    shards_.erase(it);
  }
  if (epoch > kMaxEpoch) {
    // Tokens could no longer grow past an earlier owner's: serve nothing.
    log::error(log::Component::cluster, "keyed lock shard has an epoch above what tokens allow; not served",
               {{"lock", cfg().name}, {"shard", shard}, {"epoch", epoch}, {"max_epoch", kMaxEpoch}});
    return;
  }
  KeyedLockSettings s = cfg();
  s.name = cfg().name + "#" + std::to_string(shard);
  s.shards = 1;
  s.first_token = epoch << kEpochShift;
  // The caller's lease ends first (see Client::granted); the margin covers
  // clock-rate differences and a busy caller.
  s.lease = cfg().lease + core_->cluster.lease_margin;
  auto lock = KeyedLock::start(*core_->system, s);
  if (!lock.ok()) return;  // the system is shutting down
  Hosted& h = shards_[shard];
  h.epoch = epoch;
  h.lock = std::move(lock.value());
  h.started = now();
  {
    std::lock_guard lk(core_->hosted_mu);
    core_->hosted_locks.insert_or_assign(shard, *h.lock);
  }
  core_->set_owner(shard, core_->self);
  if (auto it = unstarted_.find(shard); it != unstarted_.end()) {
    h.buffer = std::move(it->second);
    unstarted_.erase(it);
  }
  // Who holds keys of this shard, granted by an earlier owner? This
  // node's own callers answer at once, the others over the network.
  for (const auto& peer : core_->remoting->transport().peers()) {
    if (peer.node_id == core_->self) continue;
    if (core_->send(peer.node_id, Query{shard, epoch}).ok()) h.awaiting.insert(peer.node_id);
    else h.silent = true;
  }
  // A node that left less than one lease ago (a crash looks the same)
  // can no longer be asked, and its callers' grants may still be running.
  const Duration hold_for = cfg().lease + core_->cluster.lease_margin;
  for (auto it = left_.begin(); it != left_.end();) {
    if (now() - it->second >= hold_for) {
      it = left_.erase(it);
    } else {
      if (!h.awaiting.count(it->first)) h.silent = true;
      ++it;
    }
  }
  core_->dispatch(core_->self, Query{shard, epoch});
  start_timer("query-" + std::to_string(shard), core_->cluster.query_timeout, QueryDone{shard, epoch});
  maybe_open(shard, h);
}

void Host::node_left(const std::string& node) {
  left_.insert_or_assign(node, now());
  for (auto& [shard, h] : shards_) {
    if (h.phase != Phase::querying || h.answered.count(node)) continue;
    h.awaiting.erase(node);
    h.silent = true;
  }
}

void Host::maybe_open(std::uint32_t shard, Hosted& h) {
  if (h.phase == Phase::querying && h.awaiting.empty() && !h.silent && h.self_answered) open(shard, h);
}

void Host::query_done(std::uint32_t shard, std::uint64_t epoch) {
  auto it = shards_.find(shard);
  if (it == shards_.end() || it->second.epoch != epoch || it->second.phase != Phase::querying) return;
  Hosted& h = it->second;
  // A node that did not answer may hold any key of the shard, until one
  // lease after the shard's previous owner stopped granting: no later
  // than one lease after this start.
  h.phase = Phase::grace;
  TimePoint until = deadline_after(h.started, cfg().lease + core_->cluster.lease_margin);
  TimePoint t = now();
  start_timer("grace-" + std::to_string(shard), until > t ? until - t : Duration::zero(), GraceOver{shard, epoch});
}

void Host::open(std::uint32_t shard, Hosted& h) {
  h.phase = Phase::open;
  cancel_timer("query-" + std::to_string(shard));
  // Keys held under earlier owners first: each stays held until its
  // holder releases it, or for one lease.
  for (auto& [token, rep] : h.foreign) hold_foreign(h, rep.key, token);
  h.foreign.clear();
  auto buffer = std::move(h.buffer);
  for (auto& w : buffer) grant_later(h, w.from, std::move(w.acquire), w.arrived);
}

void Host::hold_foreign(Hosted& h, const std::string& key, std::uint64_t old_token) {
  auto promises = h.promises;
  h.lock->lock(key, [promises, old_token](const LockLease&) {
    Promise<std::monostate> p;
    auto f = p.future();
    promises->put(old_token, std::move(p));
    return f;
  }).then([promises, old_token](Result<std::monostate>) { (void)promises->take(old_token); });
}

void Host::query_reply(const std::string& from, const QueryReply& q) {
  auto it = shards_.find(q.shard);
  if (it == shards_.end() || it->second.epoch != q.epoch) return;
  Hosted& h = it->second;
  if (h.phase == Phase::open) return;
  for (const auto& rep : q.holds) h.foreign.emplace(rep.token, rep);
  if (from == core_->self) h.self_answered = true;
  h.awaiting.erase(from);
  h.answered.insert(from);
  maybe_open(q.shard, h);
}

}  // namespace troupe::cluster::detail::cluster_lock
