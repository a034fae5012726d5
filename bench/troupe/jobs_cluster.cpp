// jobs_cluster_c50: durable jobs/s with jobs enqueued on three nodes, the
// row beside jobs_durable_c50 on one (jobs.cpp). It measures what the
// cluster-wide job service (troupe::cluster::start_job_service) costs over
// one node's durable JobService on the same journal and durability; there
// is no peer.
//
// Three nodes in this process, each its own ActorSystem with threads = 1,
// so the three share the machine's two cores like three 1-core nodes would
// share two (the one-node row runs one system with 2 threads). Each node has
// its own Remoting on 127.0.0.1 (port 0), every node has the other two as
// peers, and one StaticShardDirectory places the queue shards (in memory,
// not Redis: placement is off the hot path, as an enqueue and a run stay on
// the enqueuing node's own shards). One SqliteJournal in a fresh temporary
// directory with Durability::process_crash, shared by all three nodes, as
// jobs_durable_* uses it.
//
// ClusterJobSettings{.shard_count = 6}: the directory gives each node 2
// shards. JobSettings::workers applies per hosted shard; 8 per shard makes
// 6 x 8 = 48 workers over the cluster (16 per node), the multiple of 6
// nearest to jobs_durable_c50's 50 (9 per shard would make 54). Everything
// else is jobs.cpp's (jobs_common.hpp): the journal, start_paused, the
// trivial worker, the outcome count.
//
// Once every shard has started (the nodes' stats().idle add up to 48), n =
// 100,000 jobs (payload: the job's number) are added, a third through each
// node, from three threads at once (one per node), each job with enqueue(),
// which answers once its shard journaled it. Each node's shards must have
// accepted exactly its own third (no job went over the network). Then
// resume() on every node starts the workers; outcomes are counted in
// on_outcome on whichever node ran the job, and every job must complete
// exactly once with its own number (checked by the sum).
//
// Metrics, in jobs/s: "jobs_cluster_c50_add" — from the three threads'
// start until the last acceptance; "jobs_cluster_c50" — from resume() on
// the first node until the 100,000th outcome.

#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"
#include "jobs_common.hpp"
#include "troupe/cluster/cluster_jobs.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/static_directory.hpp"
#include "troupe/core.hpp"

namespace troupe_bench {
namespace {

using jobs_common::die;

constexpr std::uint32_t kShards = 6;
constexpr std::size_t kWorkersPerShard = 8;  // 48 in all, see above
const std::vector<std::string> kNodes = {"a", "b", "c"};

struct Node {
  std::string id;
  std::unique_ptr<troupe::ActorSystem> system;
  std::unique_ptr<troupe::cluster::Remoting> remoting;
  std::unique_ptr<troupe::cluster::ShardDirectory> directory;
  std::optional<troupe::JobService> jobs;
};

std::vector<std::unique_ptr<Node>> start_nodes(troupe::cluster::StaticShardDirectory& placement) {
  std::vector<std::unique_ptr<Node>> nodes;
  for (const auto& id : kNodes) {
    auto n = std::make_unique<Node>();
    n->id = id;
    troupe::SystemConfig cfg;
    cfg.threads = 1;  // three 1-core nodes on two cores
    n->system = std::make_unique<troupe::ActorSystem>(cfg);
    troupe::cluster::Remoting::Settings rs;
    rs.security.insecure = true;
    rs.node_id = id;
    auto r = troupe::cluster::Remoting::start(*n->system, rs);
    if (!r.ok()) die("node " + id + ": cannot start remoting: " + r.error().to_string());
    n->remoting = std::move(r).value();
    n->directory = placement.view(id);
    nodes.push_back(std::move(n));
  }
  for (auto& a : nodes)
    for (auto& b : nodes)
      if (a != b) a->remoting->set_peer(b->id, "127.0.0.1", b->remoting->port());
  return nodes;
}

// Until every node serves its shards: all workers idle, 2 shards per node.
void wait_served(const std::vector<std::unique_ptr<Node>>& nodes,
                 troupe::cluster::StaticShardDirectory& placement) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::uint64_t idle = 0;
    for (auto& n : nodes) idle += n->jobs->stats().idle;
    if (idle == kShards * kWorkersPerShard) break;
    if (std::chrono::steady_clock::now() > until) die("the queue shards did not start within 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& [node, count] : placement.counts(troupe::cluster::job_queue_type("bench")))
    if (count != kShards / kNodes.size())
      die("node " + node + " serves " + std::to_string(count) + " shards, not 2");
}

}  // namespace

void jobs_cluster(const std::string& workload) {
  if (workload != "jobs_cluster_c50") die("unknown workload '" + workload + "' (jobs_cluster_c50)");
  const long n = jobs_common::kJobs / bench::scale();
  const long per_node = n / static_cast<long>(kNodes.size());

  jobs_common::DurableJournal durable;  // outlives the nodes' services
  auto outcomes = std::make_shared<jobs_common::Outcomes>(n);
  troupe::cluster::StaticShardDirectory placement(kNodes);  // outlives its views
  auto nodes = start_nodes(placement);
  for (auto& node : nodes) {
    auto svc = troupe::cluster::start_job_service(
        *node->system, *node->remoting, *node->directory,
        jobs_common::settings(n, kWorkersPerShard, durable.journal(), outcomes), jobs_common::translator(),
        jobs_common::workers(), {.shard_count = kShards});
    if (!svc.ok()) die("node " + node->id + ": cannot start the job service: " + svc.error().to_string());
    node->jobs.emplace(std::move(svc).value());
  }
  wait_served(nodes, placement);

  // Node k adds jobs [k * per_node, (k + 1) * per_node), the last one the rest.
  std::latch go(1);
  std::vector<std::thread> adders;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const long first = static_cast<long>(k) * per_node;
    const long last = k + 1 == nodes.size() ? n : first + per_node;
    adders.emplace_back([&go, &service = *nodes[k]->jobs, first, last] {
      std::vector<troupe::Future<troupe::JobId>> accepted;
      accepted.reserve(static_cast<std::size_t>(last - first));
      go.wait();
      for (long i = first; i < last; ++i)
        accepted.push_back(service.enqueue(troupe::Job{"noop", std::to_string(i)}));
      for (auto& f : accepted) {
        auto r = f.get();
        if (!r.ok()) die("a job was not accepted: " + r.error().to_string());
      }
    });
  }
  bench::Stopwatch add;
  go.count_down();
  for (auto& t : adders) t.join();
  const double add_s = add.seconds();
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const long mine = k + 1 == nodes.size() ? n - static_cast<long>(k) * per_node : per_node;
    if (auto accepted = nodes[k]->jobs->stats().accepted; accepted != static_cast<std::uint64_t>(mine))
      die("node " + nodes[k]->id + "'s shards accepted " + std::to_string(accepted) + " jobs, not its own " +
          std::to_string(mine));
  }

  bench::Stopwatch run;
  for (auto& node : nodes) node->jobs->resume();
  outcomes->done.get_future().wait();
  const double run_s = run.seconds();
  outcomes->check();

  bench::report((workload + "_add").c_str(), static_cast<double>(n) / add_s, "jobs/s");
  bench::report(workload.c_str(), static_cast<double>(n) / run_s, "jobs/s");

  for (auto& node : nodes)
    if (auto r = node->jobs->stop(); !r.ok()) die("node " + node->id + ": " + r.error().to_string());
  for (auto& node : nodes) node->remoting->stop();
  for (auto& node : nodes) node->system->shutdown();
}

}  // namespace troupe_bench
