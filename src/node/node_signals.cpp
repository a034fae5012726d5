// troupe::node::Node's signals (include/troupe/node/node.hpp): SIGINT and
// SIGTERM drain and stop the node, SIGHUP reloads the cluster's TLS files,
// all taken by one thread with sigwait; and reload_tls() itself.

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "node_impl.hpp"

namespace troupe::node {

namespace {

std::atomic<Node*> g_signalled_node{nullptr};

// SIGINT and SIGTERM stop the node; SIGHUP reloads its TLS files.
sigset_t node_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

void Node::block_stop_signals() {
  const sigset_t set = node_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

Result<void> Node::reload_tls() {
  if (!cluster_) return Error(ErrorCode::invalid_argument, "reload_tls: this node has no [cluster]");
  auto r = cluster_->remoting().transport().reload_tls();
  if (r.ok())
    log::info(log::Component::cluster, "TLS files reloaded: new connections use them, established ones stay");
  else
    log::error(log::Component::cluster, "TLS reload failed; the old files stay in use",
               {{"error", r.error().to_string()}});
  return r;
}

void Node::wait_for_stop_signal() {
  // A thread takes the signals with sigwait (no handler), so it may take
  // the node's locks safely. They are blocked everywhere if the program
  // called block_stop_signals() before starting the node.
  block_stop_signals();
  const sigset_t set = node_signals();
  g_signalled_node.store(this);
  std::thread waiter([set] {
    int sig = 0;
    // SIGHUP reloads the cluster's TLS files; the others stop the node.
    while (sigwait(&set, &sig) == 0 && sig == SIGHUP) {
      Node* n = g_signalled_node.load();
      if (n == nullptr || !n->cluster_) continue;
      if (n->config_.cluster.insecure) {
        log::info(log::Component::cluster, "SIGHUP: the cluster is insecure (plain TCP); no TLS files to reload");
        continue;
      }
      (void)n->reload_tls();  // logs its outcome
    }
    if (Node* n = g_signalled_node.load()) n->request_stop();
  });
  {
    std::unique_lock lk(impl_->stop_mu);
    impl_->stop_cv.wait(lk, [&] { return impl_->stop_requested; });
  }
  g_signalled_node.store(nullptr);
  // Balancers first: /ready answers 503 from now on while both ports keep
  // serving for drain_grace, so that nothing already on its way, or sent
  // before a balancer's next check, meets a closed port.
  impl_->draining.store(true);
  const auto grace_ms = std::chrono::duration_cast<std::chrono::milliseconds>(config_.drain_grace).count();
  log::info(log::Component::node, "drain started: /ready answers 503; serving a little longer, then handing off",
            {{"grace_ms", grace_ms}});
  std::this_thread::sleep_for(config_.drain_grace);
  const auto started = std::chrono::steady_clock::now();
  const auto drained = drain();
  const auto took_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  if (drained.ok())
    log::info(log::Component::node, "drained", {{"took_ms", took_ms}});
  else
    log::error(log::Component::node, "drain failed", {{"took_ms", took_ms}, {"error", drained.error().to_string()}});
  // Wake the waiter if no signal came (a POST /drain).
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

}  // namespace troupe::node
