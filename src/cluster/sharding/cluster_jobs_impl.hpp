#pragma once
// The state of a cluster-wide job service on one node, shared by the files
// that implement it: cluster_jobs.cpp (start_job_service, the JobService
// backend and the dispatch of a job to a local queue shard), queue_shards.cpp
// (starting, handing off and stopping the queue shards placement gives this
// node) and job_routing.cpp (jobs sent to shards on other nodes, and taken
// from them). Internal to src/cluster/sharding/.

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cluster_jobs_wire.hpp"
#include "keeper.hpp"
#include "troupe/cluster/cluster_jobs.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster::detail::jobs {

constexpr int kShardShift = 40;
constexpr std::uint32_t kMaxShards = 4096;
// A job refused by a shard that is stopping or moving is sent again after
// this (to another shard, or the same one's new owner).
constexpr Duration kRetryDelay = std::chrono::milliseconds(20);

inline JobId global_id(std::uint32_t shard, JobId local) noexcept {
  return (static_cast<JobId>(shard) << kShardShift) | local;
}

// Why a queue shard cannot run, as health() reports it.
inline Error shard_fault(std::uint32_t shard, std::string_view what, const Error& e) {
  return Error(e.code(),
               "queue shard " + std::to_string(shard) + " " + std::string(what) + ": " + e.message());
}

// --- a job on its way to a shard ---------------------------------------------------

struct Req {
  Job job;
  int priority = 0;
  std::optional<Duration> timeout;
  bool want_outcome = false;
  // One of the two, as want_outcome says (a promise allocates its state).
  std::optional<Promise<JobId>> accepted;      // enqueue()
  std::optional<Promise<JobOutcome>> outcome;  // submit()
  std::uint32_t tries = 0;
  std::optional<TimePoint> give_up;  // set by the router, on its clock

  void fail(Error e) {
    if (want_outcome)
      outcome->set_error(std::move(e));
    else
      accepted->set_error(std::move(e));
  }
};

// Errors of a shard's service that mean the job was not accepted there, so
// it may be sent to another shard: the shard stops (moved, or the node
// leaves) or stopped on a fault.
inline bool not_taken(const Error& e) {
  return e.code() == ErrorCode::shutting_down || e.code() == ErrorCode::journal_conflict;
}

struct Route {
  std::shared_ptr<Req> req;
};
struct Located {
  std::uint32_t shard = 0;
  std::string owner;  // empty: not known
};
struct Moved {
  std::uint32_t shard = 0;
  std::string owner;  // the node that said it does not serve the shard
  std::shared_ptr<Req> req;
};
struct NodeGone {  // left the cluster or declared dead: owns nothing now
  std::string node;
};
using RouterMsg = std::variant<Route, Located, Moved, NodeGone>;

struct Core;

// Sends jobs to shards on other nodes (this node serves none right now).
class Router final : public Actor<RouterMsg> {
 public:
  // A weak reference: the cell keeps its actor's constructor arguments,
  // and the core holds the cell. The running router keeps the core alive.
  explicit Router(const std::weak_ptr<Core>& core) : core_(core), keep_(core.lock()) {}
  void receive(RouterMsg& m);
  void on_stop();

 private:
  void route(std::shared_ptr<Req> r);
  void send(std::uint32_t shard, const std::string& owner, std::shared_ptr<Req> r);
  void later(std::shared_ptr<Req> r);

  std::weak_ptr<Core> core_;
  std::shared_ptr<Core> keep_;
  std::vector<std::string> owners_;
  std::vector<bool> locating_;
  std::map<std::uint32_t, std::vector<std::shared_ptr<Req>>> waiting_;  // for a locate
  std::uint32_t next_ = 0;
  std::uint64_t next_key_ = 0;
};

// Takes jobs that other nodes send to this node's shards.
class Intake final : public Actor<RemoteJob> {
 public:
  explicit Intake(const std::weak_ptr<Core>& core) : core_(core) {}
  void receive(RemoteJob& m);

 private:
  std::weak_ptr<Core> core_;
};

struct Hosted {
  std::uint64_t epoch = 0;
  std::optional<JobService> service;  // empty while it could not start
  // Being handed off: paused, its running attempts finishing until then.
  std::optional<std::chrono::steady_clock::time_point> drain_until;
};

// One job service's state on this node. Shared: the JobService's backend
// and the running router hold it; the intake, the placement callbacks and
// the keeper's steps hold weak references. The maps below are guarded by
// `mu`; the blocking steps (a shard's start, stop and the sweep) run on the
// keeper's thread, one at a time.
struct Core : std::enable_shared_from_this<Core> {
  ActorSystem* system = nullptr;
  Remoting* remoting = nullptr;
  ShardDirectory* directory = nullptr;
  JobSettings settings;
  JobTranslator translator;
  JobWorkers workers;
  ClusterJobSettings cluster;
  std::string type;
  std::string self;
  std::shared_ptr<const MessageCodecs<RemoteJob>> codecs;
  ActorRef<RouterMsg> router;
  ActorRef<RemoteJob> intake;
  Keeper keeper;
  std::atomic<bool> stopped{false};
  // This node lost its lease: a hand-off in progress stops draining.
  std::atomic<bool> fenced{false};
  mutable std::atomic<std::uint64_t> rr{0};

  mutable std::mutex mu;
  std::map<std::uint32_t, std::uint64_t> wanted;  // shards placement gave this node, by epoch
  std::map<std::uint32_t, Hosted> hosted;
  std::vector<std::pair<std::uint32_t, JobService>> serving;  // running, for the round robin
  std::map<std::uint32_t, Error> faults;                      // shards that cannot run now, and why
  std::map<std::uint32_t, std::uint64_t> pending_release;     // asked back, not yet released
  bool paused = false;
  JobStats retired;                        // of services stopped here
  std::deque<JobDeadLetter> retired_dead;  // theirs, most recent last

  void log(const std::string& what) const {
    if (settings.log) log::warn(log::Component::cluster, what, {{"job_service", settings.name}});
  }

  // --- local dispatch (cluster_jobs.cpp; any thread) ---

  // A running shard of this node, round robin; none while it serves none.
  std::optional<std::pair<std::uint32_t, JobService>> pick_local() const;
  // Sends `r` to a local shard, another one if that one refuses it, or to
  // the router when this node serves none.
  void dispatch(std::shared_ptr<Req> r);

  // --- hosting (queue_shards.cpp) ---

  // The settings of `shard`'s local service: its own name, its log fenced
  // under `epoch`, started paused.
  JobSettings shard_settings(std::uint32_t shard, std::uint64_t epoch);

  // Placement asked for `shard` back: no new job goes to it, and no queued
  // one starts; the running ones finish while the keeper gets to it. Several
  // shards handed off at once drain side by side. Placement's thread.
  void begin_hand_off(std::uint32_t shard);

  // This node lost its lease: others may take the shard once the takeover
  // margin has passed, so it stops now, not when the keeper gets to it
  // (which may be busy draining or reading a log). The keeper then waits
  // for the stop and releases it. Placement's thread.
  void fence_shard(std::uint32_t shard);

  // No new job goes to `shard` (it refused one); the sweep serves it again
  // if it is healthy. Any thread.
  void unserve(std::uint32_t shard);
  void rebuild_serving();  // under mu

  // Starts `shard`'s service if placement still wants it here under
  // `epoch`; tried again after restart_delay if it cannot start. Keeper.
  void start_shard(std::uint32_t shard, std::uint64_t epoch);

  // Stops a service taken out of `hosted` (bounded) and keeps its counters
  // and dead letters.
  void stop_and_retire(std::uint32_t shard, JobService& svc);
  void retire(std::uint32_t shard, JobService& svc);  // under mu

  // A hand-off lets the running attempts finish first (bounded by
  // stop_bound): their outcomes are then in the log and the new owner does
  // not run them again. An immediate stop (this node lost its lease; others
  // may take the shard soon) does not wait. Keeper.
  void stop_shard(std::uint32_t shard, std::uint64_t epoch, bool immediate);

  // Every restart_delay: a shard whose service stopped on a fault is read
  // from its log again (another writer appended; whatever it wrote is now
  // part of the queue). Keeper.
  void sweep();

  // Adds the counters and queue depths of `s` to `to`.
  static void add_stats(JobStats& to, const JobStats& s);

  // Stops every shard here first, then releases the ones placement had
  // asked back (their stop was still queued), and only then detaches: a
  // shard is never released while it still runs. Shards still owned stay
  // placed on this node until it leaves the cluster. False if a shard's
  // service did not stop within `bound` (counted from the call).
  bool shutdown(Duration bound);
};

}  // namespace troupe::cluster::detail::jobs
