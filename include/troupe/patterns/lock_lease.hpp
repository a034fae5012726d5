#pragma once
// What a keyed lock's block gets (keyed_lock.hpp): LockLease, its key, its
// fencing token and whether that token is still current.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "troupe/core/clock.hpp"

namespace troupe {

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

}  // namespace troupe
