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

#include <atomic>
#include <functional>
#include <cstddef>
#include <cstdint>
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

namespace detail {

// Shared between a key's state and the leases handed out for it.
struct LockKeyCell {
  explicit LockKeyCell(std::string k) : key(std::move(k)) {}
  LockKeyCell(std::string k, const Clock* c, TimePoint end) : key(std::move(k)), clock(c), until(end) {}
  std::string key;
  std::atomic<std::uint64_t> current{0};  // token of the holder, 0 if none
  // A grant held away from its owner (cluster-wide lock) also ends at
  // `until` on `clock`, whether or not anything has run since.
  const Clock* clock = nullptr;
  TimePoint until = TimePoint::max();
};

}  // namespace detail

// What a block gets: its key, its fencing token and whether that token is
// still the key's current one. Copyable; is_current() may be called from any
// thread, also after the block returned (then it is false), while the actor
// system that granted it exists.
class LockLease {
 public:
  LockLease(std::shared_ptr<const detail::LockKeyCell> cell, std::uint64_t token)
      : cell_(std::move(cell)), token_(token) {}
  const std::string& key() const noexcept { return cell_->key; }
  // Strictly increasing per key: also across a restart of the process as
  // long as the wall clock does not step back (tokens start from the wall
  // clock in nanoseconds and grow by one per grant). For a cluster-wide
  // lock, also across moves of the key's shard between nodes (its
  // placement epoch is the token's high part; doc/lock.md).
  std::uint64_t token() const noexcept { return token_; }
  // True while this grant still holds the key: false once the block has
  // finished, its lease expired, or the lock stopped.
  bool is_current() const noexcept {
    if (cell_->current.load(std::memory_order_acquire) != token_) return false;
    return !cell_->clock || cell_->clock->now() < cell_->until;
  }

 private:
  std::shared_ptr<const detail::LockKeyCell> cell_;
  std::uint64_t token_;
};

namespace detail {

struct LockKeyState;
class LockRequest;

// Where a request goes back to when the Future its block returned
// completes: the shard that granted it, or for a cluster-wide lock the
// node-side client that ran the block. Called on the thread that completed
// the Future.
class LockSink {
 public:
  virtual ~LockSink() = default;
  virtual void finished(std::unique_ptr<LockRequest> req) = 0;
};

// One lock request as a shard sees it. The typed part (block and promise)
// lives in LockRequestImpl; the shard only moves requests between its
// queues, so it needs no knowledge of the caller's types.
class LockRequest : public Pooled {
 public:
  LockRequest(std::string k, std::size_t h) : key(std::move(k)), hash(h) {}
  virtual ~LockRequest() = default;
  LockRequest(const LockRequest&) = delete;
  LockRequest& operator=(const LockRequest&) = delete;

  // Runs the block. Returns true when its outcome is already stored (a
  // synchronous block, or one that threw); false when it returned a pending
  // Future: the request then belongs to that future's continuation (`owner`
  // is moved into it), which hands it back to `sink`.
  virtual bool start(std::unique_ptr<LockRequest>& owner, const LockLease& lease,
                     const std::shared_ptr<LockSink>& sink) = 0;
  // Answers the caller with the stored outcome.
  virtual void finish() = 0;
  // Answers the caller with an error of the lock's own (timeout, expiry, stop).
  virtual void fail(Error e) = 0;
  // Whether the stored outcome is an error (for LockStats::block_failures).
  virtual bool failed() const = 0;

  std::string key;  // moved into the key's cell when the shard creates one
  std::size_t hash;  // of the key: picks the shard, and its map bucket
  // Bookkeeping owned by the shard.
  LockKeyState* ks = nullptr;
  LockRequest* prev = nullptr;  // shard's wait or lease list (deadline order)
  LockRequest* next = nullptr;
  LockRequest* next_waiter = nullptr;  // the key's FIFO
  TimePoint deadline{};
  std::uint64_t token = 0;
  bool expired = false;
};

template <class T>
struct IsFuture : std::false_type {};
template <class T>
struct IsFuture<Future<T>> : std::true_type {};

// The caller-visible value type of a block returning Ret.
template <class Ret>
struct LockValue {
  using type = Ret;
};
template <>
struct LockValue<void> {
  using type = std::monostate;
};
template <class T>
struct LockValue<Future<T>> {
  using type = T;
};
template <class T>
struct LockValue<Result<T>> {
  using type = T;
};

template <class F, class R>
class LockRequestImpl final : public LockRequest {
  using Ret = std::invoke_result_t<F&, const LockLease&>;

 public:
  template <class G>
  LockRequestImpl(std::string k, std::size_t h, G&& block, Promise<R>&& promise)
      : LockRequest(std::move(k), h), block_(std::forward<G>(block)), promise_(std::move(promise)) {}
  ~LockRequestImpl() override {
    // Only a request that never reached a shard, or one whose shard stopped
    // while it was in flight, is still pending here.
    if (promise_.pending())
      promise_.set_error(Error(ErrorCode::shutting_down, "the keyed lock has stopped"));
  }

  bool start(std::unique_ptr<LockRequest>& owner, const LockLease& lease,
             const std::shared_ptr<LockSink>& sink) override {
    try {
      if constexpr (IsFuture<Ret>::value) {
        Ret f = block_(lease);
        std::move(f).then([sink, self = std::move(owner)](Result<R> r) mutable {
          auto* me = static_cast<LockRequestImpl*>(self.get());
          me->outcome_.emplace(std::move(r));
          sink->finished(std::move(self));
        });
        return false;
      } else if constexpr (std::is_void_v<Ret>) {
        block_(lease);
        outcome_.emplace(std::monostate{});
      } else {
        outcome_.emplace(block_(lease));
      }
    } catch (...) {
      outcome_.emplace(Error::from_exception(std::current_exception(),
                                             "the block for key '" + lease.key() + "' threw"));
    }
    return true;
  }
  void finish() override { promise_.set_result(std::move(*outcome_)); }
  void fail(Error e) override { promise_.set_error(std::move(e)); }
  bool failed() const override { return outcome_ && !outcome_->ok(); }

 private:
  F block_;
  Promise<R> promise_;
  std::optional<Result<R>> outcome_;
};

struct LockShared;
// Hands a new request to the lock's shard for its key (or its backend).
void lock_submit(const LockShared& s, std::unique_ptr<LockRequest> req);

// Another home for a KeyedLock's requests: the cluster-wide lock
// (troupe/cluster/cluster_lock.hpp). Thread-safe.
class LockBackend {
 public:
  virtual ~LockBackend() = default;
  // Owns `req` from now on and answers it exactly once.
  virtual void submit(std::unique_ptr<LockRequest> req) = 0;
  virtual LockStats stats() const = 0;
  virtual void stop() = 0;
};

}  // namespace detail

class KeyedLock;
namespace detail {
// invalid_argument naming the first unusable setting.
Result<void> check_lock_settings(const KeyedLockSettings& settings);
// "5s", "250ms": durations in the lock's messages.
std::string lock_duration_text(Duration d);
// What the caller of a block that ran past its lease gets.
Error lock_lease_expired(const KeyedLockSettings& settings, std::string_view key, std::uint64_t token);
// A KeyedLock whose requests go to `backend`; `settings` checked already.
KeyedLock make_keyed_lock(KeyedLockSettings settings, std::shared_ptr<LockBackend> backend);
}  // namespace detail

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
