// Keyed lock shards: the per-key queues, the wait and lease deadlines and the
// idle-key list. See include/troupe/patterns/keyed_lock.hpp for the contract.

#include "troupe/patterns/keyed_lock.hpp"

#include <algorithm>
#include <bit>
#include <string>
#include <unordered_map>

namespace troupe {
namespace detail {

struct LockShardMsg {
  enum class Kind : std::uint8_t { acquire, finished, wait_tick, lease_tick, sweep_tick };
  Kind kind = Kind::acquire;
  std::unique_ptr<LockRequest> req{};
};

namespace {

// Written only by the owning shard's thread, read by stats(): relaxed
// load+store instead of read-modify-write, one cache line per shard.
struct alignas(64) ShardCounters {
  std::atomic<std::uint64_t> grants{0}, waits{0}, acquire_timeouts{0}, lease_expiries{0},
      block_failures{0}, keys_freed{0}, live_keys{0}, waiting{0};
};

inline void bump(std::atomic<std::uint64_t>& c, std::int64_t by = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + static_cast<std::uint64_t>(by), std::memory_order_relaxed);
}

}  // namespace

struct LockShared {
  KeyedLockSettings settings;
  std::vector<ActorRef<LockShardMsg>> shards;
  std::size_t mask = 0;
  // Shared with the shard actors, which may outlive every KeyedLock handle.
  std::shared_ptr<ShardCounters[]> counters;
  // Set instead of the shards for a lock whose requests go elsewhere.
  std::shared_ptr<LockBackend> backend;
};

void lock_submit(const LockShared& s, std::unique_ptr<LockRequest> req) {
  if (s.backend) {
    s.backend->submit(std::move(req));
    return;
  }
  // By reference: copying a ref would bounce the shard's reference count
  // between every caller's thread.
  const ActorRef<LockShardMsg>& shard = s.shards[req->hash & s.mask];
  shard.tell(LockShardMsg{LockShardMsg::Kind::acquire, std::move(req)});
}

KeyedLock make_keyed_lock(KeyedLockSettings settings, std::shared_ptr<LockBackend> backend) {
  auto shared = std::make_shared<LockShared>();
  shared->settings = std::move(settings);
  shared->backend = std::move(backend);
  return KeyedLock(std::move(shared));
}

struct LockKeyState {
  std::shared_ptr<LockKeyCell> cell;
  LockRequest* holder = nullptr;
  LockRequest* wait_head = nullptr;  // FIFO of waiters (LockRequest::next_waiter)
  LockRequest* wait_tail = nullptr;
  std::uint32_t pins = 0;  // expired asynchronous holders whose result is still to come
  bool idle = false;       // on the shard's idle list
  LockKeyState* idle_prev = nullptr;
  LockKeyState* idle_next = nullptr;
  TimePoint idle_since{};

  bool unused() const noexcept { return !holder && !wait_head && pins == 0; }
};

namespace {

// Intrusive list of requests in deadline order. Every request of one list
// has the same timeout, so appending keeps the order.
struct DeadlineList {
  LockRequest* head = nullptr;
  LockRequest* tail = nullptr;
  void push_back(LockRequest* r) noexcept {
    r->prev = tail;
    r->next = nullptr;
    (tail ? tail->next : head) = r;
    tail = r;
  }
  void remove(LockRequest* r) noexcept {
    (r->prev ? r->prev->next : head) = r->next;
    (r->next ? r->next->prev : tail) = r->prev;
    r->prev = r->next = nullptr;
  }
};

using Msg = LockShardMsg;
using Kind = LockShardMsg::Kind;

// The key map looks keys up with the hash the caller computed already (it
// picked the shard with it), so a lock hashes its key once.
struct KeyLookup {
  std::string_view key;
  std::size_t hash;
};
struct KeyHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view k) const noexcept { return std::hash<std::string_view>{}(k); }
  std::size_t operator()(const KeyLookup& k) const noexcept { return k.hash; }
};
struct KeyEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
  bool operator()(const KeyLookup& a, std::string_view b) const noexcept { return a.key == b; }
  bool operator()(std::string_view a, const KeyLookup& b) const noexcept { return a == b.key; }
};

class LockShard final : public Actor<LockShardMsg> {
 public:
  LockShard(std::shared_ptr<const KeyedLockSettings> settings, std::shared_ptr<ShardCounters> counters)
      : settings_(std::move(settings)), counters_(std::move(counters)), c_(*counters_) {}

  void on_start() {
    sink_ = std::make_shared<ShardSink>(self_ref());
    if (cfg().first_token != 0) {
      next_token_ = cfg().first_token;
      return;
    }
    // Tokens start at the wall clock in nanoseconds so that they keep
    // growing across a restart; see LockLease::token.
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wall_now().time_since_epoch()).count();
    next_token_ = ns > 0 ? static_cast<std::uint64_t>(ns) : 1;
  }

  void receive(Msg& m) {
    switch (m.kind) {
      case Kind::acquire: acquire(std::move(m.req)); break;
      case Kind::finished: finished(std::move(m.req)); break;
      case Kind::wait_tick: wait_armed_ = false; expire_waiters(); break;
      case Kind::lease_tick: lease_armed_ = false; expire_leases(); break;
      case Kind::sweep_tick: sweep_armed_ = false; sweep(); break;
    }
  }

  void on_stop() {
    Error stopped(ErrorCode::shutting_down, "keyed lock '" + settings_->name + "' has stopped");
    // Waiters belong to the shard: answer and free them.
    while (LockRequest* r = waits_.head) {
      waits_.remove(r);
      r->fail(stopped);
      delete r;
    }
    // Asynchronous holders belong to their block's continuation, which will
    // find this shard gone and free them; answer their callers now.
    while (LockRequest* r = leases_.head) {
      leases_.remove(r);
      r->fail(stopped);
    }
    for (auto& [k, ks] : keys_) ks.cell->current.store(0, std::memory_order_release);
    bump(c_.live_keys, -static_cast<std::int64_t>(keys_.size()));
    c_.waiting.store(0, std::memory_order_relaxed);
    keys_.clear();
  }

 private:
  const KeyedLockSettings& cfg() const noexcept { return *settings_; }

  LockKeyState& state_for(LockRequest& r) {
    if (auto it = keys_.find(KeyLookup{r.key, r.hash}); it != keys_.end()) {
      if (it->second.idle) unidle(it->second);
      return it->second;
    }
    auto cell = std::make_shared<LockKeyCell>(std::move(r.key));
    std::string_view k(cell->key);
    auto& ks = keys_.try_emplace(k).first->second;
    ks.cell = std::move(cell);
    bump(c_.live_keys);
    return ks;
  }

  void acquire(std::unique_ptr<LockRequest> req) {
    LockKeyState& ks = state_for(*req);
    req->ks = &ks;
    if (!ks.holder && !ks.wait_head) {
      grant(ks, std::move(req));
      pump(ks);
      return;
    }
    if (cfg().wait_timeout <= Duration::zero()) {
      bump(c_.acquire_timeouts);
      req->fail(acquire_timeout_error(ks));
      return;
    }
    bump(c_.waits);
    bump(c_.waiting);
    LockRequest* r = req.release();
    r->deadline = deadline_after(now(), cfg().wait_timeout);
    r->next_waiter = nullptr;
    (ks.wait_tail ? ks.wait_tail->next_waiter : ks.wait_head) = r;
    ks.wait_tail = r;
    waits_.push_back(r);
    arm(wait_armed_, "wait", Kind::wait_tick, r->deadline);
  }

  // Grants `req` the key. A synchronous block runs here and now, and the key
  // is free again when grant returns; pump() then serves the next waiter.
  void grant(LockKeyState& ks, std::unique_ptr<LockRequest> req) {
    std::uint64_t token = ++next_token_;
    LockRequest* r = req.get();
    r->token = token;
    ks.holder = r;
    ks.cell->current.store(token, std::memory_order_release);
    bump(c_.grants);
    TimePoint t0 = coarse_now();
    bool done = r->start(req, LockLease(ks.cell, token), sink_);
    if (!done) {  // asynchronous: the continuation owns the request now
      now_ = now();
      r->deadline = deadline_after(now_, cfg().lease);
      leases_.push_back(r);
      arm(lease_armed_, "lease", Kind::lease_tick, r->deadline);
      return;
    }
    ks.holder = nullptr;
    ks.cell->current.store(0, std::memory_order_release);
    // The lease of a block that already returned is checked on the coarse
    // clock: a tick of slack against a lease of seconds.
    now_ = coarse_now();
    if (now_ - t0 > cfg().lease) {
      bump(c_.lease_expiries);
      r->fail(lease_expired_error(ks, token));
    } else {
      if (r->failed()) bump(c_.block_failures);
      r->finish();
    }
  }

  // Serves waiters while the key is free. A loop rather than recursion: a
  // queue of synchronous blocks must not grow the stack.
  void pump(LockKeyState& ks) {
    while (!ks.holder && ks.wait_head) {
      LockRequest* r = ks.wait_head;
      ks.wait_head = r->next_waiter;
      if (!ks.wait_head) ks.wait_tail = nullptr;
      waits_.remove(r);
      bump(c_.waiting, -1);
      grant(ks, std::unique_ptr<LockRequest>(r));
    }
    maybe_idle(ks);
  }

  void finished(std::unique_ptr<LockRequest> req) {
    LockKeyState& ks = *req->ks;
    now_ = coarse_now();
    if (req->expired) {  // its caller already has lease_expired; drop the late result
      --ks.pins;
      maybe_idle(ks);
      return;
    }
    leases_.remove(req.get());
    ks.holder = nullptr;
    ks.cell->current.store(0, std::memory_order_release);
    if (req->failed()) bump(c_.block_failures);
    req->finish();
    req.reset();
    pump(ks);
  }

  void expire_waiters() {
    TimePoint t = now_ = now();
    while (LockRequest* r = waits_.head) {
      if (r->deadline > t) break;
      LockKeyState& ks = *r->ks;
      // One wait timeout for all: a key's earliest waiter expires first, so
      // the expired request is the head of its key's queue.
      ks.wait_head = r->next_waiter;
      if (!ks.wait_head) ks.wait_tail = nullptr;
      waits_.remove(r);
      bump(c_.waiting, -1);
      bump(c_.acquire_timeouts);
      std::unique_ptr<LockRequest> owned(r);
      owned->fail(acquire_timeout_error(ks));
      maybe_idle(ks);
    }
    if (waits_.head) arm(wait_armed_, "wait", Kind::wait_tick, waits_.head->deadline);
  }

  void expire_leases() {
    TimePoint t = now_ = now();
    while (LockRequest* r = leases_.head) {
      if (r->deadline > t) break;
      LockKeyState& ks = *r->ks;
      leases_.remove(r);
      r->expired = true;  // still owned by its block's continuation
      ++ks.pins;
      ks.holder = nullptr;
      ks.cell->current.store(0, std::memory_order_release);
      bump(c_.lease_expiries);
      r->fail(lease_expired_error(ks, r->token));
      pump(ks);
    }
    if (leases_.head) arm(lease_armed_, "lease", Kind::lease_tick, leases_.head->deadline);
  }

  // Idle keys, oldest first; freed after settings.idle_after. The idle time
  // is the shard's last clock reading in this message (now_, often the
  // coarse clock), which every path that can leave a key unused takes
  // first: no clock read of its own.
  void maybe_idle(LockKeyState& ks) {
    if (ks.idle || !ks.unused()) return;
    ks.idle = true;
    ks.idle_since = now_;
    ks.idle_prev = idle_tail_;
    ks.idle_next = nullptr;
    (idle_tail_ ? idle_tail_->idle_next : idle_head_) = &ks;
    idle_tail_ = &ks;
    arm(sweep_armed_, "sweep", Kind::sweep_tick, deadline_after(ks.idle_since, cfg().idle_after));
  }
  void unidle(LockKeyState& ks) noexcept {
    (ks.idle_prev ? ks.idle_prev->idle_next : idle_head_) = ks.idle_next;
    (ks.idle_next ? ks.idle_next->idle_prev : idle_tail_) = ks.idle_prev;
    ks.idle_prev = ks.idle_next = nullptr;
    ks.idle = false;
  }
  void sweep() {
    TimePoint t = now();
    // Bounded work per tick so that a mass expiry does not hold up requests.
    for (int n = 0; idle_head_ && n < kSweepBatch; ++n) {
      LockKeyState* ks = idle_head_;
      if (deadline_after(ks->idle_since, cfg().idle_after) > t) break;
      unidle(*ks);
      std::shared_ptr<LockKeyCell> cell = std::move(ks->cell);  // keeps the map's key alive for erase
      keys_.erase(std::string_view(cell->key));
      bump(c_.live_keys, -1);
      bump(c_.keys_freed);
    }
    if (!idle_head_) return;
    if (deadline_after(idle_head_->idle_since, cfg().idle_after) <= t) {
      sweep_armed_ = true;
      self_ref().tell(Msg{Kind::sweep_tick, nullptr});
    } else {
      arm(sweep_armed_, "sweep", Kind::sweep_tick, deadline_after(idle_head_->idle_since, cfg().idle_after));
    }
  }

  void arm(bool& armed, const char* key, Kind kind, TimePoint at) {
    if (armed) return;
    armed = true;
    TimePoint t = now();
    start_timer(key, at > t ? at - t : Duration::zero(), Msg{kind, nullptr});
  }

  Error acquire_timeout_error(const LockKeyState& ks) const {
    return Error(ErrorCode::acquire_timeout, "keyed lock '" + cfg().name + "': key '" + ks.cell->key +
                                                 "' not acquired within " + lock_duration_text(cfg().wait_timeout));
  }
  Error lease_expired_error(const LockKeyState& ks, std::uint64_t token) const {
    return lock_lease_expired(cfg(), ks.cell->key, token);
  }

  const ActorRef<Msg>& self_ref() {
    if (!self_) self_ = self();
    return self_;
  }

  static constexpr int kSweepBatch = 4096;

  // Brings an asynchronous block's request back to this shard.
  class ShardSink final : public LockSink {
   public:
    explicit ShardSink(ActorRef<Msg> shard) : shard_(std::move(shard)) {}
    void finished(std::unique_ptr<LockRequest> req) override {
      shard_.tell(Msg{Kind::finished, std::move(req)});
    }

   private:
    ActorRef<Msg> shard_;
  };

  std::shared_ptr<const KeyedLockSettings> settings_;
  std::shared_ptr<ShardCounters> counters_;
  ShardCounters& c_;
  ActorRef<Msg> self_;
  std::shared_ptr<ShardSink> sink_;
  std::unordered_map<std::string_view, LockKeyState, KeyHash, KeyEq> keys_;
  DeadlineList waits_;
  DeadlineList leases_;
  LockKeyState* idle_head_ = nullptr;
  LockKeyState* idle_tail_ = nullptr;
  std::uint64_t next_token_ = 1;
  TimePoint now_{};  // see maybe_idle
  bool wait_armed_ = false;
  bool lease_armed_ = false;
  bool sweep_armed_ = false;
};

}  // namespace
}  // namespace detail

namespace detail {
std::string lock_duration_text(Duration d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

Error lock_lease_expired(const KeyedLockSettings& settings, std::string_view key, std::uint64_t token) {
  return Error(ErrorCode::lease_expired, "keyed lock '" + settings.name + "': the block for key '" +
                                             std::string(key) + "' ran past its lease of " +
                                             lock_duration_text(settings.lease) + "; token " +
                                             std::to_string(token) + " is no longer current");
}

Result<void> check_lock_settings(const KeyedLockSettings& settings) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "keyed lock '" + settings.name + "': " + what);
  };
  if (settings.name.empty()) return Error(ErrorCode::invalid_argument, "keyed lock: name must not be empty");
  if (settings.wait_timeout < Duration::zero()) return bad("wait_timeout must not be negative");
  if (settings.lease <= Duration::zero()) return bad("lease must be positive");
  if (settings.idle_after <= Duration::zero()) return bad("idle_after must be positive");
  if (settings.shards > (std::size_t{1} << 16)) return bad("shards must be at most 65536");
  return {};
}
}  // namespace detail

Result<KeyedLock> KeyedLock::start(ActorSystem& system, KeyedLockSettings settings) {
  if (auto ok = detail::check_lock_settings(settings); !ok.ok()) return std::move(ok).error();
  std::size_t n = settings.shards ? settings.shards : 8 * std::max<std::size_t>(1, system.threads());
  n = std::bit_ceil(n);
  settings.shards = n;

  auto shared = std::make_shared<detail::LockShared>();
  shared->settings = settings;
  shared->mask = n - 1;
  shared->counters = std::shared_ptr<detail::ShardCounters[]>(new detail::ShardCounters[n]);
  auto cfg = std::make_shared<const KeyedLockSettings>(settings);
  shared->shards.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto ref = system.spawn<detail::LockShard>(SpawnOptions{.name = settings.name + "-lock-" + std::to_string(i)},
                                               cfg, std::shared_ptr<detail::ShardCounters>(shared->counters, &shared->counters[i]));
    if (!ref) return Error(ErrorCode::shutting_down, "keyed lock '" + settings.name + "': the actor system is shutting down");
    shared->shards.push_back(std::move(ref));
  }
  return KeyedLock(std::move(shared));
}

LockStats KeyedLock::stats() const {
  if (shared_->backend) return shared_->backend->stats();
  LockStats s;
  for (std::size_t i = 0; i <= shared_->mask; ++i) {
    auto& c = shared_->counters[i];
    auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    s.grants += ld(c.grants);
    s.waits += ld(c.waits);
    s.acquire_timeouts += ld(c.acquire_timeouts);
    s.lease_expiries += ld(c.lease_expiries);
    s.block_failures += ld(c.block_failures);
    s.keys_freed += ld(c.keys_freed);
    s.live_keys += ld(c.live_keys);
    s.waiting += ld(c.waiting);
  }
  return s;
}

const KeyedLockSettings& KeyedLock::settings() const noexcept { return shared_->settings; }

void KeyedLock::stop() const {
  if (shared_->backend) shared_->backend->stop();
  for (auto& s : shared_->shards) s.stop();
}

}  // namespace troupe
