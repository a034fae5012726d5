#pragma once
// Cluster sharding: the entities of one type spread over the nodes of a
// cluster (SPEC E5, E6, E7 across nodes).
//
// Every node runs a ShardRegion for each entity type. An entity id maps to
// one of `shard_count` shards by a stable hash (FNV-1a 64 of the id, the
// same on every node and build); a ShardDirectory says which node owns each
// shard (in a cluster, the Redis coordinator: one owner per shard, an epoch
// per move). A command sent to any node's region reaches the entity on the
// shard's owner:
//
//   - owned here: the shard's entities live in a local entity registry
//     (started on demand, recovered from the journal, passivated when idle,
//     stopped gracefully) exactly as on a single node;
//   - owned elsewhere: the command is encoded with the type's
//     MessageCodecs and sent over the node pair's connection; an ask's
//     answer comes back to the asker;
//   - not yet known, being allocated, or being handed off: the command waits
//     in the shard's bounded buffer (buffer_overflow past it), in arrival
//     order, and goes on once the owner is known and ready.
//
// Hand-off (a rebalance move, or this node leaving): the old owner stops the
// shard's entities with the graceful stop of E6 (processing entities finish
// their episode first), then tells the directory it released the shard;
// only then does the new owner start it. Commands that reach the old owner
// meanwhile wait in its buffer and are forwarded to the new owner after the
// release, in order. A node that loses its lease (self-fencing) stops its
// shards at once, before any other node may take them over. That rests on
// timing (a paused process does not stop itself), so the journal enforces
// it too (SPEC E9): a shard's entities write through a FencedJournal with
// fence "<type>/<shard>" at the placement epoch; the new owner raises the
// fence before its first read, after which the journal refuses every append
// of the old owner, which then stops. The primary key (E7) refuses a second
// writer of one sequence number in any case.
//
// Failover (SPEC C1): when the owner dies or leaves while an ask is out to
// it (its connection is lost, or membership removes it), the ask is either
//   - re-sent, if its message type was registered idempotent
//     (MessageOptions::idempotent in its MessageCodecs registration): the
//     shard is located again and the ask waits in the shard's buffer, like
//     any new command, until the directory names an owner that can be
//     reached, then goes there — as long as its asker still waits (the ask's
//     own timeout bounds every retry; an ask whose asker gave up is dropped,
//     never delivered late);
//   - or answered `unreachable`, "may or may not have been handled".
// A command whose send finds the owner gone from the address book was not
// sent at all: a tell or an idempotent ask waits for the next owner; a
// non-idempotent ask is answered `unreachable` as before. Either way the
// commands behind it wait for the shard to be located again, which is
// retried with a growing pause (25 ms up to 0.5 s) while the directory still
// names the departed node. Tells are never re-sent: a tell out on a lost
// connection is lost, as a tell to a local actor that stops may be.
//
// Order: commands from one sender to one entity arrive in the order sent —
// they share one path (buffer, local registry, or the one connection to
// the owner; a forwarding node forwards in arrival order). A node keeps its
// view of a remote shard's owner until that node leaves the cluster, so a
// sender's path does not change under it while a move is in flight: after a
// move, traffic from nodes that knew the old owner is forwarded by it.
// Re-sent asks keep their order among themselves (the asks of one lost
// connection are re-sent in the order they were sent) and go ahead of
// anything sent after they were re-sent. What they may not keep: their
// place before a later command of the same sender that was already on its
// way elsewhere (a non-idempotent ask answered `unreachable`, or a command
// sent to the same owner after the connection broke and before the loss was
// seen, which waits in the transport's queue for a reconnection). A re-sent
// ask may also be handled twice — by the owner that died (or whose
// connection broke) and by the next one — which is what idempotent means.
//
// Thread safety: all members of ShardRegion are thread-safe. Ownership: a
// region shares the actor system, the journal, the remoting layer and the
// directory with the caller, who keeps them alive until stop() returned.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/cluster/messages.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/core/detail/timer_service.hpp"
#include "troupe/persist/entity.hpp"
#include "troupe/persist/fenced_journal.hpp"

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

// Where shards live. Implemented over the Redis coordinator for a cluster
// (RedisShardDirectory) and in memory for one process (StaticShardDirectory).
// Implementations are thread-safe; callbacks they make must not block.
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
  };
  using Located = troupe::detail::UniqueFunction<void(Result<Location>)>;

  virtual ~ShardDirectory() = default;
  virtual const std::string& self() const = 0;
  // A region of entity type `type` with `shard_count` shards runs on this
  // node. invalid_argument if the type is attached already.
  virtual Result<void> attach(const std::string& type, std::uint32_t shard_count, Host host) = 0;
  virtual void detach(const std::string& type) = 0;
  // Where `shard` lives, allocating it (least-loaded live node) if nobody
  // owns it. The owner may be this node before start() was called for it
  // (a hand-off still running): the region then waits for start().
  virtual void locate(const std::string& type, std::uint32_t shard, Located done) = 0;
  // This node stopped `shard` (held at `epoch`) after stop().
  virtual void released(const std::string& type, std::uint32_t shard, std::uint64_t epoch) = 0;
};

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

namespace detail {

inline std::string shard_group(std::string_view type) { return "shards/" + std::string(type); }

template <class B>
class RegionCore : public std::enable_shared_from_this<RegionCore<B>> {
 public:
  using Command = troupe::detail::CommandOf<B>;
  using Event = troupe::detail::EventOf<B>;
  using State = troupe::detail::StateOf<B>;
  using Factory = std::function<B(const std::string&)>;

  ActorSystem* system = nullptr;
  std::shared_ptr<Journal> journal;
  Remoting* remoting = nullptr;
  ShardDirectory* directory = nullptr;
  ShardRegionSettings settings;
  EventCodecs<Event> event_codecs;
  MessageCodecs<Command> codecs;
  Factory factory;
  std::optional<StateCodec<State>> snapshots;
  std::string inbox_name;

  enum class Phase { unknown, locating, local, remote, waiting, stopping };
  struct Pending {
    std::string id;
    Command cmd;
    std::uint8_t hops = 0;
    // An idempotent ask sent again after its owner was lost: dropped rather
    // than delivered once its asker no longer waits.
    bool resent = false;
  };
  struct Shard {
    std::mutex mu;
    Phase phase = Phase::unknown;
    std::string owner;
    std::uint64_t epoch = 0;
    std::optional<EntityRegistry<B>> host;
    std::deque<Pending> buffer;
    // Started here again while the previous registry was still stopping:
    // the epoch to open with once it has.
    std::optional<std::uint64_t> restart_epoch;
    // Locating again after the owner turned out gone: the pause before the
    // next locate (zero once a send went out), and whether one is armed.
    Duration relocate_delay{};
    bool relocate_armed = false;
  };
  std::unique_ptr<Shard[]> shards;

  std::atomic<std::uint64_t> hosted{0}, started{0}, handed_off{0}, buffered{0}, sent_remote{0}, received_remote{0},
      forwarded{0}, refused{0}, resent{0};
  std::atomic<bool> stopping{false};
  // Registries of shards handed off or stopped still count in the stats.
  std::mutex retired_mu;
  EntityStats retired{};

  void refuse(Command& c, const Error& e) {
    refused.fetch_add(1, std::memory_order_relaxed);
    troupe::detail::with_reply_target(c, [&](auto* rt) {
      if (rt && rt->pending()) rt->fail(e);
    });
  }

  // Routes a command to its entity from any thread.
  void route(std::string id, Command cmd, std::uint8_t hops) {
    if (hops > settings.max_hops) {
      refuse(cmd, Error(ErrorCode::unreachable, "entity '" + settings.entity.type_name + "|" + id +
                                                    "': forwarded " + std::to_string(hops) + " times without reaching its shard's owner"));
      return;
    }
    std::uint32_t s = shard_of(id, settings.shard_count);
    Shard& sh = shards[s];
    std::unique_lock lk(sh.mu);
    route_locked(lk, sh, s, std::move(id), std::move(cmd), hops, false);
  }

  void route_locked(std::unique_lock<std::mutex>& lk, Shard& sh, std::uint32_t s, std::string id, Command cmd,
                    std::uint8_t hops, bool resent_cmd) {
    switch (sh.phase) {
      case Phase::local:
        return deliver_local(sh, std::move(id), std::move(cmd));
      case Phase::remote:
        return send_remote(sh, s, std::move(id), std::move(cmd), hops);
      case Phase::unknown:
        if (!hold(sh, std::move(id), std::move(cmd), hops, resent_cmd)) return;
        sh.phase = Phase::locating;
        lk.unlock();
        return locate(s);
      case Phase::locating:
      case Phase::waiting:
      case Phase::stopping:
        (void)hold(sh, std::move(id), std::move(cmd), hops, resent_cmd);
        return;
    }
  }

  bool hold(Shard& sh, std::string id, Command cmd, std::uint8_t hops, bool resent_cmd = false) {
    if (stopping.load(std::memory_order_acquire)) {
      refuse(cmd, Error(ErrorCode::shutting_down, "entity type '" + settings.entity.type_name + "' is stopping on node '" +
                                                      directory->self() + "'"));
      return false;
    }
    if (sh.buffer.size() >= settings.buffer_per_shard) {
      refuse(cmd, Error(ErrorCode::buffer_overflow, "entity '" + settings.entity.type_name + "|" + id + "': " +
                                                        std::to_string(settings.buffer_per_shard) +
                                                        " commands already wait for its shard's owner"));
      return false;
    }
    sh.buffer.push_back(Pending{std::move(id), std::move(cmd), hops, resent_cmd});
    buffered.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  void deliver_local(Shard& sh, std::string id, Command cmd) {
    // The registry answers a command it refuses (stopping) through its reply
    // target, so nothing more to do on error.
    (void)sh.host->tell(id, std::move(cmd));
  }

  static bool reply_pending(Command& c) {
    bool pending = false;
    troupe::detail::with_reply_target(c, [&](auto* rt) { pending = rt && rt->pending(); });
    return pending;
  }

  // Starts an entity frame in the thread's scratch writer: request id
  // (patched for an ask), inbox, shard, hops, entity id, message id
  // (patched). Returns where the message id goes.
  std::size_t begin_frame(ByteWriter& w, std::uint32_t s, std::uint8_t hops, const std::string& id) {
    w.bytes().clear();
    w.u64(0);
    w.str(inbox_name);
    w.u32(s);
    w.u8(hops);
    w.str(id);
    std::size_t id_at = w.bytes().size();
    w.u32(0);
    return id_at;
  }
  static void patch(std::string& b, std::size_t at, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }

  // With sh.mu held and a phase of remote.
  void send_remote(Shard& sh, std::uint32_t s, std::string id, Command cmd, std::uint8_t hops) {
    if (codecs.idempotent(cmd) && reply_pending(cmd)) return send_idempotent(sh, s, std::move(id), std::move(cmd), hops);
    ByteWriter& w = scratch_writer();
    std::size_t id_at = begin_frame(w, s, hops, id);
    std::optional<PendingReply> reply;
    auto msg_id = codecs.encode(cmd, w, reply);
    if (!msg_id.ok()) {
      refuse(cmd, msg_id.error());
      return;
    }
    auto& b = w.bytes();
    patch(b, id_at, msg_id.value(), 4);
    sent_remote.fetch_add(1, std::memory_order_relaxed);
    Result<void> sent;
    if (reply) {
      std::uint64_t req = add_pending(remoting->core(), sh.owner, std::move(*reply), ask_forget_after);
      patch(b, 0, req, 8);
      sent = send_frame(remoting->core(), sh.owner, RemoteKind::entity_ask, b);
      if (!sent.ok()) fail_pending(remoting->core(), req, sent.error());
    } else {
      // A tell carries no request id: skip the 8 placeholder bytes.
      sent = send_frame(remoting->core(), sh.owner, RemoteKind::entity_tell, std::string_view(b).substr(8));
      // Not sent because its owner left: it waits for the next one.
      if (!sent.ok() && sent.error().code() == ErrorCode::unreachable) {
        (void)hold(sh, std::move(id), std::move(cmd), hops);
      } else if (!sent.ok()) {
        refused.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (sent.ok()) {
      sh.relocate_delay = Duration::zero();
    } else if (sent.error().code() == ErrorCode::unreachable) {
      owner_gone(sh, s);
    }
  }

  // An idempotent ask out to another node, kept whole (with its reply
  // target) so that it can be sent again if that node goes away before
  // answering. Whoever claims it first owns `cmd`: the reply function, or
  // send_idempotent() taking it back after a send that failed.
  struct InFlight {
    std::string id;
    std::string owner;
    std::uint32_t shard = 0;
    std::uint8_t hops = 0;
    std::optional<Command> cmd;
    std::atomic<bool> claimed{false};
    bool claim() noexcept { return !claimed.exchange(true, std::memory_order_acq_rel); }
  };

  // With sh.mu held and a phase of remote; `cmd` has a pending reply target.
  void send_idempotent(Shard& sh, std::uint32_t s, std::string id, Command cmd, std::uint8_t hops) {
    ByteWriter& w = scratch_writer();
    std::size_t id_at = begin_frame(w, s, hops, id);
    auto msg_id = codecs.encode(std::as_const(cmd), w);
    if (!msg_id.ok()) {
      refuse(cmd, msg_id.error());
      return;
    }
    auto flight = std::make_shared<InFlight>();
    flight->id = std::move(id);
    flight->owner = sh.owner;
    flight->shard = s;
    flight->hops = hops;
    flight->cmd.emplace(std::move(cmd));
    std::weak_ptr<RegionCore> self = this->shared_from_this();
    std::uint64_t req = add_pending(
        remoting->core(), sh.owner,
        [self, flight](Result<std::string_view> r) { answered(self, *flight, std::move(r)); }, ask_forget_after);
    auto& b = w.bytes();
    patch(b, id_at, msg_id.value(), 4);
    patch(b, 0, req, 8);
    sent_remote.fetch_add(1, std::memory_order_relaxed);
    auto sent = send_frame(remoting->core(), sh.owner, RemoteKind::entity_ask, b);
    if (sent.ok()) {
      sh.relocate_delay = Duration::zero();
      return;
    }
    // Not sent. Unless the remoting layer completed it meanwhile (its node
    // was removed on another thread, which re-sends it), take it back.
    if (!flight->claim()) return;
    Command back = std::move(*flight->cmd);
    fail_pending(remoting->core(), req, sent.error());  // forgets it; the reply function finds it claimed
    if (sent.error().code() != ErrorCode::unreachable) {
      refuse(back, sent.error());
      return;
    }
    // Its owner is gone from the address book: nothing went out, so it
    // waits for the shard's next owner like any new command.
    (void)hold(sh, std::move(flight->id), std::move(back), hops, true);
    owner_gone(sh, s);
  }

  // The answer to an idempotent ask, or the failure that ended it.
  static void answered(const std::weak_ptr<RegionCore>& self, InFlight& f, Result<std::string_view> r) {
    // Read first: only the remoting layer failing a lost connection's or a
    // departed node's requests means "the owner went away meanwhile".
    bool lost = !r.ok() && r.error().code() == ErrorCode::unreachable && completing_lost_requests();
    // The owner's node has no region of this type published: it is still
    // starting (placement gave it the shard as soon as it joined). The ask
    // was not delivered, so it goes to whoever placement names, a little
    // later.
    bool undelivered = !r.ok() && r.error().code() == ErrorCode::dead_letter &&
                       r.error().message().starts_with("nothing is published as");
    if (!f.claim()) return;
    Command& cmd = *f.cmd;
    auto core = self.lock();
    if (!core) {
      fail_reply_target(cmd, r.ok() ? Error(ErrorCode::shutting_down, "the shard region is stopped") : r.error());
      return;
    }
    if (lost || undelivered) return core->resend(f, std::move(cmd), std::move(r).error(), undelivered);
    core->codecs.answer(cmd, std::move(r));
  }

  // Sends an idempotent ask again after its owner died or left while it was
  // out; `lost` is what its asker gets if it cannot be.
  void resend(InFlight& f, Command cmd, Error lost, bool later = false) {
    // Its asker's timeout passed: nobody waits for it any more.
    if (!reply_pending(cmd)) return;
    Shard& sh = shards[f.shard];
    std::unique_lock lk(sh.mu);
    if (stopping.load(std::memory_order_acquire)) {
      lk.unlock();
      refuse(cmd, lost);
      return;
    }
    resent.fetch_add(1, std::memory_order_relaxed);
    // The first of the shard's asks to hear of the loss: the shard is
    // located again rather than sent to the same node. A node still
    // starting (`later`) most likely still owns it: located after a pause.
    if (sh.phase == Phase::remote && sh.owner == f.owner) {
      if (later) {
        (void)hold(sh, std::move(f.id), std::move(cmd), f.hops, true);
        owner_gone(sh, f.shard);
        return;
      }
      sh.phase = Phase::unknown;
      sh.owner.clear();
    }
    route_locked(lk, sh, f.shard, std::move(f.id), std::move(cmd), f.hops, true);
  }

  // The owner we knew is gone from the address book (it left or died,
  // possibly before its shards moved when we located this one); with sh.mu
  // held. What waits, and what comes next, stays in the buffer until the
  // directory names an owner that can be reached. Asking it again at once
  // would most likely name the same node, so the next locate waits a
  // little, longer each time.
  void owner_gone(Shard& sh, std::uint32_t s) {
    sh.owner.clear();
    locate_later(sh, s);
  }

  static constexpr Duration kFirstRelocatePause = std::chrono::milliseconds(25);
  static constexpr Duration kMaxRelocatePause = std::chrono::milliseconds(500);

  class RelocateTimer final : public troupe::detail::TimerService::Node {
   public:
    RelocateTimer(std::weak_ptr<RegionCore> core, std::uint32_t s) : core_(std::move(core)), shard_(s) {}

   private:
    void fire() noexcept override {
      if (auto c = core_.lock()) c->relocate(shard_);
    }
    std::weak_ptr<RegionCore> core_;
    std::uint32_t shard_;
  };

  // With sh.mu held.
  void locate_later(Shard& sh, std::uint32_t s) {
    sh.phase = Phase::locating;
    if (sh.relocate_armed) return;
    sh.relocate_delay = sh.relocate_delay == Duration::zero() ? kFirstRelocatePause
                                                              : std::min<Duration>(2 * sh.relocate_delay, kMaxRelocatePause);
    auto& timers = troupe::detail::timers_of(system->impl());
    auto* t = new RelocateTimer(this->weak_from_this(), s);
    bool armed = timers.schedule(t, deadline_after(timers.clock().now(), sh.relocate_delay));
    t->release();
    if (armed) {
      sh.relocate_armed = true;
      return;
    }
    // The actor system is shutting down: no timer fires any more.
    sh.phase = Phase::unknown;
    auto waiting = take_buffer(sh);
    for (auto& p : waiting)
      refuse(p.cmd, Error(ErrorCode::shutting_down, "the actor system of node '" + directory->self() + "' is shutting down"));
  }

  void relocate(std::uint32_t s) {
    Shard& sh = shards[s];
    {
      std::lock_guard lk(sh.mu);
      sh.relocate_armed = false;
      if (sh.phase != Phase::locating) return;
    }
    locate(s);
  }

  // How long a remote ask's bookkeeping outlives an answer that never comes
  // (its future completed with its own timeout long before).
  Duration ask_forget_after = std::chrono::seconds(60);

  void locate(std::uint32_t s) {
    std::weak_ptr<RegionCore> w = this->shared_from_this();
    directory->locate(settings.entity.type_name, s, [w, s](Result<ShardDirectory::Location> loc) {
      if (auto c = w.lock()) c->located(s, std::move(loc));
    });
  }

  void located(std::uint32_t s, Result<ShardDirectory::Location> loc) {
    Shard& sh = shards[s];
    std::unique_lock lk(sh.mu);
    if (sh.phase != Phase::locating) return;  // started meanwhile
    if (!loc.ok()) {
      sh.phase = Phase::unknown;
      auto waiting = take_buffer(sh);
      lk.unlock();
      for (auto& p : waiting) refuse(p.cmd, loc.error());
      return;
    }
    if (loc.value().owner == directory->self()) {
      // Ours, but start() has not come yet (a hand-off in progress, or the
      // directory's start is on its way): wait for it.
      sh.phase = Phase::waiting;
      sh.epoch = loc.value().epoch;
      return;
    }
    sh.phase = Phase::remote;
    sh.owner = loc.value().owner;
    sh.epoch = loc.value().epoch;
    flush(sh, s);
  }

  // Empties the shard's buffer into the caller's hands; with sh.mu held.
  std::deque<Pending> take_buffer(Shard& sh) {
    std::deque<Pending> out;
    out.swap(sh.buffer);
    buffered.fetch_sub(out.size(), std::memory_order_relaxed);
    return out;
  }

  // Sends what waited, in order; with sh.mu held and a phase of local or
  // remote. Should the owner turn out gone on the way (a send finds it
  // removed from the address book), the rest waits for the next one.
  void flush(Shard& sh, std::uint32_t s) {
    auto waiting = take_buffer(sh);
    for (auto& p : waiting) {
      // A re-sent ask whose asker gave up while it waited: nobody to answer.
      if (p.resent && !reply_pending(p.cmd)) continue;
      if (sh.phase == Phase::local) {
        deliver_local(sh, std::move(p.id), std::move(p.cmd));
      } else if (sh.phase == Phase::remote) {
        send_remote(sh, s, std::move(p.id), std::move(p.cmd), p.hops);
      } else {
        (void)hold(sh, std::move(p.id), std::move(p.cmd), p.hops, p.resent);
      }
    }
  }

  void start_shard(std::uint32_t s, std::uint64_t epoch) {
    if (s >= settings.shard_count) return;
    Shard& sh = shards[s];
    std::lock_guard lk(sh.mu);
    if (sh.phase == Phase::local) {
      sh.epoch = epoch;
      return;
    }
    if (sh.phase == Phase::stopping) {
      // Stopped and restarted here before the old registry finished: the
      // start goes on when it has (see retire()).
      sh.epoch = epoch;
      sh.restart_epoch = epoch;
      return;
    }
    open_host(sh, s, epoch);
  }

  void open_host(Shard& sh, std::uint32_t s, std::uint64_t epoch) {
    EntitySettings es = settings.entity;
    es.shards = 1;
    // The shard's entities write under its placement epoch (SPEC E9): once a
    // newer owner has raised the shard's fence, nothing they append is
    // stored, however late this node wakes up. A directory without epochs
    // (0) leaves the journal's primary key as the only guard (E7).
    std::shared_ptr<Journal> writes =
        epoch == 0 ? journal
                   : std::shared_ptr<Journal>(FencedJournal::open(journal, shard_fence(settings.entity.type_name, s, epoch)));
    auto reg = EntityRegistry<B>::start(*system, writes, es, event_codecs, factory, snapshots);
    if (!reg.ok()) {
      // Only shutting_down can happen here (settings were checked at start).
      sh.phase = Phase::unknown;
      auto waiting = take_buffer(sh);
      for (auto& p : waiting) refuse(p.cmd, reg.error());
      return;
    }
    sh.host.emplace(std::move(reg.value()));
    sh.phase = Phase::local;
    sh.owner = directory->self();
    sh.epoch = epoch;
    hosted.fetch_add(1, std::memory_order_relaxed);
    started.fetch_add(1, std::memory_order_relaxed);
    flush(sh, s);
  }

  void stop_shard(std::uint32_t s, std::uint64_t epoch, bool immediate) {
    if (s >= settings.shard_count) return;
    Shard& sh = shards[s];
    std::unique_lock lk(sh.mu);
    if (sh.phase == Phase::stopping) {
      // Already stopping gracefully: a fence makes it immediate.
      if (immediate && sh.host) {
        EntityRegistry<B> reg = *sh.host;
        lk.unlock();
        reg.begin_immediate_stop();
      }
      return;
    }
    if (sh.phase != Phase::local) {
      // Not running here: nothing to hand off.
      if (sh.phase == Phase::waiting) sh.phase = Phase::unknown;
      lk.unlock();
      directory->released(settings.entity.type_name, s, epoch);
      return;
    }
    sh.phase = Phase::stopping;
    EntityRegistry<B> reg = *sh.host;
    lk.unlock();
    if (immediate) {
      reg.begin_immediate_stop();
    } else {
      reg.begin_stop();
    }
    std::weak_ptr<RegionCore> w = this->shared_from_this();
    reg.when_stopped([w, s, epoch] {
      if (auto c = w.lock()) c->retire(s, epoch);
    });
  }

  // The shard's entities have all stopped after stop_shard().
  void retire(std::uint32_t s, std::uint64_t epoch) {
    Shard& sh = shards[s];
    std::unique_lock lk(sh.mu);
    if (sh.host) {
      add_retired(sh.host->stats());
      // Its entities have stopped: its shutdown hook has nothing left to do,
      // and hooks of retired registries would pile up over many hand-offs.
      sh.host->abandon();
      sh.host.reset();
      hosted.fetch_sub(1, std::memory_order_relaxed);
    }
    handed_off.fetch_add(1, std::memory_order_relaxed);
    if (sh.restart_epoch && !stopping.load(std::memory_order_acquire)) {
      std::uint64_t e = *sh.restart_epoch;
      sh.restart_epoch.reset();
      lk.unlock();
      // The old incarnation is released first, then this node opens the
      // shard again at its new epoch.
      directory->released(settings.entity.type_name, s, epoch);
      lk.lock();
      if (sh.phase == Phase::stopping) open_host(sh, s, e);
      return;
    }
    sh.restart_epoch.reset();
    sh.phase = Phase::unknown;
    bool relocate = !sh.buffer.empty() && !stopping.load(std::memory_order_acquire);
    if (relocate) sh.phase = Phase::locating;
    lk.unlock();
    directory->released(settings.entity.type_name, s, epoch);
    if (relocate) locate(s);
  }

  void node_left(std::string_view node) {
    for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
      Shard& sh = shards[s];
      std::unique_lock lk(sh.mu);
      if (sh.phase == Phase::remote && sh.owner == node) {
        sh.phase = Phase::unknown;
        sh.owner.clear();
      }
    }
  }

  void add_retired(const EntityStats& e) {
    std::lock_guard lk(retired_mu);
    sum_into(retired, e);
  }
  static void sum_into(EntityStats& to, const EntityStats& e) {
    to.incarnations_started += e.incarnations_started;
    to.active += e.active;
    to.passivations += e.passivations;
    to.recoveries += e.recoveries;
    to.recovery_failures += e.recovery_failures;
    to.events_persisted += e.events_persisted;
    to.snapshots_saved += e.snapshots_saved;
    to.processing_timeouts += e.processing_timeouts;
    to.stale_deadlines += e.stale_deadlines;
    to.stops_deferred += e.stops_deferred;
    to.stash_overflows += e.stash_overflows;
    to.missing_replies += e.missing_replies;
    to.journal_conflicts += e.journal_conflicts;
    to.journal_failures += e.journal_failures;
    to.commands_failed += e.commands_failed;
    to.commands_dropped += e.commands_dropped;
    to.handler_failures += e.handler_failures;
  }

  ShardRegionStats stats() {
    ShardRegionStats st;
    st.shards_hosted = hosted.load();
    st.shards_started = started.load();
    st.shards_handed_off = handed_off.load();
    st.buffered = buffered.load();
    st.sent_remote = sent_remote.load();
    st.received_remote = received_remote.load();
    st.forwarded = forwarded.load();
    st.refused = refused.load();
    st.resent = resent.load();
    {
      std::lock_guard lk(retired_mu);
      st.entities = retired;
      st.entities.active = 0;
    }
    for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
      std::lock_guard lk(shards[s].mu);
      if (shards[s].host) sum_into(st.entities, shards[s].host->stats());
    }
    return st;
  }

  // Entities of the shards hosted here in a processing episode, the
  // longest first; `id` alone when given.
  std::vector<ProcessingEntity> processing(std::size_t limit) {
    std::vector<ProcessingEntity> all;
    for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
      std::lock_guard lk(shards[s].mu);
      if (!shards[s].host) continue;
      auto part = shards[s].host->processing(limit);
      all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
    }
    auto by_age = [](const ProcessingEntity& a, const ProcessingEntity& b) {
      return a.since_ms != b.since_ms ? a.since_ms < b.since_ms : a.id < b.id;
    };
    std::sort(all.begin(), all.end(), by_age);
    if (all.size() > limit) all.resize(limit);
    return all;
  }
  std::optional<ProcessingEntity> processing_of(const std::string& id) {
    std::uint32_t s = cluster::shard_of(id, settings.shard_count);
    std::lock_guard lk(shards[s].mu);
    if (!shards[s].host) return std::nullopt;
    return shards[s].host->processing_of(id);
  }
  std::size_t processing_count() {
    std::size_t n = 0;
    for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
      std::lock_guard lk(shards[s].mu);
      if (shards[s].host) n += shards[s].host->processing_count();
    }
    return n;
  }

  // Stops every shard hosted here (node leaving or region stopping) and
  // waits, up to `bound`, for their entities. Later commands are refused.
  void stop_all() {
    stopping.store(true, std::memory_order_release);
    for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
      Shard& sh = shards[s];
      std::unique_lock lk(sh.mu);
      auto waiting = take_buffer(sh);
      bool local = sh.phase == Phase::local;
      std::uint64_t epoch = sh.epoch;
      lk.unlock();
      for (auto& p : waiting)
        refuse(p.cmd, Error(ErrorCode::shutting_down, "entity type '" + settings.entity.type_name +
                                                          "' is stopping on node '" + directory->self() + "'"));
      if (local) stop_shard(s, epoch, false);
    }
  }

  bool all_stopped() {
    for (std::uint32_t s = 0; s < settings.shard_count; ++s) {
      std::lock_guard lk(shards[s].mu);
      if (shards[s].phase == Phase::local || shards[s].phase == Phase::stopping) return false;
    }
    return true;
  }

  // A frame of the entity kinds from another node.
  Result<void> on_remote(std::string_view from, std::string_view rest, std::optional<ReplySink> sink) {
    ByteReader r(rest);
    std::uint32_t s = r.u32();
    std::uint8_t hops = r.u8();
    std::string id = r.str();
    std::uint32_t msg_id = r.u32();
    if (r.failed() || s >= settings.shard_count || id.empty()) {
      Error e(ErrorCode::protocol_error, "entity frame from node '" + std::string(from) + "' with a bad header");
      if (sink) (*sink)(ReplyBytes(e));
      return e;
    }
    auto cmd = codecs.decode(msg_id, rest.substr(rest.size() - r.remaining()), sink ? &*sink : nullptr);
    if (!cmd.ok()) {
      if (sink) (*sink)(ReplyBytes(cmd.error()));
      return std::move(cmd).error();
    }
    received_remote.fetch_add(1, std::memory_order_relaxed);
    {
      Shard& sh = shards[s];
      std::lock_guard lk(sh.mu);
      if (sh.phase == Phase::remote) forwarded.fetch_add(1, std::memory_order_relaxed);
    }
    route(std::move(id), std::move(cmd.value()), static_cast<std::uint8_t>(hops + 1));
    return {};
  }

};

template <class B>
class RegionInbox final : public Inbox {
 public:
  explicit RegionInbox(std::weak_ptr<RegionCore<B>> c) : core_(std::move(c)) {}
  Result<void> deliver(std::string_view, std::uint32_t, std::string_view, std::optional<ReplySink> sink) override {
    Error e(ErrorCode::protocol_error, "an actor frame for a shard region");
    if (sink) (*sink)(ReplyBytes(e));
    return e;
  }
  Result<void> deliver_entity(std::string_view from, std::string_view rest, std::optional<ReplySink> sink) override {
    auto c = core_.lock();
    if (!c) {
      Error e(ErrorCode::shutting_down, "the shard region is stopped");
      if (sink) (*sink)(ReplyBytes(e));
      return e;
    }
    return c->on_remote(from, rest, std::move(sink));
  }

 private:
  std::weak_ptr<RegionCore<B>> core_;
};

}  // namespace detail

// The entities of one type on this node's share of the cluster. A copyable
// handle to shared state; see the file comment for ownership and threads.
template <class B>
class ShardRegion {
 public:
  using Command = troupe::detail::CommandOf<B>;
  using Event = troupe::detail::EventOf<B>;
  using State = troupe::detail::StateOf<B>;
  using Factory = std::function<B(const std::string&)>;

  // Errors (invalid_argument): what EntityRegistry::start refuses, a zero
  // shard count or buffer, no message codecs, a type already attached to
  // the directory or published on this node.
  static Result<ShardRegion> start(ActorSystem& system, std::shared_ptr<Journal> journal, Remoting& remoting,
                                   ShardDirectory& directory, ShardRegionSettings settings,
                                   EventCodecs<Event> event_codecs, MessageCodecs<Command> codecs, Factory factory = {},
                                   std::optional<StateCodec<State>> snapshots = std::nullopt) {
    auto bad = [](std::string m) { return Error(ErrorCode::invalid_argument, std::move(m)); };
    const std::string type = settings.entity.type_name;
    if (type.empty() || type.find('|') != std::string::npos) return bad("entity type name '" + type + "' is empty or contains '|'");
    if (settings.shard_count == 0) return bad("entity type '" + type + "': shard_count is 0");
    if (settings.buffer_per_shard == 0) return bad("entity type '" + type + "': buffer_per_shard is 0");
    if (codecs.empty()) return bad("entity type '" + type + "': no message codecs registered");
    if (!journal) return bad("entity type '" + type + "': no journal");
    if (event_codecs.empty()) return bad("entity type '" + type + "': no event codecs registered");
    if (settings.entity.stash_capacity == 0) return bad("entity type '" + type + "': stash capacity is 0");
    if (settings.entity.snapshot_every && !snapshots) return bad("entity type '" + type + "': snapshot_every needs a state codec");
    if (!factory && !std::is_default_constructible_v<B>)
      return bad("entity type '" + type + "': no factory and the behaviour has no default constructor");

    auto core = std::make_shared<detail::RegionCore<B>>();
    core->system = &system;
    core->journal = std::move(journal);
    core->remoting = &remoting;
    core->directory = &directory;
    core->settings = std::move(settings);
    core->event_codecs = std::move(event_codecs);
    core->codecs = std::move(codecs);
    core->factory = std::move(factory);
    core->snapshots = std::move(snapshots);
    core->inbox_name = "region/" + type;
    core->shards = std::make_unique<typename detail::RegionCore<B>::Shard[]>(core->settings.shard_count);

    auto published = remoting.add_inbox(core->inbox_name, std::make_shared<detail::RegionInbox<B>>(core));
    if (!published.ok()) return std::move(published).error();
    std::weak_ptr<detail::RegionCore<B>> w = core;
    ShardDirectory::Host host;
    host.start = [w](std::uint32_t s, std::uint64_t e) {
      if (auto c = w.lock()) c->start_shard(s, e);
    };
    host.stop = [w](std::uint32_t s, std::uint64_t e, bool immediate) {
      if (auto c = w.lock()) c->stop_shard(s, e, immediate);
    };
    host.node_left = [w](std::string_view n) {
      if (auto c = w.lock()) c->node_left(n);
    };
    auto attached = directory.attach(type, core->settings.shard_count, std::move(host));
    if (!attached.ok()) {
      (void)remoting.unpublish(core->inbox_name);
      return std::move(attached).error();
    }
    return ShardRegion(std::move(core));
  }

  // Sends `cmd` to entity `id` wherever it lives. Errors: invalid_argument
  // (empty id). Later failures (no node can take the shard, buffer full,
  // stopping) answer the command's reply target, or count it refused.
  Result<void> tell(std::string_view id, Command cmd) const {
    if (id.empty()) return Error(ErrorCode::invalid_argument, "empty entity id");
    core_->route(std::string(id), std::move(cmd), 0);
    return {};
  }

  // Asks entity `id` wherever it lives: `make(ReplyTo<R>)` builds the
  // command. Completes with the reply, the entity's or the runtime's error,
  // timeout, or unreachable (the owner's connection was lost meanwhile).
  template <class R, class Make>
  Future<R> ask(std::string_view id, Make&& make, Duration timeout) const {
    auto [future, request] = core_->system->template ask_with<R>(std::forward<Make>(make), timeout);
    Command cmd(std::move(request));
    if (id.empty()) {
      core_->refuse(cmd, Error(ErrorCode::invalid_argument, "empty entity id"));
      return std::move(future);
    }
    core_->route(std::string(id), std::move(cmd), 0);
    return std::move(future);
  }

  // The shard an id belongs to (the same on every node).
  std::uint32_t shard_of(std::string_view id) const noexcept {
    return cluster::shard_of(id, core_->settings.shard_count);
  }

  // Stops every shard hosted here gracefully (E6: processing entities finish
  // their episode), releases them to the directory and detaches; waits up
  // to `bound` for all shards at once (zero: the entity stop_timeout, or
  // 31 s without one). Later commands are refused with shutting_down.
  // timeout if entities still run after it. In a cluster, leave the
  // cluster first (Cluster::leave): that hands the shards to other nodes;
  // this only stops what is still here.
  Result<void> stop(Duration bound = Duration::zero()) const {
    core_->stop_all();
    Duration b = bound;
    if (b <= Duration::zero())
      b = core_->settings.entity.stop_timeout > Duration::zero() ? core_->settings.entity.stop_timeout
                                                                 : std::chrono::seconds(31);
    auto until = std::chrono::steady_clock::now() + b;
    while (!core_->all_stopped()) {
      if (std::chrono::steady_clock::now() >= until) {
        return Error(ErrorCode::timeout, "entity type '" + core_->settings.entity.type_name + "': shards still stopping after " +
                                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(b).count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    core_->directory->detach(core_->settings.entity.type_name);
    (void)core_->remoting->unpublish(core_->inbox_name);
    return {};
  }

  ShardRegionStats stats() const { return core_->stats(); }
  // Entities of the shards hosted on this node in a processing episode now,
  // the longest first (up to `limit`); one entity's episode if it is in one
  // here; how many there are.
  std::vector<ProcessingEntity> processing(std::size_t limit) const { return core_->processing(limit); }
  std::optional<ProcessingEntity> processing_of(const std::string& id) const { return core_->processing_of(id); }
  std::size_t processing_count() const { return core_->processing_count(); }
  // Shards of this type (the same on every node).
  std::uint32_t shard_count() const noexcept { return core_->settings.shard_count; }
  const ShardRegionSettings& settings() const { return core_->settings; }

 private:
  explicit ShardRegion(std::shared_ptr<detail::RegionCore<B>> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::RegionCore<B>> core_;
};

}  // namespace troupe::cluster
