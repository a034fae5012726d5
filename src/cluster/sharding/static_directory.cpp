#include "troupe/cluster/static_directory.hpp"

#include <algorithm>
#include <functional>
#include <utility>

namespace troupe::cluster {

struct StaticShardDirectory::State {
  struct Shard {
    std::string owner;
    std::uint64_t epoch = 0;
    // Set while the previous owner stops the shard: who, and at which epoch.
    std::optional<std::pair<std::string, std::uint64_t>> handoff;
  };
  struct Type {
    std::uint32_t shard_count = 0;
    std::map<std::uint32_t, Shard> shards;
    std::map<std::string, ShardDirectory::Host> hosts;  // attached regions by node
  };

  std::mutex mu;
  std::vector<std::string> nodes;
  std::map<std::string, Type> types;
  std::uint64_t epochs = 0;

  // With mu held: the live node with the fewest shards of `t`.
  std::string least_loaded(const Type& t, const std::string& except = {}) const {
    std::map<std::string, std::size_t> n;
    for (const auto& node : nodes) n[node] = 0;
    for (const auto& [s, sh] : t.shards)
      if (n.count(sh.owner)) ++n[sh.owner];
    std::string best;
    std::size_t best_n = SIZE_MAX;
    for (const auto& node : nodes) {
      if (node == except) continue;
      if (n[node] < best_n) {
        best = node;
        best_n = n[node];
      }
    }
    return best;
  }
};

namespace {

using Call = std::function<void()>;

void run(std::vector<Call>& calls) {
  for (auto& c : calls) c();
  calls.clear();
}

}  // namespace

class StaticView final : public ShardDirectory {
 public:
  StaticView(std::shared_ptr<StaticShardDirectory::State> st, std::string self)
      : st_(std::move(st)), self_(std::move(self)) {}

  const std::string& self() const override { return self_; }

  Result<void> attach(const std::string& type, std::uint32_t shard_count, Host host) override {
    std::vector<Call> calls;
    {
      std::lock_guard lk(st_->mu);
      auto& t = st_->types[type];
      if (t.hosts.count(self_))
        return Error(ErrorCode::invalid_argument, "entity type '" + type + "' is already attached on node '" + self_ + "'");
      if (t.shard_count != 0 && t.shard_count != shard_count)
        return Error(ErrorCode::invalid_argument, "entity type '" + type + "' has " + std::to_string(t.shard_count) +
                                                      " shards on other nodes, not " + std::to_string(shard_count));
      t.shard_count = shard_count;
      t.hosts[self_] = host;
      // Shards allocated here before this region existed start now.
      for (auto& [s, sh] : t.shards) {
        if (sh.owner == self_ && !sh.handoff) {
          auto start = host.start;
          calls.push_back([start, s = s, e = sh.epoch] { start(s, e); });
        }
      }
    }
    run(calls);
    return {};
  }

  void detach(const std::string& type) override {
    std::lock_guard lk(st_->mu);
    auto it = st_->types.find(type);
    if (it != st_->types.end()) it->second.hosts.erase(self_);
  }

  void locate(const std::string& type, std::uint32_t shard, Located done) override {
    std::vector<Call> calls;
    Result<Location> where = Error(ErrorCode::unreachable, "NO_ACCEPTABLE_WORKER: no node can take the shard");
    {
      std::lock_guard lk(st_->mu);
      auto& t = st_->types[type];
      auto it = t.shards.find(shard);
      if (it == t.shards.end()) {
        std::string owner = st_->least_loaded(t);
        if (!owner.empty()) {
          auto& sh = t.shards[shard];
          sh.owner = owner;
          sh.epoch = ++st_->epochs;
          auto h = t.hosts.find(owner);
          if (h != t.hosts.end()) {
            auto start = h->second.start;
            calls.push_back([start, shard, e = sh.epoch] { start(shard, e); });
          }
          where = Location{sh.owner, sh.epoch};
        }
      } else {
        where = Location{it->second.owner, it->second.epoch};
      }
    }
    run(calls);
    done(std::move(where));
  }

  void released(const std::string& type, std::uint32_t shard, std::uint64_t epoch) override {
    std::vector<Call> calls;
    {
      std::lock_guard lk(st_->mu);
      auto& t = st_->types[type];
      auto it = t.shards.find(shard);
      if (it == t.shards.end()) return;
      auto& sh = it->second;
      if (!sh.handoff || sh.handoff->first != self_ || sh.handoff->second != epoch) return;
      sh.handoff.reset();
      auto h = t.hosts.find(sh.owner);
      if (h != t.hosts.end()) {
        auto start = h->second.start;
        calls.push_back([start, shard, e = sh.epoch] { start(shard, e); });
      }
    }
    run(calls);
  }

 private:
  std::shared_ptr<StaticShardDirectory::State> st_;
  std::string self_;
};

StaticShardDirectory::StaticShardDirectory(std::vector<std::string> nodes) : state_(std::make_shared<State>()) {
  state_->nodes = std::move(nodes);
}
StaticShardDirectory::~StaticShardDirectory() = default;

std::unique_ptr<ShardDirectory> StaticShardDirectory::view(std::string self) {
  return std::make_unique<StaticView>(state_, std::move(self));
}

Result<void> StaticShardDirectory::move(const std::string& type, std::uint32_t shard, const std::string& to) {
  std::vector<Call> calls;
  {
    std::lock_guard lk(state_->mu);
    if (std::find(state_->nodes.begin(), state_->nodes.end(), to) == state_->nodes.end())
      return Error(ErrorCode::invalid_argument, "unknown node '" + to + "'");
    auto& t = state_->types[type];
    auto it = t.shards.find(shard);
    if (it == t.shards.end())
      return Error(ErrorCode::invalid_argument, "NOT_INSTALLED: shard " + std::to_string(shard) + " of '" + type + "'");
    auto& sh = it->second;
    if (sh.owner == to) return {};
    std::string from = sh.owner;
    std::uint64_t old_epoch = sh.epoch;
    sh.owner = to;
    sh.epoch = ++state_->epochs;
    auto h = t.hosts.find(from);
    if (h != t.hosts.end()) {
      sh.handoff = std::make_pair(from, old_epoch);
      auto stop = h->second.stop;
      calls.push_back([stop, shard, old_epoch] { stop(shard, old_epoch, false); });
    } else {
      auto n = t.hosts.find(to);
      if (n != t.hosts.end()) {
        auto start = n->second.start;
        calls.push_back([start, shard, e = sh.epoch] { start(shard, e); });
      }
    }
  }
  run(calls);
  return {};
}

void StaticShardDirectory::remove_node(const std::string& node) {
  std::vector<Call> calls;
  {
    std::lock_guard lk(state_->mu);
    auto& nodes = state_->nodes;
    nodes.erase(std::remove(nodes.begin(), nodes.end(), node), nodes.end());
    for (auto& [type, t] : state_->types) {
      t.hosts.erase(node);
      for (auto& [s, sh] : t.shards) {
        if (sh.handoff && sh.handoff->first == node) {
          // The old owner died during the hand-off: nothing to wait for.
          sh.handoff.reset();
          auto h = t.hosts.find(sh.owner);
          if (h != t.hosts.end()) {
            auto start = h->second.start;
            calls.push_back([start, s = s, e = sh.epoch] { start(s, e); });
          }
        }
        if (sh.owner != node) continue;
        std::string to = state_->least_loaded(t, node);
        if (to.empty()) continue;
        sh.owner = to;
        sh.epoch = ++state_->epochs;
        sh.handoff.reset();
        auto h = t.hosts.find(to);
        if (h != t.hosts.end()) {
          auto start = h->second.start;
          calls.push_back([start, s = s, e = sh.epoch] { start(s, e); });
        }
      }
      for (auto& [n, host] : t.hosts) {
        auto left = host.node_left;
        calls.push_back([left, node] { left(node); });
      }
    }
  }
  run(calls);
}

std::optional<StaticShardDirectory::Placement> StaticShardDirectory::placement(const std::string& type,
                                                                               std::uint32_t shard) const {
  std::lock_guard lk(state_->mu);
  auto t = state_->types.find(type);
  if (t == state_->types.end()) return std::nullopt;
  auto it = t->second.shards.find(shard);
  if (it == t->second.shards.end()) return std::nullopt;
  return Placement{it->second.owner, it->second.epoch, it->second.handoff.has_value()};
}

std::map<std::string, std::size_t> StaticShardDirectory::counts(const std::string& type) const {
  std::lock_guard lk(state_->mu);
  std::map<std::string, std::size_t> n;
  for (const auto& node : state_->nodes) n[node] = 0;
  auto t = state_->types.find(type);
  if (t != state_->types.end())
    for (const auto& [s, sh] : t->second.shards) ++n[sh.owner];
  return n;
}

}  // namespace troupe::cluster
