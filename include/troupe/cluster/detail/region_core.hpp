#pragma once
// The state behind a ShardRegion (sharding.hpp): per shard its phase, owner,
// epoch, local registry and buffer of waiting commands; the region's
// counters; and the declarations of what it does with them. The members are
// defined by responsibility in region_routing.hpp (a command's path),
// region_placement.hpp (finding a shard's owner) and region_hosting.hpp
// (the shards that run on this node).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/cluster/messages.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/shard_directory.hpp"
#include "troupe/cluster/shard_region_settings.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/detail/timer_service.hpp"
#include "troupe/persist/entity.hpp"

namespace troupe::cluster::detail {

// The coordinator group that places the shards of entity type `type`.
std::string shard_group(std::string_view type);

// Adds the counters of `e` to `to` (src/cluster/sharding/shard_region.cpp).
void add_entity_stats(EntityStats& to, const EntityStats& e);

// What a region answers a command it refuses (shard_region.cpp).
Error region_hops_error(const std::string& type, const std::string& id, std::uint8_t hops);
Error region_stopping_error(const std::string& type, const std::string& node);
Error region_buffer_full_error(const std::string& type, const std::string& id, std::size_t buffer);
Error region_system_stopping_error(const std::string& node);

// What ShardRegion::start checks before it builds a region: invalid_argument
// naming the first thing missing or unusable, or ok.
struct RegionParts {
  bool message_codecs = false;
  bool journal = false;
  bool event_codecs = false;
  bool state_codec = false;
  bool can_build_behaviour = false;  // a factory, or a default-constructible behaviour
};
Result<void> check_region(const ShardRegionSettings& settings, const RegionParts& parts);

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
    // The trace it was routed under, sent on with it (SPEC X4).
    troupe::detail::TraceRef trace = troupe::detail::TraceRef::current();
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

  // How long a remote ask's bookkeeping outlives an answer that never comes
  // (its future completed with its own timeout long before).
  Duration ask_forget_after = std::chrono::seconds(60);

  void refuse(Command& c, const Error& e) {
    refused.fetch_add(1, std::memory_order_relaxed);
    troupe::detail::with_reply_target(c, [&](auto* rt) {
      if (rt && rt->pending()) rt->fail(e);
    });
  }

  // --- a command's path (region_routing.hpp) ---------------------------------

  // Routes a command to its entity from any thread.
  void route(std::string id, Command cmd, std::uint8_t hops);
  void route_locked(std::unique_lock<std::mutex>& lk, Shard& sh, std::uint32_t s, std::string id, Command cmd,
                    std::uint8_t hops, bool resent_cmd);
  // Keeps a command in the shard's buffer, or refuses it (stopping, full).
  bool hold(Shard& sh, std::string id, Command cmd, std::uint8_t hops, bool resent_cmd = false);
  void deliver_local(Shard& sh, std::string id, Command cmd);
  // With sh.mu held and a phase of remote.
  void send_remote(Shard& sh, std::uint32_t s, std::string id, Command cmd, std::uint8_t hops);

  // An ask out to another node, kept whole (with its reply target) so that
  // it can wait for the next owner if its send fails, or, if idempotent, be
  // sent again if that node goes away before answering. Whoever claims it
  // first owns `cmd`: the reply function, or send_ask() taking it back after
  // a send that failed.
  struct InFlight {
    std::string id;
    std::string owner;
    std::uint32_t shard = 0;
    std::uint8_t hops = 0;
    std::optional<Command> cmd;
    troupe::detail::TraceRef trace = troupe::detail::TraceRef::current();  // sent again under it
    std::atomic<bool> claimed{false};
    bool claim() noexcept { return !claimed.exchange(true, std::memory_order_acq_rel); }
  };
  // With sh.mu held and a phase of remote; `cmd` has a pending reply target.
  void send_ask(Shard& sh, std::uint32_t s, std::string id, Command cmd, std::uint8_t hops);
  // The answer to an ask sent by send_ask, or the failure that ended it.
  static void answered(const std::weak_ptr<RegionCore>& self, InFlight& f, Result<std::string_view> r);
  // Sends an ask again (see answered()); `lost` is what its asker gets if
  // it cannot be.
  void resend(InFlight& f, Command cmd, Error lost, bool later = false);
  // A frame of the entity kinds from another node.
  Result<void> on_remote(std::string_view from, std::string_view rest, std::optional<ReplySink> sink);

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

  // --- finding a shard's owner (region_placement.hpp) ------------------------

  static constexpr Duration kFirstRelocatePause = std::chrono::milliseconds(25);
  static constexpr Duration kMaxRelocatePause = std::chrono::milliseconds(500);
  class RelocateTimer;

  void locate(std::uint32_t s);
  void located(std::uint32_t s, Result<ShardDirectory::Location> loc);
  // The owner we knew is gone from the address book; with sh.mu held.
  void owner_gone(Shard& sh, std::uint32_t s);
  // Locates the shard again after a growing pause; with sh.mu held.
  void locate_later(Shard& sh, std::uint32_t s);
  bool arm_relocate(Shard& sh, std::uint32_t s);
  void relocate(std::uint32_t s);
  // Empties the shard's buffer into the caller's hands; with sh.mu held.
  std::deque<Pending> take_buffer(Shard& sh);
  // Sends what waited, in order; with sh.mu held and a phase of local or
  // remote.
  void flush(Shard& sh, std::uint32_t s);
  // `node` left the cluster: forget it as the owner of any shard.
  void node_left(std::string_view node);

  // --- shards hosted on this node (region_hosting.hpp) -----------------------

  // Stops the shards hosted here, waits up to `bound` for them, detaches
  // and unpublishes (ShardRegion::stop).
  Result<void> stop(Duration bound);
  void start_shard(std::uint32_t s, std::uint64_t epoch);
  void open_host(Shard& sh, std::uint32_t s, std::uint64_t epoch);
  void stop_shard(std::uint32_t s, std::uint64_t epoch, bool immediate);
  // The shard's entities have all stopped after stop_shard().
  void retire(std::uint32_t s, std::uint64_t epoch);
  // Stops every shard hosted here (node leaving or region stopping). Later
  // commands are refused.
  void stop_all();
  bool all_stopped();

  void add_retired(const EntityStats& e);
  ShardRegionStats stats();
  // Entities of the shards hosted here in a processing episode, the
  // longest first; `id` alone when given.
  std::vector<ProcessingEntity> processing(std::size_t limit);
  std::optional<ProcessingEntity> processing_of(const std::string& id);
  std::size_t processing_count();
};

}  // namespace troupe::cluster::detail
