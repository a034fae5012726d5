#pragma once
// An in-memory shard directory for nodes in one process: a single node
// running its regions without Redis, or tests that run several nodes side
// by side and move shards by hand. The cluster's directory is
// RedisShardDirectory (redis_directory.hpp); both follow the same protocol:
// a shard is allocated to the least-loaded node on first use, a move stops
// it on the old owner and starts it on the new one only after the old one
// released it, and every move raises the shard's epoch.
//
// Ownership: the StaticShardDirectory holds the shared placement; view()
// gives each node its ShardDirectory, which must not outlive it.
// Thread-safe; callbacks into regions run outside its lock, on the calling
// thread (or, for start after a release, on the releasing thread).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/cluster/sharding.hpp"

namespace troupe::cluster {

class StaticShardDirectory {
 public:
  // The nodes that may own shards, in order of preference on ties.
  explicit StaticShardDirectory(std::vector<std::string> nodes);
  ~StaticShardDirectory();
  StaticShardDirectory(const StaticShardDirectory&) = delete;
  StaticShardDirectory& operator=(const StaticShardDirectory&) = delete;

  // The directory as node `self` sees it.
  std::unique_ptr<ShardDirectory> view(std::string self);

  // Moves `shard` of `type` to `to` with a hand-off. invalid_argument for
  // an unknown node or an unallocated shard; a move to the owner is a no-op.
  Result<void> move(const std::string& type, std::uint32_t shard, const std::string& to);
  // `node` is gone (crashed): its shards go to the other nodes at once,
  // without a hand-off, and every view hears node_left.
  void remove_node(const std::string& node);

  struct Placement {
    std::string owner;
    std::uint64_t epoch = 0;
    bool handing_off = false;
  };
  std::optional<Placement> placement(const std::string& type, std::uint32_t shard) const;
  // Shards per node for `type`.
  std::map<std::string, std::size_t> counts(const std::string& type) const;

 private:
  friend class StaticView;
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace troupe::cluster
