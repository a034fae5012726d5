#pragma once
// Where a KeyedLock's requests go (keyed_lock.hpp): the shards of a local
// lock (src/patterns/keyed_lock.cpp) or another backend, the cluster-wide
// lock (troupe/cluster/cluster_lock.hpp), and the helpers both share.

#include <memory>
#include <string>
#include <string_view>

#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/patterns/detail/lock_request.hpp"

namespace troupe {

struct KeyedLockSettings;
struct LockStats;
class KeyedLock;

namespace detail {

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

// invalid_argument naming the first unusable setting.
Result<void> check_lock_settings(const KeyedLockSettings& settings);
// "5s", "250ms": durations in the lock's messages.
std::string lock_duration_text(Duration d);
// What the caller of a block that ran past its lease gets.
Error lock_lease_expired(const KeyedLockSettings& settings, std::string_view key, std::uint64_t token);
// A KeyedLock whose requests go to `backend`; `settings` checked already.
KeyedLock make_keyed_lock(KeyedLockSettings settings, std::shared_ptr<LockBackend> backend);

}  // namespace detail
}  // namespace troupe
