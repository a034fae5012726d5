#pragma once
// The keyed lock across a cluster (SPEC L6): the KeyedLock API, with each
// key owned by one node of the cluster through sharding.
//
//   auto accounts = troupe::cluster::start_keyed_lock(system, cluster->remoting(), cluster->directory(),
//                                                     {.name = "accounts", .wait_timeout = 2s, .lease = 10s}).value();
//   accounts.lock("acct-42", [&](const troupe::LockLease& lease) { ... });  // as on one node
//
// A key maps to one of `shard_count` lock shards by the stable hash of
// entity ids; the shard directory places each shard on one node, as it
// places entity shards. The owner keeps the key's holder and its FIFO of
// waiters; the block runs on the node that called lock():
//
//   caller node                         owner node
//   lock(key, block) --- Acquire ---->  queue behind the holder (FIFO)
//                    <--- Grant ------  token; how long it waited
//   block(lease) runs here
//                    ---- Release --->  next waiter
//
// Leases (L3) without comparing clocks across hosts: the owner measures how
// long the request waited on its own clock, the caller adds that to the
// time it sent the request on its clock, so its lease ends no later than
// the owner's. A block still running then gets lease_expired and its token
// stops being current on the caller's node before the owner passes the key
// on.
//
// Fencing across nodes. A token is the shard's placement epoch (which grows
// with every move of any shard) times 2^40 plus a per-shard count, so a
// token drawn by a later owner is larger than every token an earlier owner
// drew. A new owner also asks every other node which keys of the shard
// they hold and keeps those keys held until released (or one lease): a
// move does not let two callers hold one key. A node that does not answer
// within query_timeout may hold anything: the shard then grants nothing
// until one lease after it started. Grants an earlier owner sent that
// arrive after the new owner's question are refused by the caller and the
// request is routed to the new owner. doc/lock.md has the timeline.
//
// Errors, besides those of KeyedLock: acquire_timeout also when the owner
// does not answer within wait_timeout + reply_timeout (it crashed); the
// request is re-routed, not failed, when its shard moves.
//
// Ownership and thread safety: the returned KeyedLock is a handle like any
// other; the lock shares the actor system, the remoting layer and the
// directory with the caller, who keeps them alive until stop() returned.
// Every member is thread-safe.

#include <cstdint>

#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/sharding.hpp"
#include "troupe/patterns/keyed_lock.hpp"

namespace troupe::cluster {

struct ClusterLockSettings {
  // Lock shards; the same on every node of the cluster.
  std::uint32_t shard_count = 64;
  // How long a caller waits beyond wait_timeout for its owner's answer
  // before answering acquire_timeout itself (the owner is gone).
  Duration reply_timeout = std::chrono::seconds(2);
  // How long a new owner of a shard waits for the other nodes to report the
  // keys of it they hold.
  Duration query_timeout = std::chrono::seconds(1);
  // The owner keeps a key this long past a remote holder's lease before
  // passing it on: covers clock-rate differences between nodes and a
  // caller too busy to notice its lease ended. (LockLease::is_current turns
  // false at the lease's end on its own.)
  Duration lease_margin = std::chrono::milliseconds(200);
  // Requests held per shard while it starts on its new owner. Past it:
  // buffer_overflow.
  std::size_t buffer_per_shard = 10'000;
};

// The directory type (and the remoting inbox) of a lock named `name`.
inline std::string lock_type(std::string_view name) { return "lock/" + std::string(name); }

// Starts the lock on this node; every node of the cluster starts it with
// the same name and settings. invalid_argument for unusable settings or a
// name already in use on this node. settings.shards and first_token are
// not used (one KeyedLock shard per hosted lock shard, tokens from the
// epoch).
Result<KeyedLock> start_keyed_lock(ActorSystem& system, Remoting& remoting, ShardDirectory& directory,
                                   KeyedLockSettings settings, ClusterLockSettings cluster = {});

}  // namespace troupe::cluster
