#pragma once
// A per-key lock (SPEC L1-L5).
//
//   auto lock = troupe::KeyedLock::start(system, {.name = "accounts"}).value();
//   troupe::Future<Balance> f = lock.lock("acct-42", [&](const troupe::LockLease& lease) {
//     return ledger.debit("acct-42", 10, lease.token());  // runs alone for this key
//   });
//   f.then([](troupe::Result<Balance> r) { ... });  // or f.get() outside any actor
//
// lock(key, block) runs `block` with exclusive access to `key`: blocks for
// one key run one at a time in request order (FIFO); blocks for different
// keys run in parallel. The block returns a value of its own type; the
// caller's Future carries exactly that type (no casts, nothing type-erased
// in view):
//
//   block returns T            -> Future<T>  (synchronous block)
//   block returns Result<T>    -> Future<T>  (its Error reaches the caller as is)
//   block returns Future<T>    -> Future<T>  (asynchronous block: the key stays
//                                            held until that future completes)
//   block returns void         -> Future<std::monostate>
//
// A block that throws frees the lock; the caller's Result holds an Error
// (handler_failed) carrying the original exception, which
// `error().rethrow_if_exception()` throws again unchanged.
//
// Timeouts (one policy per KeyedLock, from KeyedLockSettings):
// - wait (L2): a request not granted within `wait_timeout` is answered with
//   ErrorCode::acquire_timeout and its block never runs. A zero wait is a
//   try-lock.
// - lease (L3): a holder whose block has not finished within `lease` loses
//   the lock: its caller gets ErrorCode::lease_expired, the next waiter is
//   granted, and the expired holder's fencing token stops being current.
//   A late result of that block is dropped. Every grant carries a token that
//   strictly increases per key (LockLease::token); pass it to whatever the
//   block changes, or check LockLease::is_current() before a side effect.
//
// Where blocks run. A synchronous block runs on the worker thread of the
// key's shard, between that shard's messages: treat it like a critical
// section under a mutex — short and non-blocking. It cannot be interrupted,
// so the lease of a synchronous block is checked when it returns (an
// overrun answers lease_expired, as above). A block that waits for anything
// (an ask, I/O, another lock) returns a Future instead; it then holds the
// key but not the thread, and its lease is enforced while it runs. Never
// block a thread on a Future inside a block.
//
// Per-key state (L5) lives in shard actors (key -> shard by hash, as entity
// ids map to shards), so one key has exactly one owner by construction. A
// key's state is kept while it is in use and freed once it has been idle for
// `idle_after`: freeing happens in the same shard, between requests, from a
// list of idle keys in idle order, so it never scans busy keys and never
// races a request for the same key.
//
// LockLease, what a block gets, is in lock_lease.hpp; the requests and the
// seam to where they run are in detail/lock_request.hpp and
// detail/lock_backend.hpp.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/result.hpp"
#include "troupe/patterns/detail/lock_backend.hpp"
#include "troupe/patterns/detail/lock_request.hpp"
#include "troupe/patterns/lock_lease.hpp"

namespace troupe {

struct KeyedLockSettings {
  // Names the lock in errors and logs.
  std::string name = "lock";
  // How long a request may wait for its key (L2). Zero: try-lock.
  Duration wait_timeout = std::chrono::seconds(5);
  // How long a holder may keep its key (L3). Positive.
  Duration lease = std::chrono::seconds(30);
  // A key's state is freed after it has been idle this long (L5). Positive.
  Duration idle_after = std::chrono::seconds(60);
  // Shard actors; 0 = 8 per worker thread. Rounded up to a power of two.
  std::size_t shards = 0;
  // Tokens are drawn above this value. 0: the wall clock in nanoseconds at
  // start (tokens then grow across restarts, see LockLease::token). A
  // cluster-wide lock sets it from the shard's placement epoch.
  std::uint64_t first_token = 0;
};

// Counters since start, summed over shards. A snapshot: fields are read one
// by one while shards keep counting.
struct LockStats {
  std::uint64_t grants = 0;            // blocks started
  std::uint64_t waits = 0;             // requests that had to queue behind a holder
  std::uint64_t acquire_timeouts = 0;  // requests answered acquire_timeout (L2)
  std::uint64_t lease_expiries = 0;    // holders answered lease_expired (L3)
  std::uint64_t block_failures = 0;    // blocks that threw or returned an error
  std::uint64_t keys_freed = 0;        // idle key states freed (L5)
  std::uint64_t live_keys = 0;         // key states held right now
  std::uint64_t waiting = 0;           // requests queued right now
};

// A set of per-key locks with one wait/lease policy. A cheap handle: copies
// share the same lock; all members are thread-safe. The shard actors belong
// to the actor system given to start(); they stop with it (or with stop()),
// and every request still waiting or running is then answered with
// shutting_down. The same handle, made by troupe::cluster::start_keyed_lock,
// is a cluster-wide lock (L6): keys are routed to their owner node by
// sharding, blocks run on the caller's node.
class KeyedLock {
 public:
  // Starts the shard actors. invalid_argument for unusable settings.
  static Result<KeyedLock> start(ActorSystem& system, KeyedLockSettings settings);

  // Runs block(const LockLease&) holding `key`; see the top of this file for
  // the block's forms and what the Future holds. An empty key is allowed
  // (it is a key like any other).
  template <class F>
    requires std::is_invocable_v<F&, const LockLease&>
  auto lock(std::string_view key, F&& block) const
      -> Future<typename detail::LockValue<std::invoke_result_t<F&, const LockLease&>>::type> {
    using R = typename detail::LockValue<std::invoke_result_t<F&, const LockLease&>>::type;
    Promise<R> p;
    Future<R> f = p.future();
    std::size_t h = std::hash<std::string_view>{}(key);
    std::unique_ptr<detail::LockRequest> req(new detail::LockRequestImpl<std::decay_t<F>, R>(
        std::string(key), h, std::forward<F>(block), std::move(p)));
    // A refused message (the lock or the system stopped) destroys the
    // request, which answers shutting_down.
    detail::lock_submit(*shared_, std::move(req));
    return f;
  }

  LockStats stats() const;
  const KeyedLockSettings& settings() const noexcept;

  // Stops the shards once they have handled what is already queued. Waiting
  // and running requests are then answered with shutting_down; requests made
  // after that are answered shutting_down at once.
  void stop() const;

 private:
  friend KeyedLock detail::make_keyed_lock(KeyedLockSettings, std::shared_ptr<detail::LockBackend>);
  explicit KeyedLock(std::shared_ptr<detail::LockShared> s) : shared_(std::move(s)) {}
  std::shared_ptr<detail::LockShared> shared_;
};

}  // namespace troupe
