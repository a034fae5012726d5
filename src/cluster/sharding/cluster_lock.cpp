// The cluster-wide keyed lock: caller-side clients that run blocks, a host
// per node that owns lock shards, and the messages between them. See
// include/troupe/cluster/cluster_lock.hpp for the contract, doc/lock.md for
// the protocol.

#include "troupe/cluster/cluster_lock.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <variant>
#include <vector>

#include "cluster_lock_wire.hpp"
#include "troupe/cluster/transport.hpp"

namespace troupe::cluster {
namespace {

using troupe::detail::LockKeyCell;
using troupe::detail::LockRequest;

constexpr int kEpochShift = 40;
constexpr std::uint64_t kMaxEpoch = (std::uint64_t{1} << (64 - kEpochShift)) - 1;
// A request refused because its shard is moving is sent again after this.
constexpr Duration kRetryDelay = std::chrono::milliseconds(20);

std::uint64_t epoch_of(std::uint64_t token) noexcept { return token >> kEpochShift; }

// --- the messages between nodes (cluster_lock_wire.hpp) ---------------------------

using lock_wire::Acquire;
using lock_wire::Deny;
using lock_wire::Grant;
using lock_wire::HoldReport;
using lock_wire::Query;
using lock_wire::QueryReply;
using lock_wire::Release;
using lock_wire::Wire;
using lock_wire::wire_codecs;

// --- actor messages ---------------------------------------------------------------

struct Submit {
  std::unique_ptr<LockRequest> req;
};
struct Routed {
  std::uint64_t req = 0;
  Result<std::string> owner;
};
struct FromWire {
  std::string from;
  Wire msg;
};
struct Finished {
  std::unique_ptr<LockRequest> req;
};
struct NodeLeft {
  std::string node;
};
struct Tick {};
using ClientMsg = std::variant<Submit, Routed, FromWire, Finished, NodeLeft, Tick>;

struct HostStart {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct HostStop {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct Located {
  std::string from;
  Acquire acquire;
  Result<std::string> owner;
};
struct QueryDone {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct GraceOver {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
using HostMsg = std::variant<HostStart, HostStop, FromWire, Located, NodeLeft, QueryDone, GraceOver>;

// --- what a node shares between its clients, its host and its inbox ----------------

struct Counters {
  std::atomic<std::uint64_t> grants{0}, acquire_timeouts{0}, lease_expiries{0}, block_failures{0}, live_holds{0},
      waiting{0};
};

void bump(std::atomic<std::uint64_t>& c, std::int64_t by = 1) noexcept {
  c.fetch_add(static_cast<std::uint64_t>(by), std::memory_order_relaxed);
}

struct Core {
  ActorSystem* system = nullptr;
  Remoting* remoting = nullptr;
  ShardDirectory* directory = nullptr;
  KeyedLockSettings settings;
  ClusterLockSettings cluster;
  std::string type;  // also the inbox name
  std::string self;
  std::shared_ptr<const MessageCodecs<Wire>> codecs;
  ActorRef<HostMsg> host;
  std::vector<ActorRef<ClientMsg>> clients;
  std::size_t client_mask = 0;
  Counters counters;
  std::atomic<bool> stopped{false};

  // Where each shard lives, as far as this node knows.
  std::mutex route_mu;
  std::vector<std::string> owners;

  // The keys this node's callers hold, by shard and token; read by the
  // queries of new owners. `queried` is the latest epoch a new owner asked
  // about each shard: a grant drawn under an older epoch that arrives
  // after that question is refused (the new owner does not know it).
  struct Hold {
    std::string key;
    std::string owner;  // where its Release goes
  };
  std::mutex holds_mu;
  std::map<std::uint32_t, std::map<std::uint64_t, Hold>> holds;
  std::vector<std::uint64_t> queried;

  // Stats of the KeyedLocks of the shards hosted here, and of retired ones.
  std::mutex hosted_mu;
  std::map<std::uint32_t, KeyedLock> hosted_locks;
  LockStats retired{};

  std::uint32_t shard_of_key(std::string_view key) const { return cluster::shard_of(key, cluster.shard_count); }

  std::string owner_of(std::uint32_t shard) {
    std::lock_guard lk(route_mu);
    return owners[shard];
  }
  void set_owner(std::uint32_t shard, const std::string& node) {
    std::lock_guard lk(route_mu);
    owners[shard] = node;
  }
  void forget_owner(std::uint32_t shard, const std::string& node) {
    std::lock_guard lk(route_mu);
    if (owners[shard] == node) owners[shard].clear();
  }
  void forget_node(std::string_view node) {
    std::lock_guard lk(route_mu);
    for (auto& o : owners)
      if (o == node) o.clear();
  }

  const ActorRef<ClientMsg>& client_for(std::string_view key) const {
    return clients[std::hash<std::string_view>{}(key) & client_mask];
  }

  // Sends `m` to the lock on `node`; to this node without the network.
  Result<void> send(const std::string& node, Wire m) {
    if (node == self) {
      dispatch(self, std::move(m));
      return {};
    }
    return remoting->remote<Wire>(node, type, codecs).tell(std::move(m));
  }

  // What arrives from a node (or this one): to the host, a client, or
  // answered here (a query reads the hold table).
  void dispatch(const std::string& from, Wire m) {
    if (auto* q = std::get_if<Query>(&m)) return answer_query(from, *q);
    if (auto* g = std::get_if<Grant>(&m)) {
      const auto& c = client_for(g->key);
      (void)c.tell(FromWire{from, std::move(m)});
      return;
    }
    if (auto* d = std::get_if<Deny>(&m)) {
      const auto& c = client_for(d->key);
      (void)c.tell(FromWire{from, std::move(m)});
      return;
    }
    (void)host.tell(FromWire{from, std::move(m)});
  }

  void answer_query(const std::string& from, const Query& q) {
    if (q.shard >= cluster.shard_count) return;
    QueryReply reply{q.shard, q.epoch, {}};
    {
      // Under the lock until sent: a Release of one of these holds, made
      // after the owner changed below, goes out after this reply.
      std::lock_guard lk(holds_mu);
      queried[q.shard] = std::max(queried[q.shard], q.epoch);
      if (auto it = holds.find(q.shard); it != holds.end()) {
        for (auto& [token, h] : it->second) {
          if (epoch_of(token) >= q.epoch) continue;
          h.owner = from;
          reply.holds.push_back(HoldReport{h.key, token});
        }
      }
      set_owner(q.shard, from);
      (void)send(from, std::move(reply));
    }
  }

  // Records a grant this node's caller is about to use; false if a newer
  // owner of its shard has asked about holds since it was drawn.
  bool add_hold(std::uint32_t shard, std::uint64_t token, const std::string& key, const std::string& owner) {
    std::lock_guard lk(holds_mu);
    if (epoch_of(token) < queried[shard]) return false;
    holds[shard][token] = Hold{key, owner};
    bump(counters.live_holds);
    return true;
  }
  // Forgets a hold and tells its owner it is free.
  void end_hold(std::uint32_t shard, std::uint64_t token) {
    std::lock_guard lk(holds_mu);
    auto it = holds.find(shard);
    if (it == holds.end()) return;
    auto h = it->second.find(token);
    if (h == it->second.end()) return;
    Release r{shard, h->second.key, token};
    std::string owner = std::move(h->second.owner);
    it->second.erase(h);
    if (it->second.empty()) holds.erase(it);
    bump(counters.live_holds, -1);
    (void)send(owner, std::move(r));
  }
};

class WireInbox final : public detail::Inbox {
 public:
  explicit WireInbox(std::weak_ptr<Core> core, std::shared_ptr<const MessageCodecs<Wire>> codecs)
      : core_(std::move(core)), codecs_(std::move(codecs)) {}
  Result<void> deliver(std::string_view from, std::uint32_t msg_id, std::string_view bytes,
                       std::optional<ReplySink> sink) override {
    auto m = codecs_->decode(msg_id, bytes, nullptr);
    if (!m.ok()) {
      if (sink) (*sink)(ReplyBytes(m.error()));
      return std::move(m).error();
    }
    if (sink) (*sink)(ReplyBytes(Error(ErrorCode::protocol_error, "the lock takes no asks")));
    if (auto core = core_.lock(); core && !core->stopped.load(std::memory_order_acquire))
      core->dispatch(std::string(from), std::move(m.value()));
    return {};
  }

 private:
  std::weak_ptr<Core> core_;
  std::shared_ptr<const MessageCodecs<Wire>> codecs_;
};

// --- the caller's side: runs blocks on this node ------------------------------------

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

// --- the owner's side: the lock shards hosted on this node --------------------------

class Host final : public Actor<HostMsg> {
 public:
  explicit Host(const std::weak_ptr<Core>& core) : core_(core.lock()) {}  // as Client's

  void receive(HostMsg& m) {
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

  void on_stop() {
    for (auto& [shard, h] : shards_) close(shard, h);
    shards_.clear();
    for (auto& [shard, q] : unstarted_)
      for (auto& w : q) deny_retry(w.from, w.acquire, {});
    unstarted_.clear();
    core_.reset();  // as Client::on_stop
  }

 private:
  enum class Phase { querying, grace, open };
  // A request held until its shard opens here. `arrived` is counted in the
  // wait the Grant reports: the caller's lease must not start before it
  // was granted.
  struct Waiting {
    std::string from;
    Acquire acquire;
    TimePoint arrived{};
  };
  // Holders' promises by token: the block of a grant waits on one until
  // its caller's Release. Shared with the blocks, which run on the shard's
  // KeyedLock actor.
  struct Promises {
    std::mutex mu;
    std::unordered_map<std::uint64_t, Promise<std::monostate>> by_token;
    void put(std::uint64_t token, Promise<std::monostate> p) {
      std::lock_guard lk(mu);
      by_token.insert_or_assign(token, std::move(p));
    }
    std::optional<Promise<std::monostate>> take(std::uint64_t token) {
      std::lock_guard lk(mu);
      auto it = by_token.find(token);
      if (it == by_token.end()) return std::nullopt;
      auto p = std::move(it->second);
      by_token.erase(it);
      return p;
    }
  };
  struct Hosted {
    std::uint64_t epoch = 0;
    Phase phase = Phase::querying;
    std::optional<KeyedLock> lock;
    std::shared_ptr<Promises> promises = std::make_shared<Promises>();
    std::set<std::string> awaiting;            // nodes yet to answer the query
    std::set<std::string> answered;            // nodes that answered it
    std::map<std::uint64_t, HoldReport> foreign;  // keys held under earlier owners, by token
    std::deque<Waiting> buffer;                // until open
    TimePoint started{};
    bool self_answered = false;  // this node's own callers reported
    bool silent = false;         // a node could not be asked
  };

  const KeyedLockSettings& cfg() const { return core_->settings; }

  void start(std::uint32_t shard, std::uint64_t epoch) {
    if (auto it = shards_.find(shard); it != shards_.end()) {
      if (it->second.epoch >= epoch) return;
      close(shard, it->second);
      shards_.erase(it);
    }
    if (epoch > kMaxEpoch) {
      // Tokens could no longer grow past an earlier owner's: serve nothing.
      std::fprintf(stderr, "troupe: keyed lock '%s': shard %u has epoch %llu, above the %llu tokens allow\n",
                   cfg().name.c_str(), shard, static_cast<unsigned long long>(epoch),
                   static_cast<unsigned long long>(kMaxEpoch));
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

  // A node that leaves while a shard here still collects the holds, and
  // has not answered (or was not asked): it may hold any key of the shard
  // (it died holding one, or left with holders still running).
  void node_left(const std::string& node) {
    left_.insert_or_assign(node, now());
    for (auto& [shard, h] : shards_) {
      if (h.phase != Phase::querying || h.answered.count(node)) continue;
      h.awaiting.erase(node);
      h.silent = true;
    }
  }

  void maybe_open(std::uint32_t shard, Hosted& h) {
    if (h.phase == Phase::querying && h.awaiting.empty() && !h.silent && h.self_answered) open(shard, h);
  }

  void query_done(std::uint32_t shard, std::uint64_t epoch) {
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

  void open(std::uint32_t shard, Hosted& h) {
    h.phase = Phase::open;
    cancel_timer("query-" + std::to_string(shard));
    // Keys held under earlier owners first: each stays held until its
    // holder releases it, or for one lease.
    for (auto& [token, rep] : h.foreign) hold_foreign(h, rep.key, token);
    h.foreign.clear();
    auto buffer = std::move(h.buffer);
    for (auto& w : buffer) grant_later(h, w.from, std::move(w.acquire), w.arrived);
  }

  void hold_foreign(Hosted& h, const std::string& key, std::uint64_t old_token) {
    auto promises = h.promises;
    h.lock->lock(key, [promises, old_token](const LockLease&) {
      Promise<std::monostate> p;
      auto f = p.future();
      promises->put(old_token, std::move(p));
      return f;
    }).then([promises, old_token](Result<std::monostate>) { (void)promises->take(old_token); });
  }

  // Queues `a` behind the key's holder; its block tells the caller it holds
  // the key and waits for the caller's Release.
  void grant_later(Hosted& h, const std::string& from, Acquire a, TimePoint arrived) {
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

  void from_wire(const std::string& from, Wire& m) {
    if (auto* a = std::get_if<Acquire>(&m)) return acquire(from, std::move(*a));
    if (auto* r = std::get_if<Release>(&m)) return release(*r);
    if (auto* q = std::get_if<QueryReply>(&m)) return query_reply(from, *q);
  }

  void acquire(const std::string& from, Acquire a) {
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

  void located(Located& l) {
    if (auto it = shards_.find(l.acquire.shard); it != shards_.end()) return acquire(l.from, std::move(l.acquire));
    if (l.owner.ok() && l.owner.value() == core_->self) {
      auto& q = unstarted_[l.acquire.shard];
      if (q.size() >= core_->cluster.buffer_per_shard) return deny_full(l.from, l.acquire);
      q.push_back(Waiting{std::move(l.from), std::move(l.acquire), now()});
      return;
    }
    deny_retry(l.from, l.acquire, l.owner.ok() ? l.owner.value() : std::string());
  }

  void release(const Release& r) {
    auto it = shards_.find(r.shard);
    if (it == shards_.end()) return;  // moved on; the new owner learnt of the hold from its holder
    Hosted& h = it->second;
    if (h.phase != Phase::open) {
      h.foreign.erase(r.token);  // released before the shard opened
      return;
    }
    if (auto p = h.promises->take(r.token)) p->set_value(std::monostate{});
  }

  void query_reply(const std::string& from, const QueryReply& q) {
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

  void stop(std::uint32_t shard, std::uint64_t epoch) {
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

  // Stops a hosted shard: its waiters and buffered requests go to the next
  // owner.
  void close(std::uint32_t shard, Hosted& h) {
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

  void deny_retry(const std::string& from, const Acquire& a, std::string hint) {
    (void)core_->send(from, Deny{a.req, a.key, static_cast<std::uint32_t>(ErrorCode::unreachable),
                                 "shard " + std::to_string(a.shard) + " of keyed lock '" + cfg().name +
                                     "' is not served on '" + core_->self + "'",
                                 true, std::move(hint)});
  }
  void deny_full(const std::string& from, const Acquire& a) {
    (void)core_->send(from, Deny{a.req, a.key, static_cast<std::uint32_t>(ErrorCode::buffer_overflow),
                                 "keyed lock '" + cfg().name + "': shard " + std::to_string(a.shard) +
                                     " is starting and holds " + std::to_string(core_->cluster.buffer_per_shard) +
                                     " requests already",
                                 false, {}});
  }

  std::shared_ptr<Core> core_;
  std::map<std::uint32_t, Hosted> shards_;
  std::map<std::uint32_t, std::deque<Waiting>> unstarted_;
  std::map<std::string, TimePoint> left_;  // nodes that left, and when this node heard of it
};

// --- the KeyedLock's backend --------------------------------------------------------

class Backend final : public troupe::detail::LockBackend {
 public:
  explicit Backend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  void submit(std::unique_ptr<LockRequest> req) override {
    // A refused message destroys the request, which answers shutting_down.
    (void)core_->clients[req->hash & core_->client_mask].tell(Submit{std::move(req)});
  }

  LockStats stats() const override {
    auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    const Counters& c = core_->counters;
    LockStats s;
    s.grants = ld(c.grants);
    s.acquire_timeouts = ld(c.acquire_timeouts);
    s.lease_expiries = ld(c.lease_expiries);
    s.block_failures = ld(c.block_failures);
    s.live_keys = ld(c.live_holds);
    s.waiting = ld(c.waiting);
    std::lock_guard lk(core_->hosted_mu);
    s.waits = core_->retired.waits;
    s.keys_freed = core_->retired.keys_freed;
    for (const auto& [shard, lock] : core_->hosted_locks) {
      LockStats h = lock.stats();
      s.waits += h.waits;
      s.keys_freed += h.keys_freed;
    }
    return s;
  }

  void stop() override {
    if (core_->stopped.exchange(true)) return;
    core_->directory->detach(core_->type);
    (void)core_->remoting->unpublish(core_->type);
    for (auto& c : core_->clients) c.stop();
    core_->host.stop();
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

Result<KeyedLock> start_keyed_lock(ActorSystem& system, Remoting& remoting, ShardDirectory& directory,
                                   KeyedLockSettings settings, ClusterLockSettings cluster) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "keyed lock '" + settings.name + "': " + what);
  };
  if (auto ok = troupe::detail::check_lock_settings(settings); !ok.ok()) return std::move(ok).error();
  if (cluster.shard_count == 0) return bad("shard_count must be positive");
  if (cluster.reply_timeout <= Duration::zero()) return bad("reply_timeout must be positive");
  if (cluster.query_timeout <= Duration::zero()) return bad("query_timeout must be positive");
  if (cluster.buffer_per_shard == 0) return bad("buffer_per_shard must be positive");
  if (cluster.lease_margin < Duration::zero()) return bad("lease_margin must not be negative");

  auto core = std::make_shared<Core>();
  core->system = &system;
  core->remoting = &remoting;
  core->directory = &directory;
  core->settings = settings;
  core->cluster = cluster;
  core->type = lock_type(settings.name);
  core->self = directory.self();
  core->codecs = std::make_shared<const MessageCodecs<Wire>>(wire_codecs());
  core->owners.resize(cluster.shard_count);
  core->queried.resize(cluster.shard_count, 0);

  std::size_t n = std::bit_ceil(std::max<std::size_t>(1, 4 * system.threads()));
  core->client_mask = n - 1;
  for (std::size_t i = 0; i < n; ++i) {
    auto ref = system.spawn<Client>(SpawnOptions{.name = core->type + "-client-" + std::to_string(i)},
                                    std::weak_ptr<Core>(core));
    if (!ref) return Error(ErrorCode::shutting_down, "keyed lock '" + settings.name + "': the actor system is shutting down");
    core->clients.push_back(std::move(ref));
  }
  core->host = system.spawn<Host>(SpawnOptions{.name = core->type + "-host"}, std::weak_ptr<Core>(core));
  auto backend = std::make_shared<Backend>(core);
  if (!core->host) return Error(ErrorCode::shutting_down, "keyed lock '" + settings.name + "': the actor system is shutting down");

  if (auto r = remoting.add_inbox(core->type, std::make_shared<WireInbox>(core, core->codecs)); !r.ok()) {
    core->stopped = true;
    for (auto& c : core->clients) c.stop();
    core->host.stop();
    return bad("a lock of this name runs on this node already (" + r.error().message() + ")");
  }
  std::weak_ptr<Core> weak = core;
  ShardDirectory::Host host;
  host.start = [weak](std::uint32_t shard, std::uint64_t epoch) {
    if (auto c = weak.lock()) (void)c->host.tell(HostStart{shard, epoch});
  };
  host.stop = [weak](std::uint32_t shard, std::uint64_t epoch, bool) {
    if (auto c = weak.lock()) (void)c->host.tell(HostStop{shard, epoch});
  };
  host.node_left = [weak](std::string_view node) {
    auto c = weak.lock();
    if (!c) return;
    c->forget_node(node);
    (void)c->host.tell(NodeLeft{std::string(node)});
    for (auto& cl : c->clients) (void)cl.tell(NodeLeft{std::string(node)});
  };
  if (auto r = directory.attach(core->type, cluster.shard_count, std::move(host)); !r.ok()) {
    core->stopped = true;
    (void)remoting.unpublish(core->type);
    for (auto& c : core->clients) c.stop();
    core->host.stop();
    return std::move(r).error();
  }
  return troupe::detail::make_keyed_lock(std::move(settings), std::move(backend));
}

}  // namespace troupe::cluster
