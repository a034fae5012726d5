// troupe::node::Node: see include/troupe/node/node.hpp. Here: starting a
// node from its config (journal, actor system, cluster, admin server,
// sampler), draining and stopping it; the signals are in node_signals.cpp.
// The state and the threads are described in node_impl.hpp.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "admin_auth.hpp"
#include "dashboard/assets.hpp"
#include "node_impl.hpp"

namespace troupe::node {

namespace {

// A cluster port may hold many connections at once (members, and strangers
// up to the handshake limits): the soft limit on descriptors goes up to the
// hard one.
void raise_open_files_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  (void)setrlimit(RLIMIT_NOFILE, &lim);
}

// Receives the members' load reports into the board.
class LoadReceiver final : public Actor<NodeLoad> {
 public:
  explicit LoadReceiver(std::shared_ptr<detail::LoadBoard> board) : board_(std::move(board)) {}
  void receive(NodeLoad& m) {
    std::lock_guard lk(board_->mu);
    board_->last[m.node] = {m, Clock::now()};
  }

 private:
  std::shared_ptr<detail::LoadBoard> board_;
};

}  // namespace

Node::Node(NodeConfig config) : config_(std::move(config)), metrics_(std::make_shared<Metrics>()) {}

Result<std::unique_ptr<Node>> Node::start(NodeConfig config, WorkerTypes workers) {
  if (auto t = detail::WorkerGroups::check_types(config, workers); !t.ok()) return std::move(t).error();
  std::unique_ptr<Node> node(new Node(std::move(config)));
  node->impl_ = std::make_unique<Impl>();
  node->impl_->node = node.get();
  const NodeConfig& c = node->config_;
  if (!c.workers.empty()) node->impl_->workers = std::make_unique<detail::WorkerGroups>(c, std::move(workers));

  std::error_code ec;
  std::filesystem::create_directories(c.data_dir, ec);
  if (ec) return Error(ErrorCode::invalid_argument, "node.data_dir: cannot create '" + c.data_dir.string() + "': " + ec.message());
  // The log facade is process-wide: the node's [log] applies to every line
  // the process writes from here on, the application's included.
  if (auto l = log::configure(c.log_config()); !l.ok()) return Error(l.error().code(), "log.file: " + l.error().message());
  // The admin port alone may hold admin.max_connections sockets: the soft
  // limit on open files (often 1024) goes up to the hard one.
  if (struct rlimit files {}; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &files);
  }

  SystemConfig sc;
  sc.threads = c.threads;
  node->system_ = std::make_unique<ActorSystem>(sc);

  std::shared_ptr<Journal> inner;
  if (c.journal.backend == "sqlite") {
    SqliteJournalOptions o;
    o.path = c.sqlite_path().string();
    auto j = SqliteJournal::open(o);
    if (!j.ok()) return Error(j.error().code(), "journal.path: " + j.error().message());
    inner = std::move(*j);
  } else if (c.journal.backend == "postgres") {
    PostgresJournalOptions o;
    o.conninfo = c.journal.postgres;
    o.schema = c.journal.schema;
    if (c.journal.writer_connections != 0) o.writer_connections = c.journal.writer_connections;
    if (c.journal.reader_connections != 0) o.reader_connections = c.journal.reader_connections;
    // This process writes as the node's next incarnation: a previous process
    // of the same node that is still alive (paused, partitioned) can no
    // longer write what it did not fence otherwise (SPEC E9).
    o.owner = c.id;
    auto j = PostgresJournal::open(o);
    if (!j.ok()) return Error(j.error().code(), "journal.postgres: " + j.error().message());
    inner = std::move(*j);
  } else {
    inner = std::make_shared<MemoryJournal>();
  }
  auto append_latency = node->metrics_->histogram("troupe_journal_append_seconds",
                                                  "Time from an append to its durable acknowledgement.");
  node->impl_->metered = std::make_shared<detail::MeteredJournal>(std::move(inner), std::move(append_latency));
  node->journal_ = node->impl_->metered;

  if (c.cluster.enabled) {
    cluster::ClusterSettings cs;
    cs.node_id = c.id;
    cs.listen_host = c.cluster.listen_host;
    cs.listen_port = c.cluster.listen_port;
    cs.advertise_host = c.cluster.advertise_host;
    cs.send_traces = c.cluster.send_traces;
    cs.roles = c.roles;
    cs.coordination.app_version = c.app_version;
    cs.coordination.redis_host = c.cluster.redis_host;
    cs.coordination.redis_port = c.cluster.redis_port;
    cs.coordination.redis_user = c.cluster.redis_user;
    cs.coordination.redis_password = c.cluster.redis_password;
    cs.coordination.key_prefix = c.cluster.key_prefix;
    cs.coordination.heartbeat_interval = c.cluster.heartbeat;
    cs.coordination.liveness_threshold = c.cluster.liveness_threshold;
    cs.coordination.takeover_margin = c.cluster.takeover_margin;
    cs.hand_off_batch = c.cluster.hand_off_batch;
    cs.security.insecure = c.cluster.insecure;
    if (!c.cluster.insecure) cs.security.tls = {c.cluster.tls_cert, c.cluster.tls_key, c.cluster.tls_ca};
    cs.security.max_handshakes = c.cluster.max_handshakes;
    cs.security.max_handshakes_per_address = c.cluster.max_handshakes_per_address;
    cs.security.handshake_timeout = c.cluster.handshake_timeout;
    cs.security.idle_timeout = c.cluster.idle_timeout;
    if (c.cluster.insecure)
      log::warn(log::Component::cluster,
                "cluster.insecure = true: the cluster port speaks plain TCP and any process that reaches it is a "
                "member; use [cluster.tls] beyond one machine or a private network",
                {{"listen", c.cluster.listen_host + ":" + std::to_string(c.cluster.listen_port)}});
    raise_open_files_limit();
    cs.coordination.epoch_floor = [journal = node->journal_] {
      auto h = journal_sync::highest_fence(*journal);
      return h.ok() ? *h : 0;
    };
    cs.start_timeout = std::max<Duration>(c.cluster.liveness_threshold + c.cluster.takeover_margin + std::chrono::seconds(5),
                                          std::chrono::seconds(10));
    if (node->impl_->workers) node->impl_->workers->prepare(cs);
    auto cl = cluster::Cluster::start(*node->system_, cs);
    if (!cl.ok()) {
      node->system_->shutdown();
      return Error(cl.error().code(), "cluster.redis (" + c.cluster.redis_host + ":" + std::to_string(c.cluster.redis_port) +
                                          "): " + cl.error().message());
    }
    node->cluster_ = std::move(*cl);
    auto receiver = node->system_->spawn<LoadReceiver>(node->impl_->loads);
    auto published = node->cluster_->remoting().publish(detail::kLoadInbox, receiver, load_wire::load_codecs());
    if (!published.ok()) {
      node->cluster_.reset();
      node->system_->shutdown();
      return std::move(published).error();
    }
    if (auto* w = node->impl_->workers.get()) {
      if (auto r = w->start(*node->system_, node->cluster_->coordinator()); !r.ok()) {
        w->stop();
        node->cluster_.reset();
        node->system_->shutdown();
        return std::move(r).error();
      }
    }
  }

  Impl* impl = node->impl_.get();
  node->metrics_->add_collector([impl](MetricsWriter& w) { impl->collect(w); });

  http::ServerSettings hs;
  hs.host = c.admin.host;
  hs.port = c.admin.port;
  hs.max_connections = c.admin.max_connections;
  hs.max_connections_per_address = c.admin.max_connections_per_address;
  hs.idle_timeout = c.admin.idle_timeout;
  hs.request_read_timeout = c.admin.request_read_timeout;
  hs.tls_cert_file = c.admin.tls_cert.string();
  hs.tls_key_file = c.admin.tls_key.string();
  hs.tls_handshake_timeout = c.admin.tls_handshake_timeout;
  if (impl->workers) hs.max_body_bytes = std::max(hs.max_body_bytes, impl->workers->max_body_bytes());
  http::Router admin_routes = impl->routes();
  if (!c.admin.token_file.empty()) {
    auto token = detail::AdminToken::open(c.admin.token_file);
    if (!token.ok()) {
      if (impl->workers) impl->workers->stop();
      node->cluster_.reset();
      node->system_->shutdown();
      return std::move(token).error();
    }
    std::vector<std::string> page;  // the dashboard's files: no data in them
    for (const auto& a : detail::dashboard_assets()) page.emplace_back(a.path);
    admin_routes.guard(detail::admin_guard(std::move(*token), c.admin.read_open, std::move(page)));
  } else if (!detail::is_loopback(c.admin.host)) {
    log::warn(log::Component::node,
              "the admin API listens beyond this machine without a token: anyone who reaches it may drain the "
              "node, rebalance the cluster and read entity state; set [admin] token_file",
              {{"host", c.admin.host}});
  }
  auto server = http::Server::start(hs, std::move(admin_routes));
  if (!server.ok()) {
    if (impl->workers) impl->workers->stop();
    node->cluster_.reset();
    node->system_->shutdown();
    const std::string& why = server.error().message();
    return Error(server.error().code(), (why.rfind("TLS", 0) == 0 ? "admin.tls: " : "admin.port: ") + why);
  }
  impl->admin = std::move(*server);
  impl->sampler = std::thread([impl] { impl->run_sampler(); });
  return node;
}

Node::~Node() {
  if (!impl_) return;
  (void)drain();
  {
    std::lock_guard lk(impl_->stop_mu);
    impl_->sampler_stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->sampler.joinable()) impl_->sampler.join();
  if (impl_->admin) impl_->admin->stop();
  {
    // A worker map read still out answers nobody now.
    std::lock_guard lk(impl_->worker_map->mu);
    impl_->worker_map->closed = true;
  }
  impl_->rebalancer.stop();
  if (impl_->workers) impl_->workers->stop();
  cluster_.reset();
  if (system_) system_->shutdown();
  {
    std::lock_guard lk(impl_->mu);
    impl_->types.clear();
    impl_->locks.clear();
    impl_->managers.clear();
    impl_->jobs.clear();
    impl_->health_checks.clear();
    impl_->rates.clear();
    impl_->counters.clear();
    impl_->projections.clear();
  }
  stoppers_.clear();
  journal_.reset();
  impl_->metered.reset();
}

void Node::mark_ready() { impl_->ready.store(true); }
bool Node::ready() const noexcept { return impl_->ready.load() && !impl_->draining.load(); }
bool Node::draining() const noexcept { return impl_->draining.load(); }
std::uint16_t Node::admin_port() const noexcept { return impl_->admin ? impl_->admin->port() : 0; }

Result<void> Node::drain() {
  std::call_once(impl_->drain_once, [this] {
    impl_->draining.store(true);
    if (cluster_) {
      auto told = [](const cluster::HandOffReport& r) {
        log::info(log::Component::node, "handed off shards, job queues and workers",
                  {{"moved", r.moved}, {"units", r.units}});
      };
      // The whole hand-off, well within a supervisor's stop timeout
      // (TimeoutStopSec=60s in deploy/systemd).
      auto r = cluster_->leave(std::chrono::seconds(45), told);
      if (r.ok()) {
        log::info(log::Component::node,
                  r->kept ? "handed off shards, job queues and workers; some kept: no other node could take them"
                          : "handed off shards, job queues and workers",
                  {{"moved", r->moved},
                   {"units", r->units},
                   {"kept", r->kept},
                   {"took_ms", std::chrono::duration_cast<std::chrono::milliseconds>(r->took).count()}});
      } else {
        impl_->drain_result = std::move(r).error();
      }
    }
    for (auto& stop : stoppers_) stop();
  });
  return impl_->drain_result;
}

void Node::request_stop() {
  {
    std::lock_guard lk(impl_->stop_mu);
    impl_->stop_requested = true;
  }
  impl_->stop_cv.notify_all();
}

}  // namespace troupe::node
