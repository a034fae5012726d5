#pragma once
// What a shard region (sharding.hpp) is started with, and what it counts.
// Both are plain values: the caller owns its copy; like any value, one
// object is not to be written from two threads at once.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/persist/entity.hpp"

namespace troupe::cluster {

// How a ShardRegion runs its entity type on this node. Checked by
// ShardRegion::start.
struct ShardRegionSettings {
  // type_name, idle_timeout (E5), stash_capacity (E8), stop_timeout (E6)
  // apply per entity as on one node; `shards` is ignored (one registry
  // shard per cluster shard).
  EntitySettings entity{};
  // Shards of this type; the same on every node. Ten or more per node the
  // cluster may grow to keeps rebalancing fine-grained.
  std::uint32_t shard_count = 128;
  // Commands held per shard while its owner is being found or while it is
  // handed off. Past it: buffer_overflow to the sender.
  std::size_t buffer_per_shard = 10'000;
  // A command forwarded this many times without reaching its owner is
  // answered unreachable (directories that disagree for longer than a
  // move should never happen; this keeps a bug from looping).
  std::uint8_t max_hops = 4;
  // The roles a node must hold (ClusterSettings::roles) to own shards of
  // this type; empty: any node. Every node starts the region with the same
  // roles (ShardRegion::start fails with invalid_argument otherwise); a
  // node without one of them hosts no shard yet sends to the type, its
  // commands going to the shards' owners. Each 1 to 64 of [A-Za-z0-9._-].
  std::vector<std::string> roles{};
};

// Counters of one region on one node; each exact, the set not a snapshot.
struct ShardRegionStats {
  std::uint64_t shards_hosted = 0;      // running here now
  std::uint64_t shards_started = 0;
  std::uint64_t shards_handed_off = 0;  // stopped here and released
  std::uint64_t buffered = 0;           // commands waiting now
  std::uint64_t sent_remote = 0;        // commands sent to another node
  std::uint64_t received_remote = 0;    // commands that arrived from another node
  std::uint64_t forwarded = 0;          // arrived here for a shard owned elsewhere
  std::uint64_t refused = 0;            // answered with an error by the region
  std::uint64_t resent = 0;             // idempotent asks sent again after their owner was lost
  EntityStats entities{};               // summed over the hosted shards
};

}  // namespace troupe::cluster
