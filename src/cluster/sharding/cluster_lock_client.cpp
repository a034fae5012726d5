// The caller's side of the cluster-wide keyed lock: one Client actor per
// slice of the keys runs the blocks of this node's callers. It finds each
// key's owner (from the routing table or the shard directory), sends the
// Acquire, turns a Grant into a lease on its own clock, runs the block, sends
// the Release, and retries, re-routes or fails requests whose owner moves,
// leaves or does not answer.

#include <unordered_map>

#include "cluster_lock_node.hpp"

namespace troupe::cluster::detail::cluster_lock {
namespace {

// A request refused because its shard is moving is sent again after this.
constexpr Duration kRetryDelay = std::chrono::milliseconds(20);

// Runs this node's callers' blocks for the keys that hash to it. Ownership:
// spawned by start_keyed_lock, holds the Core until it stops. Thread safety:
// an actor; its state is touched only by its own receive().
class Client final : public Actor<ClientMsg> {
 public:
  // A weak reference: the cell keeps its actor's constructor arguments
  // (for restarts), and the core holds the cell.
  explicit Client(const std::weak_ptr<Core>& core) : core_(core.lock()) {}

  void on_start() { sink_ = std::make_shared<Sink>(self()); }

  void receive(ClientMsg& m) {
    std::visit(
        [&](auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, Submit>) {
            submit(std::move(x.req));
          } else if constexpr (std::is_same_v<T, Routed>) {
            routed(x);
          } else if constexpr (std::is_same_v<T, FromWire>) {
            if (auto* g = std::get_if<Grant>(&x.msg)) granted(x.from, *g);
            if (auto* d = std::get_if<Deny>(&x.msg)) denied(x.from, *d);
          } else if constexpr (std::is_same_v<T, Finished>) {
            finished(std::move(x.req));
          } else if constexpr (std::is_same_v<T, NodeLeft>) {
            node_left(x.node);
          } else {
            armed_ = TimePoint::max();
            expire();
          }
        },
        m);
    rearm();
  }

  void on_stop() {
    Error stopped(ErrorCode::shutting_down, "keyed lock '" + cfg().name + "' has stopped");
    for (auto& [id, p] : pending_) p.req->fail(stopped);
    bump(core_->counters.waiting, -static_cast<std::int64_t>(pending_.size()));
    pending_.clear();
    // Running blocks belong to their continuations: answer their callers
    // and free their keys.
    for (auto& [token, h] : holds_) {
      if (h.expired) continue;
      h.cell->current.store(0, std::memory_order_release);
      h.req->fail(stopped);
      core_->end_hold(h.shard, token);
    }
    holds_.clear();
    // The core holds this actor's reference: let go of it so neither keeps
    // the other alive.
    sink_.reset();
    core_.reset();
  }

 private:
  struct Pending {
    std::unique_ptr<LockRequest> req;
    std::uint32_t shard = 0;
    std::string owner;       // where the request went; empty while routing
    TimePoint sent{};        // when it went there
    TimePoint give_up{};     // wait_timeout + reply_timeout after lock()
    TimePoint retry_at = TimePoint::max();
  };
  struct Held {
    LockRequest* req = nullptr;  // owned by its block's continuation
    std::shared_ptr<LockKeyCell> cell;
    std::uint32_t shard = 0;
    TimePoint deadline{};
    bool expired = false;
  };
  class Sink final : public troupe::detail::LockSink {
   public:
    explicit Sink(ActorRef<ClientMsg> c) : client_(std::move(c)) {}
    void finished(std::unique_ptr<LockRequest> req) override { (void)client_.tell(Finished{std::move(req)}); }

   private:
    ActorRef<ClientMsg> client_;
  };

  const KeyedLockSettings& cfg() const { return core_->settings; }

  void submit(std::unique_ptr<LockRequest> req) {
    std::uint64_t id = ++next_id_;
    Pending p;
    p.shard = core_->shard_of_key(req->key);
    p.give_up = deadline_after(now(), cfg().wait_timeout + core_->cluster.reply_timeout);
    p.req = std::move(req);
    pending_.emplace(id, std::move(p));
    bump(core_->counters.waiting);
    route(id);
  }

  void route(std::uint64_t id) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    Pending& p = it->second;
    p.retry_at = TimePoint::max();
    std::string owner = core_->owner_of(p.shard);
    if (!owner.empty()) return send_acquire(id, p, owner);
    p.owner.clear();
    core_->directory->locate(core_->type, p.shard,
                             [self = self(), id](Result<ShardDirectory::Location> r) {
                               if (r.ok())
                                 (void)self.tell(Routed{id, std::move(r.value().owner)});
                               else
                                 (void)self.tell(Routed{id, std::move(r).error()});
                             });
  }

  void routed(Routed& r) {
    auto it = pending_.find(r.req);
    if (it == pending_.end() || !it->second.owner.empty()) return;
    if (!r.owner.ok() || r.owner.value().empty()) return retry_later(it->second);
    core_->set_owner(it->second.shard, r.owner.value());
    send_acquire(r.req, it->second, r.owner.value());
  }

  void send_acquire(std::uint64_t id, Pending& p, const std::string& owner) {
    p.owner = owner;
    p.sent = now();
    if (!core_->send(owner, Acquire{id, p.shard, p.req->key}).ok()) {
      core_->forget_owner(p.shard, owner);
      p.owner.clear();
      retry_later(p);
    }
  }

  void retry_later(Pending& p) {
    p.owner.clear();
    p.retry_at = deadline_after(now(), kRetryDelay);
  }

  void granted(const std::string& from, const Grant& g) {
    auto it = pending_.find(g.req);
    if (it == pending_.end() || it->second.owner != from || it->second.req->key != g.key) {
      // A grant for a request that gave up or went elsewhere: give it back.
      (void)core_->send(from, Release{g.shard, g.key, g.token});
      return;
    }
    Pending& p = it->second;
    // The owner granted no earlier than we sent plus how long it says the
    // request waited there: our lease ends no later than its.
    TimePoint deadline = deadline_after(p.sent + std::chrono::nanoseconds(g.waited_ns), cfg().lease);
    if (!core_->add_hold(p.shard, g.token, g.key, from)) {
      // Drawn by an owner the shard has moved away from, after the new
      // owner asked who holds what: it cannot know of it. Ask again there.
      (void)core_->send(from, Release{g.shard, g.key, g.token});
      core_->forget_owner(p.shard, from);
      return retry_later(p);
    }
    std::unique_ptr<LockRequest> req = std::move(p.req);
    std::uint32_t shard = p.shard;
    pending_.erase(it);
    bump(core_->counters.waiting, -1);
    bump(core_->counters.grants);
    auto cell = std::make_shared<LockKeyCell>(g.key, &core_->system->clock(), deadline);
    cell->current.store(g.token, std::memory_order_release);
    LockRequest* r = req.get();
    r->token = g.token;
    bool done = r->start(req, LockLease(cell, g.token), sink_);
    if (!done) {
      holds_.emplace(g.token, Held{r, std::move(cell), shard, deadline, false});
      return;
    }
    cell->current.store(0, std::memory_order_release);
    core_->end_hold(shard, g.token);
    if (now() > deadline) {
      bump(core_->counters.lease_expiries);
      r->fail(lease_expired(g.key, g.token));
    } else {
      if (r->failed()) bump(core_->counters.block_failures);
      r->finish();
    }
  }

  void finished(std::unique_ptr<LockRequest> req) {
    auto it = holds_.find(req->token);
    if (it == holds_.end()) return;  // answered already (the client stopped)
    Held h = std::move(it->second);
    holds_.erase(it);
    if (h.expired) return;  // its caller has lease_expired; drop the late result
    h.cell->current.store(0, std::memory_order_release);
    core_->end_hold(h.shard, req->token);
    if (req->failed()) bump(core_->counters.block_failures);
    req->finish();
  }

  void denied(const std::string& from, const Deny& d) {
    auto it = pending_.find(d.req);
    if (it == pending_.end() || it->second.owner != from) return;
    Pending& p = it->second;
    if (d.retry) {
      core_->forget_owner(p.shard, from);
      if (!d.hint.empty() && d.hint != from) {
        core_->set_owner(p.shard, d.hint);
        p.owner.clear();
        p.retry_at = now();
      } else {
        retry_later(p);
      }
      return;
    }
    auto code = static_cast<ErrorCode>(d.code);
    if (code == ErrorCode::acquire_timeout) bump(core_->counters.acquire_timeouts);
    p.req->fail(Error(code, d.message));
    pending_.erase(it);
    bump(core_->counters.waiting, -1);
  }

  void node_left(const std::string& node) {
    TimePoint t = now();
    for (auto& [id, p] : pending_)
      if (p.owner == node) {
        p.owner.clear();
        p.retry_at = t;
      }
  }

  void expire() {
    TimePoint t = now();
    std::vector<std::uint64_t> again;
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      if (p.give_up <= t) {
        bump(core_->counters.acquire_timeouts);
        p.req->fail(Error(ErrorCode::acquire_timeout,
                          "keyed lock '" + cfg().name + "': key '" + p.req->key + "' not acquired within " +
                              troupe::detail::lock_duration_text(cfg().wait_timeout) + " (its owner " +
                              (p.owner.empty() ? std::string("could not be found") : "'" + p.owner + "' did not answer") +
                              " within another " + troupe::detail::lock_duration_text(core_->cluster.reply_timeout) + ")"));
        it = pending_.erase(it);
        bump(core_->counters.waiting, -1);
        continue;
      }
      if (p.retry_at <= t) again.push_back(it->first);
      ++it;
    }
    for (auto id : again) route(id);
    for (auto& [token, h] : holds_) {
      if (h.expired || h.deadline > t) continue;
      h.expired = true;
      h.cell->current.store(0, std::memory_order_release);
      bump(core_->counters.lease_expiries);
      h.req->fail(lease_expired(h.cell->key, token));
      core_->end_hold(h.shard, token);
    }
  }

  // One timer, at the earliest deadline of anything waiting here.
  void rearm() {
    TimePoint next = TimePoint::max();
    for (const auto& [id, p] : pending_) next = std::min({next, p.give_up, p.retry_at});
    for (const auto& [token, h] : holds_)
      if (!h.expired) next = std::min(next, h.deadline);
    if (next == TimePoint::max() || next >= armed_) return;
    armed_ = next;
    TimePoint t = now();
    start_timer("tick", next > t ? next - t : Duration::zero(), Tick{});
  }

  Error lease_expired(const std::string& key, std::uint64_t token) const {
    return troupe::detail::lock_lease_expired(cfg(), key, token);
  }

  std::shared_ptr<Core> core_;
  std::shared_ptr<Sink> sink_;
  std::uint64_t next_id_ = 0;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::unordered_map<std::uint64_t, Held> holds_;
  TimePoint armed_ = TimePoint::max();
};

}  // namespace

ActorRef<ClientMsg> spawn_client(ActorSystem& system, std::string name, const std::weak_ptr<Core>& core) {
  return system.spawn<Client>(SpawnOptions{.name = std::move(name)}, core);
}

}  // namespace troupe::cluster::detail::cluster_lock
