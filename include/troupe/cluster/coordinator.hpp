#pragma once
// Cluster membership, liveness and placement in Redis (SPEC W1-W7).
//
// Every node runs one Coordinator. It registers the node (with the address
// of its transport) in Redis, heartbeats, keeps a view of the live members,
// places units (workers, shards) of named groups on live members through
// atomic Lua scripts, and tells the node, through a Reconciler per group,
// which units to start, update and stop so that what it runs matches Redis.
//
//   auto c = Coordinator::create({.node_id = "node-a", .address = {"10.0.0.1", 7100}}).value();
//   c->serve("workers", {.start = ..., .update = ..., .stop = ...});
//   if (auto r = c->start().get(); !r) { ... r.error() ... }
//   c->sync("workers", from_file("/etc/app/workers.txt"));    // on the managing node(s)
//
// The rules (doc/redis.md has the keys, scripts and a timeline):
//   - Liveness. Each heartbeat is a script that stamps the member with
//     Redis' own TIME. A member is live iff redis_now - last_heartbeat <=
//     liveness_threshold; assignment, relocation, rebalance and hand-offs
//     all use exactly that rule (W2, W7). The threshold and margin are
//     stored in Redis by the first member and every member must agree.
//   - Placement. assign, relocate, unassign and rebalance_all are one Lua
//     script each (W3, W4, W6). Every change of owner draws a new epoch
//     from one counter: a fencing token that only grows.
//   - Eligibility (W8). Units of a group go only to members that are live,
//     not draining and, when the group names roles (group_roles), hold one
//     of them (roles). Every script that places (assign, relocate,
//     rebalance, takeover, leave, a hand-off's relocation) applies that one
//     rule; a unit whose owner is live but holds no role of its group any
//     more is moved like a dead owner's.
//   - Hand-off. A unit moved away from an owner that may still run it is
//     recorded as handed off; its new owner starts it only after the old
//     owner has stopped it and released it, or once the old owner is past
//     liveness_threshold + takeover_margin.
//   - Self-fencing. A node whose last successful heartbeat was *sent*
//     liveness_threshold ago calls on_fenced and stops every unit. Nobody
//     may take its units before threshold + margin of Redis time after the
//     stamp, which is no earlier than the send: the node has stopped first.
//     When heartbeats succeed again it registers anew and reconciles.
//   - Takeover. A heartbeat also reports members past threshold + margin;
//     the node moves their units to live members (bounded batches) and
//     removes them. Any node may do it; the script is idempotent.
//
// Ownership: create() returns the only owner. The Coordinator owns one
// thread (an Asio io_context) that runs hiredis' async API over two Redis
// connections (commands; pub/sub) and every callback; and, once a sync
// starts, one more thread that calls DesiredSources.
//
// Thread safety: every member function may be called from any thread and
// never blocks (it returns a Future completed on the coordinator thread, or
// a value from a cached view), except the destructor, which joins the
// threads. Callbacks (Reconciler, on_* settings, log) run on the
// coordinator thread: they must not block (in particular, never call get()
// on one of this coordinator's futures inside one), and must not destroy
// the Coordinator.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/cluster/placement_source.hpp"
#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"

namespace troupe::cluster {

// Where a node's transport listens; stored with its membership so other
// nodes can connect to it.
struct Address {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const Address&, const Address&) = default;
};

enum class CoordinatorLogLevel { debug, info, warning, error };

// A live member, as of this node's last heartbeat.
struct Member {
  std::string id;
  Address address;
  Duration heartbeat_age{};  // Redis time from its last heartbeat to ours
  std::string app_version;   // what it declared (CoordinatorSettings::app_version); empty: nothing
  std::vector<std::string> roles{};  // what it declared (CoordinatorSettings::roles), sorted
};

// Where a unit is placed.
struct Assignment {
  std::string group;
  std::string unit;
  std::string owner;
  std::string spec;
  std::uint64_t epoch = 0;  // drawn from one counter at every change of owner
  WallTime updated{};       // Redis time of the last change of owner or spec
  // The previous owner the new one must wait for (empty: none), and the
  // epoch under which that owner ran the unit.
  std::string handing_off_from;
  std::uint64_t handoff_epoch = 0;
};

// The informational outcomes of a placement call; errors are Error values:
//   coordination_failed  Redis refused or could not be reached;
//   unreachable          "NO_ACCEPTABLE_WORKER ..." (no eligible member: live,
//                        not draining, holding a role of the group if it
//                        has any), "NO_OTHER_ACCEPTABLE_WORKER ..." (none but
//                        the owner);
//   invalid_argument     "NOT_INSTALLED ..." (relocating an unknown unit), bad names;
//   not_ready            called before start(); shutting_down after stop().
enum class PlacementOutcome {
  assigned,             // assign: placed on the least-loaded live member
  already_installed,    // assign: it was placed already; the current assignment
  relocated,            // relocate: moved to the least-loaded other live member
  no_need_to_relocate,  // relocate: the owner is live and force was not asked
};
std::string_view to_string(PlacementOutcome o) noexcept;

struct Placement {
  PlacementOutcome outcome = PlacementOutcome::assigned;
  Assignment assignment;
};

// One unit moved by rebalance_all or a takeover.
struct Move {
  std::string group;
  std::string unit;
  std::string from;
  std::string to;
  std::uint64_t epoch = 0;  // the new epoch
};

// What a planned hand-off did (Coordinator::hand_off). Value type.
struct HandOffReport {
  std::size_t units = 0;  // units to move: those run here when it began, and any placed here during it
  std::size_t moved = 0;  // handed to another member, stopped here and released
  std::size_t kept = 0;   // no other member could take them: still run here
  Duration took{};
};

// What one rebalance did: a plain value.
enum class RebalanceOutcome {
  rebalanced,      // it ran: `moves` made (none: it was balanced), `moves_left` past a cap
  versions_mixed,  // the live members run more than one app version: nothing moved
};
std::string_view to_string(RebalanceOutcome o) noexcept;

struct RebalanceReport {
  RebalanceOutcome outcome = RebalanceOutcome::rebalanced;
  std::vector<Move> moves;
  // rebalanced: the moves a cap (max_moves) left for the next call; 0 when
  // the group is balanced now.
  std::size_t moves_left = 0;
  // versions_mixed: the app versions the live members run, oldest first
  // (the empty string stands for members that declared none).
  std::vector<std::string> live_versions;
  // versions_mixed: why nothing moved, naming the versions ("the live
  // members run app versions 1.9.0 and 1.10.0"); otherwise empty.
  std::string waiting_reason() const;
};

// What a node does with the units Redis gives it in one group. Called on
// the coordinator thread, never twice at once, always in the order the
// state changes: start, then any number of updates, then one stop, then
// possibly a new start (with a larger epoch). A unit is started only when
// its hand-off, if any, is over.
struct Reconciler {
  // The node now owns `unit` under `epoch`; start it with `spec`.
  std::function<void(const std::string& unit, const std::string& spec, std::uint64_t epoch)> start;
  // The unit's spec changed (same owner, same epoch).
  std::function<void(const std::string& unit, const std::string& spec, std::uint64_t epoch)> update;
  // Stop the unit (it moved away, was removed, or this node is fenced or
  // stopping). Complete the future once its entities have stopped
  // gracefully; the coordinator then releases the unit to its new owner.
  // Unset: the unit counts as stopped at once.
  std::function<Future<void>(const std::string& unit)> stop;
};

// What one sync changed.
struct SyncReport {
  std::size_t desired = 0;     // units in the desired set
  std::size_t assigned = 0;    // newly placed
  std::size_t unassigned = 0;  // removed from Redis
  std::size_t updated = 0;     // spec changed in place
  std::size_t unchanged = 0;   // already as desired
  // Units that could not be placed or changed, each with its error
  // (e.g. NO_ACCEPTABLE_WORKER, an invalid unit name from a callback source).
  std::vector<std::pair<std::string, Error>> failed;
};

struct CoordinatorSettings {
  std::string node_id;  // checked by validate_node_id
  Address address;      // this node's transport address, stored with its membership
  // The application's version, stored with the membership for the others
  // to see (a rolling update runs two side by side). Empty, or 1 to 64 of
  // A-Z a-z 0-9 . _ + -.
  std::string app_version;
  // This member's roles, stored with its membership: a group that names
  // roles is placed only on members holding one of them. Each 1 to 64 of
  // A-Z a-z 0-9 . _ -; duplicates count once.
  std::vector<std::string> roles{};
  // The roles that may host each group (an empty list: any member), stored
  // in Redis at registration. A group no member declared roles for goes to
  // any member. Every live member declaring a group must declare the same
  // roles for it: start() fails with invalid_argument naming the group and
  // both lists otherwise; once none of those is live, a new list replaces
  // the old (a restart of the whole cluster can change roles).
  std::map<std::string, std::vector<std::string>> group_roles{};

  std::string redis_host = "127.0.0.1";
  std::uint16_t redis_port = 6379;
  // A Redis 6+ ACL user: the connections send AUTH <user> <password>
  // (doc/redis.md has the ACL rule it needs). Empty: AUTH <password>, the
  // default user. A user needs a password.
  std::string redis_user;
  std::string redis_password;         // empty: no AUTH
  std::string key_prefix = "troupe";  // every key is "{<prefix>}:...": one hash slot

  // The defaults put a dead node's shards back in service within 5 s of its
  // death: takeover is due threshold + margin (3.5 s) after its last stamp,
  // which is at most one heartbeat before the death, and a survivor acts
  // at its next heartbeat. Three missed heartbeats still fit in the
  // threshold, so one slow Redis reply does not fence a node.
  Duration heartbeat_interval = std::chrono::seconds(1);
  // A member is live iff redis_now - last_heartbeat <= liveness_threshold.
  // Stored in Redis by the first member; every member must use the same.
  Duration liveness_threshold = std::chrono::seconds(3);
  // Extra time before anyone may act for a member past the threshold
  // (takeover, ending a hand-off): covers clock-rate differences and a
  // fenced node's delay in stopping. Stored and checked like the threshold.
  Duration takeover_margin = std::chrono::milliseconds(500);
  // Period of each sync() and of the re-reading of this node's assignments
  // (which heals a missed pub/sub notice).
  Duration sync_interval = std::chrono::seconds(10);
  // Bound on connecting and on each Redis reply; a command that times out
  // closes the connection (replies come in order).
  Duration command_timeout = std::chrono::seconds(2);
  // Reconnect back-off: doubles from min to max per failed attempt.
  Duration reconnect_min_backoff = std::chrono::milliseconds(100);
  Duration reconnect_max_backoff = std::chrono::seconds(2);
  // Units one takeover script moves at most (then it runs again).
  std::size_t takeover_batch = 256;

  // Log lines, with the node id. Default: the log facade (component
  // cluster, troupe/core/log.hpp), at the line's level.
  std::function<void(CoordinatorLogLevel, std::string_view)> log;
  // The live members changed (ids or addresses): the new list, sorted by id.
  std::function<void(const std::vector<Member>&)> on_members_changed;
  // The highest fence the node's journal stores (Journal::highest_fence),
  // asked before each registration on the coordinator thread. Registering
  // brings at least this as the highest epoch seen, so the epochs drawn
  // after Redis lost its data stay above every fence a shard's owner ever
  // raised: no stale writer gets in, no new owner is locked out (SPEC E9).
  // Empty: only the epochs this node has seen.
  std::function<std::uint64_t()> epoch_floor;
  // This node lost its lease: stop everything that needs ownership. Every
  // served unit also gets Reconciler::stop.
  std::function<void()> on_fenced;
  // Heartbeats succeed again; the node is registered anew and reconciles.
  std::function<void()> on_unfenced;
};

// Membership, liveness and placement for one node (see the top of this
// file). Ownership: owned by the caller of create(); owns its threads and
// Redis connections. Thread safety: all members are thread-safe.
class Coordinator {
 public:
  // Checks the settings (invalid_argument naming the first bad one) and
  // starts the coordinator thread. Nothing touches Redis before start().
  static Result<std::unique_ptr<Coordinator>> create(CoordinatorSettings settings);

  // Stops at once, like a crash as far as Redis is concerned: no more
  // heartbeats, no Reconciler calls, nothing removed. Joins the threads,
  // waiting for a DesiredSource call in progress to return.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Connects (two connections), loads the scripts, registers this node and
  // subscribes to notices. Fails with coordination_failed naming host:port
  // when Redis cannot be reached, with invalid_argument when the cluster's
  // stored threshold or margin differ from ours or when another live process
  // holds this node id (start waits up to threshold + margin for an earlier
  // incarnation's entry to expire). A failed start may be retried.
  Future<void> start();
  // Completes when start-up finishes: at once if it has, with the error if
  // it failed. May be asked before start().
  Future<void> started();
  // Planned hand-off, the first half of a graceful leave. Marks this member
  // as draining in Redis, so that assign, relocate, takeover and leave place
  // nothing more on it, then moves its units `batch` at a time: for each,
  // the new owner is chosen first (relocate: the highest app version, then
  // the least loaded), then the unit is stopped here (Reconciler::stop,
  // graceful) and released, which lets the new owner start it. A unit
  // placed here meanwhile is moved the same way instead of started. The
  // member stays live and keeps its heartbeat; stop() then leaves.
  // `progress`, if set, runs on the coordinator thread each time another
  // quarter of the units has moved. Completes once no unit is left to move.
  // Errors: invalid_argument (batch 0), not_ready before start-up,
  // shutting_down once stopping, coordination_failed if the mark cannot
  // be written. A second call while one runs completes with the first.
  Future<HandOffReport> hand_off(std::size_t batch = 8,
                                 std::function<void(const HandOffReport&)> progress = {});
  // Graceful leave: stops every unit (waiting for each Reconciler::stop),
  // hands this node's units to other live members, removes it from the
  // membership and closes. After it the coordinator does nothing more.
  Future<void> stop();

  const std::string& node_id() const noexcept;

  // --- cached views (never block) ---
  // The live members as of the last heartbeat, sorted by id.
  std::vector<Member> members() const;
  // Whether no other member was live when this node registered (W5).
  // Error(not_ready) before start-up finished.
  Result<bool> is_first_manager() const;
  bool is_fenced() const noexcept;
  // The units this node runs (started and not yet stopped) in `group`:
  // unit -> epoch.
  std::map<std::string, std::uint64_t> running(const std::string& group) const;

  // --- placement (one Lua script each) ---
  // W3.
  Future<Placement> assign(const std::string& group, const std::string& unit, const std::string& spec);
  // W4. Moves the unit to the least-loaded other live member; without
  // `force`, only if its owner is not live.
  Future<Placement> relocate(const std::string& group, const std::string& unit, bool force = false);
  // Removes the unit; false if it was not placed. Its owner stops it; a
  // later assignment still waits for that owner to release it.
  Future<bool> unassign(const std::string& group, const std::string& unit);
  // W6: max - min <= 1 over live members with the fewest moves. While the
  // live members run more than one app version (a rolling update) it waits:
  // nothing moves and the outcome is versions_mixed, naming the versions;
  // once one version remains it balances again. The coordinator logs at
  // info when it starts waiting and when it resumes, once each. With
  // `max_moves` above 0 at most that many units move in this call (seed
  // 001's cap), and the report says how many moves are left.
  Future<RebalanceReport> rebalance(const std::string& group, std::size_t max_moves = 0);
  // rebalance(group, max_moves)'s moves alone (none while it waits on versions).
  Future<std::vector<Move>> rebalance_all(const std::string& group, std::size_t max_moves = 0);
  // One unit's assignment; nullopt when it is not placed.
  Future<std::optional<Assignment>> assignment(const std::string& group, const std::string& unit);
  // This node's assignments in the group (handing_off_from set on those it
  // must still wait for).
  Future<std::vector<Assignment>> owned_units(const std::string& group);
  // The previous owner has stopped `unit`, which it ran under `epoch`: its
  // new owner may start it. True if a hand-off was cleared. The coordinator
  // calls this itself after Reconciler::stop completes.
  Future<bool> release(const std::string& group, const std::string& unit, std::uint64_t epoch);

  // --- bulk reads (a fixed number of round trips, whatever the unit count) ---
  // The names of every group that has units, sorted: one SMEMBERS. Shard
  // groups ("shards/<type>") are among them.
  Future<std::vector<std::string>> groups();
  // Every unit of `group` as Redis holds it now: owner, epoch, updated and
  // any hand-off (spec left empty), sorted by unit. One MULTI/EXEC of two
  // HGETALLs, sent together: one round trip and one consistent snapshot,
  // however many units (10,000 read in a few milliseconds). Entries that do
  // not read (written by someone else) are skipped and logged once each.
  // Errors: invalid_argument (bad group name), not_ready before start(),
  // coordination_failed when Redis cannot be reached, shutting_down.
  Future<std::vector<Assignment>> placements(const std::string& group);

  // --- desired set and reconcile (W1) ---
  // Makes Redis match `source` for `group` now and, when `periodic`, every
  // sync_interval until stop(): assigns missing units, unassigns removed
  // ones, updates changed specs, then publishes a notice to every node. The
  // future is this first round's report (if start-up has not finished, the
  // round runs once it has). Calling it again for a group replaces the
  // source; a call with `periodic` false ends the group's periodic rounds
  // (the caller times its own: a webhook's posts, a period of its own).
  Future<SyncReport> sync(const std::string& group, DesiredSource source, bool periodic = true);
  // This node runs its share of `group` through `reconciler`. Register before
  // or after start(); a group is served at most once (a second call fails).
  Result<void> serve(const std::string& group, Reconciler reconciler);
  // Declares the roles that may host `group` (empty: any member), as
  // CoordinatorSettings::group_roles does at start(), for a group known
  // only later (an entity type started after the cluster). Before start()
  // it joins the settings; after, it is checked and stored at once.
  // Errors: invalid_argument for a bad name or role, or when a live member
  // declared other roles for the group (naming both); shutting_down.
  Future<void> declare_roles(const std::string& group, std::vector<std::string> roles);

 private:
  class Impl;
  explicit Coordinator(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe::cluster
