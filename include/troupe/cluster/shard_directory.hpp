#pragma once
// Where the shards of an entity type live (sharding.hpp): the stable hash
// that maps an entity id to its shard, the fence a shard's owner writes
// under, and the directory that says which node owns each shard.
//
// A ShardDirectory is implemented over the Redis coordinator for a cluster
// (RedisShardDirectory) and in memory for one process (StaticShardDirectory,
// static_directory.hpp). Implementations are thread-safe; the callbacks
// they make must not block.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/result.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe::cluster {

// The stable hash of an entity id: FNV-1a, 64 bits.
constexpr std::uint64_t entity_hash(std::string_view id) noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (char c : id) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}
constexpr std::uint32_t shard_of(std::string_view id, std::uint32_t shard_count) noexcept {
  return static_cast<std::uint32_t>(entity_hash(id) % shard_count);
}

// The fence a shard's owner writes under: key "<type>/<shard>", value the
// placement epoch it holds the shard at (SPEC E9, journal.hpp).
inline Fence shard_fence(const std::string& type, std::uint32_t shard, std::uint64_t epoch) {
  return Fence{type + "/" + std::to_string(shard), epoch};
}

// Where shards live: which node owns each shard of an entity type, and at
// which epoch (one more per move).
// Ownership: the caller owns it; each region attached to it keeps a
// reference until its stop() returned.
// Thread safety: every member may be called from any thread.
class ShardDirectory {
 public:
  struct Location {
    std::string owner;
    std::uint64_t epoch = 0;
  };
  // What the directory tells a region of this node.
  struct Host {
    // Run `shard` here from now on (its previous owner, if any, released it
    // or is gone).
    std::function<void(std::uint32_t shard, std::uint64_t epoch)> start;
    // Stop running `shard`, then call released(): gracefully for a
    // hand-off (E6); at once when `immediate` (this node lost its lease and
    // another may take over soon: processing entities stop too, their
    // deadlines re-arm where they recover next).
    std::function<void(std::uint32_t shard, std::uint64_t epoch, bool immediate)> stop;
    // `node` left the cluster: forget it as the owner of anything.
    std::function<void(std::string_view node)> node_left;
    // The roles that may own the type's shards (empty: any node). Over the
    // Redis coordinator they are the roles of the type's placement group,
    // which every node must declare alike (attach fails with
    // invalid_argument otherwise); a node holding none of them owns no
    // shard but still routes to the type. StaticShardDirectory ignores
    // them.
    std::vector<std::string> roles{};
  };
  using Located = troupe::detail::UniqueFunction<void(Result<Location>)>;

  virtual ~ShardDirectory() = default;
  virtual const std::string& self() const = 0;
  // A region of entity type `type` with `shard_count` shards runs on this
  // node. invalid_argument if the type is attached already, or (Redis) if
  // host.roles differ from what the live nodes declared for the type.
  virtual Result<void> attach(const std::string& type, std::uint32_t shard_count, Host host) = 0;
  virtual void detach(const std::string& type) = 0;
  // Where `shard` lives, allocating it (least-loaded live node) if nobody
  // owns it. The owner may be this node before start() was called for it
  // (a hand-off still running): the region then waits for start().
  virtual void locate(const std::string& type, std::uint32_t shard, Located done) = 0;
  // This node stopped `shard` (held at `epoch`) after stop().
  virtual void released(const std::string& type, std::uint32_t shard, std::uint64_t epoch) = 0;
};

}  // namespace troupe::cluster
