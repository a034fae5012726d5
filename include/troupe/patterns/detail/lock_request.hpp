#pragma once
// One keyed-lock request (keyed_lock.hpp): the untyped part a shard moves
// between its queues, the typed part that runs the caller's block and
// answers its Future, and the sink a request returns to when the Future of
// an asynchronous block completes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/patterns/lock_lease.hpp"

namespace troupe::detail {

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

}  // namespace troupe::detail
