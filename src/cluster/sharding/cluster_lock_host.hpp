#pragma once
// The owner's side of the cluster-wide keyed lock: the Host actor, one per
// node, serves the lock shards the directory places here. Each hosted shard
// is a one-shard KeyedLock whose blocks stand in for remote holders: a
// grant's block tells the caller and waits for its Release. Defined by
//   cluster_lock_host.cpp      requests, grants, releases, stopping a shard
//   cluster_lock_takeover.cpp  starting a shard: the holds query, the grace, departed nodes
// Private to src/cluster/sharding.

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "cluster_lock_node.hpp"

namespace troupe::cluster::detail::cluster_lock {

// Serves this node's lock shards. Ownership: spawned by start_keyed_lock,
// holds the Core until it stops. Thread safety: an actor; its state is
// touched only by its own receive().
class Host final : public Actor<HostMsg> {
 public:
  explicit Host(const std::weak_ptr<Core>& core) : core_(core.lock()) {}  // strong: see Client's constructor

  void receive(HostMsg& m);
  void on_stop();

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

  // Taking a shard over (cluster_lock_takeover.cpp).
  void start(std::uint32_t shard, std::uint64_t epoch);
  // A node that leaves while a shard here still collects the holds, and
  // has not answered (or was not asked): it may hold any key of the shard
  // (it died holding one, or left with holders still running).
  void node_left(const std::string& node);
  void maybe_open(std::uint32_t shard, Hosted& h);
  void query_done(std::uint32_t shard, std::uint64_t epoch);
  void open(std::uint32_t shard, Hosted& h);
  void hold_foreign(Hosted& h, const std::string& key, std::uint64_t old_token);
  void query_reply(const std::string& from, const QueryReply& q);

  // Serving it (cluster_lock_host.cpp).
  // Queues `a` behind the key's holder; its block tells the caller it holds
  // the key and waits for the caller's Release.
  void grant_later(Hosted& h, const std::string& from, Acquire a, TimePoint arrived);
  void from_wire(const std::string& from, Wire& m);
  void acquire(const std::string& from, Acquire a);
  void located(Located& l);
  void release(const Release& r);
  void stop(std::uint32_t shard, std::uint64_t epoch);
  // Stops a hosted shard: its waiters and buffered requests go to the next
  // owner.
  void close(std::uint32_t shard, Hosted& h);
  void deny_retry(const std::string& from, const Acquire& a, std::string hint);
  void deny_full(const std::string& from, const Acquire& a);

  std::shared_ptr<Core> core_;
  std::map<std::uint32_t, Hosted> shards_;
  std::map<std::uint32_t, std::deque<Waiting>> unstarted_;
  std::map<std::string, TimePoint> left_;  // nodes that left, and when this node heard of it
};

}  // namespace troupe::cluster::detail::cluster_lock
