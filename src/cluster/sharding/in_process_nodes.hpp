#pragma once
// Nodes side by side in one test process: each with its own actor system
// and remoting on 127.0.0.1, its view of one StaticShardDirectory, and the
// others in its address book.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/static_directory.hpp"
#include "troupe/core.hpp"

namespace troupe::cluster::test {

struct InProcessNode {
  std::string id;
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<Remoting> remoting;
  std::unique_ptr<ShardDirectory> directory;
};

// A two-thread actor system that keeps expected failures out of the log.
inline std::unique_ptr<ActorSystem> quiet_system() {
  SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_failures = false;
  cfg.log_dead_letters = false;
  return std::make_unique<ActorSystem>(std::move(cfg));
}

// Appends a started node of type N (an InProcessNode with more members) for
// each id. Fails the test on an error; check HasFatalFailure() after it.
template <class N>
void start_in_process_nodes(const std::vector<std::string>& ids, StaticShardDirectory& placement,
                            std::vector<std::unique_ptr<N>>& nodes) {
  for (const auto& id : ids) {
    auto n = std::make_unique<N>();
    n->id = id;
    n->system = quiet_system();
    Remoting::Settings rs;
    rs.security.insecure = true;
    rs.node_id = id;
    auto r = Remoting::start(*n->system, rs);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    n->remoting = std::move(r.value());
    n->directory = placement.view(id);
    nodes.push_back(std::move(n));
  }
  for (auto& a : nodes)
    for (auto& b : nodes)
      if (a != b) a->remoting->set_peer(b->id, "127.0.0.1", b->remoting->port());
}

// Polls `f` every 5 ms until it holds or `bound` (real time) has passed;
// its last answer.
inline bool eventually(const std::function<bool()>& f, Duration bound = std::chrono::seconds(10)) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

}  // namespace troupe::cluster::test
