#pragma once
// The node's worker groups at run time (SPEC W9, doc/node.md "Worker
// groups"): for each [[workers]] table, the worker host this node runs when
// it has one of the group's roles (the coordinator's Reconciler drives it),
// and, on manager nodes, the sync of the group's desired set from its
// source (every sync_interval_ms, and at once on POST
// /workers/{group}/sync). Private to the node.
//
// Ownership: Node::Impl owns the one WorkerGroups. It borrows the
// coordinator from start() until stop(), which the node calls before it
// destroys the cluster. Thread safety: every member is thread-safe; the
// state the coordinator's callbacks, the sync ticker and the admin
// handlers share sits behind shared pointers and a mutex.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/cluster/cluster.hpp"
#include "troupe/node/config.hpp"
#include "troupe/node/workers.hpp"

namespace troupe::node::detail {

// One group as this node sees it. `config`, `served`, `synced` and `host`
// are fixed once start() has run; the rest is guarded by `mu`.
struct WorkerGroupState {
  WorkerGroupConfig config;
  bool served = false;  // this node has one of the group's roles: it runs workers
  bool synced = false;  // this node is a manager: it syncs the group
  std::shared_ptr<WorkerHostRef> host;
  cluster::DesiredSource source;                // file, http: reads it; webhook: the last body taken
  std::atomic<std::uint64_t> worker_errors{0};  // specs that did not decode, workers that failed

  mutable std::mutex mu;
  std::optional<cluster::DesiredSet> posted;  // webhook: the last body taken
  bool syncing = false;                       // Coordinator::sync was called
  std::int64_t last_sync_ms = 0;              // when the last round this node asked for ended
  std::optional<Result<cluster::SyncReport>> last_sync;
};

class WorkerGroups {
 public:
  WorkerGroups(const NodeConfig& config, WorkerTypes types);
  ~WorkerGroups();

  // invalid_argument naming the first [[workers]] group whose type is not
  // registered (and the types that are).
  static Result<void> check_types(const NodeConfig& config, const WorkerTypes& types);

  // This node syncs worker groups: it has the role "manager", or declares
  // no roles at all.
  bool manager() const noexcept { return manager_; }
  // The largest webhook body any group takes.
  std::size_t max_body_bytes() const noexcept;

  // Before the cluster starts: what the coordinator needs from the worker
  // groups (the fencing hooks, each group's roles).
  void prepare(cluster::ClusterSettings& cs);
  // After the cluster has started: spawns the hosts, serves the groups this
  // node hosts, starts the syncs this node runs. Errors from serve().
  Result<void> start(ActorSystem& system, cluster::Coordinator& coordinator);
  // Stops the periodic syncs and lets go of the coordinator; later requests
  // answer shutting_down. Idempotent.
  void stop();

  // GET /workers and GET /workers/{group} (nullptr: every group; nullopt
  // when `group` is not configured).
  std::optional<nlohmann::json> view(const std::string* group) const;
  // POST /workers/{group}/sync: runs a round now and calls `done` (from any
  // thread) with the HTTP status and the JSON body to answer.
  void sync_now(const std::string& group, const std::string& body,
                std::function<void(int status, nlohmann::json body)> done);

  // The state the coordinator's callbacks, the sync ticker and the admin
  // handlers share (worker_groups.cpp).
  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  bool manager_ = false;
};

}  // namespace troupe::node::detail
