// The cluster-wide keyed lock's entry point: start_keyed_lock checks the
// settings and wires a node's part of the lock together (its clients and
// host, the remoting inbox the other nodes' messages arrive at, the shard
// directory's callbacks) behind the KeyedLock backend. See
// include/troupe/cluster/cluster_lock.hpp for the contract, doc/lock.md for
// the protocol, cluster_lock_node.hpp for the files that hold the rest.

#include "troupe/cluster/cluster_lock.hpp"

#include <bit>

#include "cluster_lock_node.hpp"

namespace troupe::cluster {
namespace detail::cluster_lock {
namespace {

// Where the other nodes' lock messages arrive: decodes them for the core.
class WireInbox final : public detail::Inbox {
 public:
  explicit WireInbox(std::weak_ptr<Core> core, std::shared_ptr<const MessageCodecs<Wire>> codecs)
      : core_(std::move(core)), codecs_(std::move(codecs)) {}
  Result<void> deliver(std::string_view from, std::uint32_t msg_id, std::string_view bytes,
                       std::optional<ReplySink> sink) override {
    auto m = codecs_->decode(msg_id, bytes, nullptr);
    if (!m.ok()) {
      if (sink) (*sink)(ReplyBytes(m.error()));
      return std::move(m).error();
    }
    if (sink) (*sink)(ReplyBytes(Error(ErrorCode::protocol_error, "the lock takes no asks")));
    if (auto core = core_.lock(); core && !core->stopped.load(std::memory_order_acquire))
      core->dispatch(std::string(from), std::move(m.value()));
    return {};
  }

 private:
  std::weak_ptr<Core> core_;
  std::shared_ptr<const MessageCodecs<Wire>> codecs_;
};

// --- the KeyedLock's backend --------------------------------------------------------

class Backend final : public troupe::detail::LockBackend {
 public:
  explicit Backend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  void submit(std::unique_ptr<LockRequest> req) override {
    // A refused message destroys the request, which answers shutting_down.
    (void)core_->clients[req->hash & core_->client_mask].tell(Submit{std::move(req)});
  }

  LockStats stats() const override {
    auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    const Counters& c = core_->counters;
    LockStats s;
    s.grants = ld(c.grants);
    s.acquire_timeouts = ld(c.acquire_timeouts);
    s.lease_expiries = ld(c.lease_expiries);
    s.block_failures = ld(c.block_failures);
    s.live_keys = ld(c.live_holds);
    s.waiting = ld(c.waiting);
    std::lock_guard lk(core_->hosted_mu);
    s.waits = core_->retired.waits;
    s.keys_freed = core_->retired.keys_freed;
    for (const auto& [shard, lock] : core_->hosted_locks) {
      LockStats h = lock.stats();
      s.waits += h.waits;
      s.keys_freed += h.keys_freed;
    }
    return s;
  }

  void stop() override {
    if (core_->stopped.exchange(true)) return;
    core_->directory->detach(core_->type);
    (void)core_->remoting->unpublish(core_->type);
    for (auto& c : core_->clients) c.stop();
    core_->host.stop();
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace
}  // namespace detail::cluster_lock

Result<KeyedLock> start_keyed_lock(ActorSystem& system, Remoting& remoting, ShardDirectory& directory,
                                   KeyedLockSettings settings, ClusterLockSettings cluster) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "keyed lock '" + settings.name + "': " + what);
  };
  if (auto ok = troupe::detail::check_lock_settings(settings); !ok.ok()) return std::move(ok).error();
  if (cluster.shard_count == 0) return bad("shard_count must be positive");
  if (cluster.reply_timeout <= Duration::zero()) return bad("reply_timeout must be positive");
  if (cluster.query_timeout <= Duration::zero()) return bad("query_timeout must be positive");
  if (cluster.buffer_per_shard == 0) return bad("buffer_per_shard must be positive");
  if (cluster.lease_margin < Duration::zero()) return bad("lease_margin must not be negative");

  using namespace detail::cluster_lock;
  auto core = std::make_shared<Core>();
  core->system = &system;
  core->remoting = &remoting;
  core->directory = &directory;
  core->settings = settings;
  core->cluster = cluster;
  core->type = lock_type(settings.name);
  core->self = directory.self();
  core->codecs = std::make_shared<const MessageCodecs<Wire>>(wire_codecs());
  core->owners.resize(cluster.shard_count);
  core->queried.resize(cluster.shard_count, 0);

  std::size_t n = std::bit_ceil(std::max<std::size_t>(1, 4 * system.threads()));
  core->client_mask = n - 1;
  for (std::size_t i = 0; i < n; ++i) {
    auto ref = spawn_client(system, core->type + "-client-" + std::to_string(i), std::weak_ptr<Core>(core));
    if (!ref) return Error(ErrorCode::shutting_down, "keyed lock '" + settings.name + "': the actor system is shutting down");
    core->clients.push_back(std::move(ref));
  }
  core->host = spawn_host(system, core->type + "-host", std::weak_ptr<Core>(core));
  auto backend = std::make_shared<Backend>(core);
  if (!core->host) return Error(ErrorCode::shutting_down, "keyed lock '" + settings.name + "': the actor system is shutting down");

  if (auto r = remoting.add_inbox(core->type, std::make_shared<WireInbox>(core, core->codecs)); !r.ok()) {
    core->stopped = true;
    for (auto& c : core->clients) c.stop();
    core->host.stop();
    return bad("a lock of this name runs on this node already (" + r.error().message() + ")");
  }
  std::weak_ptr<Core> weak = core;
  ShardDirectory::Host host;
  host.start = [weak](std::uint32_t shard, std::uint64_t epoch) {
    if (auto c = weak.lock()) (void)c->host.tell(HostStart{shard, epoch});
  };
  host.stop = [weak](std::uint32_t shard, std::uint64_t epoch, bool) {
    if (auto c = weak.lock()) (void)c->host.tell(HostStop{shard, epoch});
  };
  host.node_left = [weak](std::string_view node) {
    auto c = weak.lock();
    if (!c) return;
    c->forget_node(node);
    (void)c->host.tell(NodeLeft{std::string(node)});
    for (auto& cl : c->clients) (void)cl.tell(NodeLeft{std::string(node)});
  };
  if (auto r = directory.attach(core->type, cluster.shard_count, std::move(host)); !r.ok()) {
    core->stopped = true;
    (void)remoting.unpublish(core->type);
    for (auto& c : core->clients) c.stop();
    core->host.stop();
    return std::move(r).error();
  }
  return troupe::detail::make_keyed_lock(std::move(settings), std::move(backend));
}

}  // namespace troupe::cluster
