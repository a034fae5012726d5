#include "troupe/cluster/cluster.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {
namespace {

constexpr std::string_view kLeavingNotice = "leaving";

// The shard directory over the Redis coordinator: shards are the units of
// group "shards/<type>", named by their number.
class RedisShardDirectory final : public ShardDirectory {
 public:
  RedisShardDirectory(std::string self, Duration declare_bound)
      : self_(std::move(self)), declare_bound_(declare_bound) {}

  void bind(Coordinator* c) { coordinator_ = c; }
  void set_fenced(bool f) { fenced_.store(f, std::memory_order_release); }

  const std::string& self() const override { return self_; }

  Result<void> attach(const std::string& type, std::uint32_t shard_count, Host host) override {
    auto twice = [&] {
      return Error(ErrorCode::invalid_argument, "entity type '" + type + "' is already attached on node '" + self_ + "'");
    };
    {
      std::lock_guard lk(mu_);
      if (types_.count(type)) return twice();
    }
    // Declared before it is served, so this node is given no shard of a
    // type whose roles it disagrees on.
    auto declared = coordinator_->declare_roles(detail::shard_group(type), host.roles);
    if (!declared.wait_for(declare_bound_)) {
      return Error(ErrorCode::timeout, "node '" + self_ + "' could not declare the roles of entity type '" + type +
                                           "' in Redis in time");
    }
    if (auto d = declared.get(); !d.ok()) return Error(d.error().code(), "entity type '" + type + "': " + d.error().message());
    {
      std::lock_guard lk(mu_);
      if (types_.count(type)) return twice();
      types_[type] = Type{shard_count, host, true};
    }
    Reconciler r;
    r.start = [this, type](const std::string& unit, const std::string&, std::uint64_t epoch) {
      auto s = shard_number(type, unit);
      if (!s) return;
      note_start(type, *s, epoch);
      if (auto h = host_of(type)) h->start(*s, epoch);
    };
    r.update = [](const std::string&, const std::string&, std::uint64_t) {};
    r.stop = [this, type](const std::string& unit) -> Future<void> {
      Promise<void> p;
      Future<void> f = p.future();
      auto s = shard_number(type, unit);
      auto h = host_of(type);
      if (!s || !h) {
        p.set_value();
        return f;
      }
      std::uint64_t epoch = 0;
      {
        std::lock_guard lk(mu_);
        auto& pending = stops_[{type, *s}];
        // A second stop for the same shard (a fence during a hand-off)
        // completes with the first.
        if (pending) {
          Promise<void> earlier = std::move(*pending);
          pending.emplace(std::move(p));
          earlier.set_value();
        } else {
          pending.emplace(std::move(p));
        }
        epoch = epochs_[{type, *s}];
      }
      bool immediate = fenced_.load(std::memory_order_acquire) || (coordinator_ && coordinator_->is_fenced());
      h->stop(*s, epoch, immediate);
      return f;
    };
    auto served = coordinator_->serve(detail::shard_group(type), std::move(r));
    if (!served.ok()) {
      std::lock_guard lk(mu_);
      types_.erase(type);
      return served;
    }
    return {};
  }

  void detach(const std::string& type) override {
    std::lock_guard lk(mu_);
    auto it = types_.find(type);
    if (it != types_.end()) it->second.attached = false;
  }

  void locate(const std::string& type, std::uint32_t shard, Located done) override {
    coordinator_->assign(detail::shard_group(type), std::to_string(shard), "")
        .then([this, type, shard, done = std::move(done)](Result<Placement> p) mutable {
          if (!p.ok()) return done(std::move(p).error());
          const Assignment& a = p.value().assignment;
          if (a.owner == self_) {
            std::lock_guard lk(mu_);
            epochs_[{type, shard}] = a.epoch;
          }
          done(Location{a.owner, a.epoch});
        });
  }

  void released(const std::string& type, std::uint32_t shard, std::uint64_t) override {
    std::optional<Promise<void>> p;
    {
      std::lock_guard lk(mu_);
      auto it = stops_.find({type, shard});
      if (it == stops_.end() || !it->second) return;
      p = std::move(it->second);
      stops_.erase(it);
    }
    // The coordinator releases the unit in Redis when this completes.
    p->set_value();
  }

  void note_start(const std::string& type, std::uint32_t shard, std::uint64_t epoch) {
    std::lock_guard lk(mu_);
    epochs_[{type, shard}] = epoch;
  }

  void node_left(std::string_view node) {
    std::vector<Host> hosts;
    {
      std::lock_guard lk(mu_);
      for (auto& [t, type] : types_)
        if (type.attached) hosts.push_back(type.host);
    }
    for (auto& h : hosts) h.node_left(node);
  }

 private:
  struct Type {
    std::uint32_t shard_count = 0;
    Host host;
    bool attached = false;
  };

  std::optional<std::uint32_t> shard_number(const std::string& type, const std::string& unit) {
    std::uint32_t n = 0;
    auto [end, ec] = std::from_chars(unit.data(), unit.data() + unit.size(), n);
    std::lock_guard lk(mu_);
    auto it = types_.find(type);
    if (ec != std::errc() || end != unit.data() + unit.size() || it == types_.end() || n >= it->second.shard_count)
      return std::nullopt;
    return n;
  }

  std::optional<Host> host_of(const std::string& type) {
    std::lock_guard lk(mu_);
    auto it = types_.find(type);
    if (it == types_.end() || !it->second.attached) return std::nullopt;
    return it->second.host;
  }

  std::string self_;
  Duration declare_bound_;
  Coordinator* coordinator_ = nullptr;
  std::atomic<bool> fenced_{false};
  std::mutex mu_;
  std::map<std::string, Type> types_;
  std::map<std::pair<std::string, std::uint32_t>, std::optional<Promise<void>>> stops_;
  std::map<std::pair<std::string, std::uint32_t>, std::uint64_t> epochs_;
};

}  // namespace

struct Cluster::Impl {
  ClusterSettings settings;
  std::unique_ptr<Remoting> remoting;
  std::unique_ptr<RedisShardDirectory> directory;
  std::mutex members_mu;
  std::map<std::string, Address> peers;  // the members the transport knows, but this node
  std::mutex destroy_mu;
  std::vector<std::function<void()>> at_destroy;
  // Declared last: destroyed first, so no coordinator callback runs on the
  // members above after they are gone.
  std::unique_ptr<Coordinator> coordinator;

  void members_changed(const std::vector<Member>& members) {
    std::vector<std::pair<std::string, Address>> added;
    std::vector<std::string> gone;
    {
      std::lock_guard lk(members_mu);
      std::map<std::string, Address> now;
      for (const auto& m : members)
        if (m.id != settings.node_id) now[m.id] = m.address;
      for (const auto& [id, addr] : now) {
        auto it = peers.find(id);
        if (it == peers.end() || !(it->second == addr)) added.emplace_back(id, addr);
      }
      for (const auto& [id, addr] : peers)
        if (!now.count(id)) gone.push_back(id);
      peers = std::move(now);
    }
    for (auto& [id, addr] : added) remoting->set_peer(id, addr.host, addr.port);
    for (auto& id : gone) {
      remoting->remove_peer(id);
      directory->node_left(id);
    }
  }
};

Cluster::Cluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Cluster>> Cluster::start(ActorSystem& system, ClusterSettings settings) {
  if (auto ok = validate_node_id(settings.node_id); !ok.ok()) return std::move(ok).error();
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  Remoting::Settings rs;
  rs.node_id = settings.node_id;
  rs.listen_host = settings.listen_host;
  rs.listen_port = settings.listen_port;
  rs.max_frame_bytes = settings.max_frame_bytes;
  rs.max_outbound_bytes = settings.max_outbound_bytes;
  rs.send_traces = settings.send_traces;
  rs.security = settings.security;
  auto remoting = Remoting::start(system, rs);
  if (!remoting.ok()) return std::move(remoting).error();
  impl->remoting = std::move(remoting.value());
  // Declaring a type's roles is one script: bounded like a reply, twice
  // over for a reconnection.
  impl->directory = std::make_unique<RedisShardDirectory>(settings.node_id, 2 * settings.coordination.command_timeout +
                                                                                settings.coordination.heartbeat_interval);

  CoordinatorSettings cs = settings.coordination;
  cs.node_id = settings.node_id;
  cs.roles = settings.roles;
  cs.address = Address{settings.advertise_host.empty() ? settings.listen_host : settings.advertise_host,
                       impl->remoting->port()};
  Impl* raw = impl.get();
  auto user_members = cs.on_members_changed;
  cs.on_members_changed = [raw, user_members](const std::vector<Member>& m) {
    raw->members_changed(m);
    if (user_members) user_members(m);
  };
  auto user_fenced = cs.on_fenced;
  cs.on_fenced = [raw, user_fenced] {
    raw->directory->set_fenced(true);
    if (user_fenced) user_fenced();
  };
  auto user_unfenced = cs.on_unfenced;
  cs.on_unfenced = [raw, user_unfenced] {
    raw->directory->set_fenced(false);
    if (user_unfenced) user_unfenced();
  };
  // A node that leaves gracefully says so to every peer once its shards
  // are handed off, so they stop sending to it before their next
  // heartbeat shows it gone.
  impl->remoting->on_control([raw](std::string_view from, std::string_view payload) {
    if (payload == kLeavingNotice) raw->directory->node_left(from);
  });
  auto coordinator = Coordinator::create(std::move(cs));
  if (!coordinator.ok()) {
    impl->remoting->stop();
    return std::move(coordinator).error();
  }
  impl->coordinator = std::move(coordinator.value());
  impl->directory->bind(impl->coordinator.get());
  auto started = impl->coordinator->start();
  if (!started.wait_for(settings.start_timeout)) {
    impl->coordinator.reset();
    impl->remoting->stop();
    return Error(ErrorCode::timeout, "node '" + settings.node_id + "' did not register with Redis within " +
                                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(settings.start_timeout).count()) + " s");
  }
  auto r = started.get();
  if (!r.ok()) {
    impl->coordinator.reset();
    impl->remoting->stop();
    return std::move(r).error();
  }
  return std::unique_ptr<Cluster>(new Cluster(std::move(impl)));
}

Cluster::~Cluster() {
  if (!impl_) return;
  std::vector<std::function<void()>> last;
  {
    std::lock_guard lock(impl_->destroy_mu);
    last.swap(impl_->at_destroy);
  }
  for (auto& f : last) f();
  impl_->coordinator.reset();
  impl_->remoting->stop();
}

void Cluster::at_destroy(std::function<void()> f) {
  std::lock_guard lock(impl_->destroy_mu);
  impl_->at_destroy.push_back(std::move(f));
}

const std::string& Cluster::node_id() const { return impl_->settings.node_id; }
Remoting& Cluster::remoting() { return *impl_->remoting; }
Coordinator& Cluster::coordinator() { return *impl_->coordinator; }
ShardDirectory& Cluster::directory() { return *impl_->directory; }

Result<HandOffReport> Cluster::leave(Duration bound, std::function<void(const HandOffReport&)> progress) {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + bound;
  const std::string& self = impl_->settings.node_id;
  auto late = [&](const char* step) {
    return Error(ErrorCode::timeout, "node '" + self + "' did not finish " + step + " within " +
                                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(bound).count()) +
                                         " s");
  };
  std::optional<Error> failed;
  HandOffReport report;
  auto handed = impl_->coordinator->hand_off(std::max<std::size_t>(1, impl_->settings.hand_off_batch), std::move(progress));
  if (!handed.wait_for(until - Clock::now())) {
    // Out of time: it leaves all the same; stop() stops what is left.
    failed = late("handing off its shards");
  } else if (auto h = handed.get(); h.ok()) {
    report = h.value();
  } else {
    failed = std::move(h).error();  // the stop below stops and hands over what is left
  }

  std::vector<std::string> peers;
  {
    std::lock_guard lk(impl_->members_mu);
    for (auto& [id, addr] : impl_->peers) peers.push_back(id);
  }
  for (auto& p : peers) (void)impl_->remoting->send_control(p, kLeavingNotice);
  // Stay reachable until the replies owed to other nodes are sent (within
  // the bound), and, for at most two heartbeats (capped at 2 s), until the
  // answers this node waits for have come and no frame has arrived for a
  // moment: the others have heard the notice and stopped sending.
  const auto grace = std::min<Duration>(2 * impl_->settings.coordination.heartbeat_interval, std::chrono::seconds(2));
  const auto grace_until = std::min(until, Clock::now() + grace);
  constexpr auto kQuiet = std::chrono::milliseconds(100);
  auto frames = impl_->remoting->frames_received();
  auto quiet_since = Clock::now();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto now = Clock::now();
    if (auto f = impl_->remoting->frames_received(); f != frames) {
      frames = f;
      quiet_since = now;
    }
    const bool owes = impl_->remoting->owed_replies() > 0;
    const bool quiet = impl_->remoting->asks_waiting() == 0 && now - quiet_since >= kQuiet;
    if ((!owes && (quiet || now >= grace_until)) || now >= until) break;
  }

  // The stop gets what is left of the bound, and a few seconds at least
  // when the hand-off used it all up.
  auto done = impl_->coordinator->stop();
  if (!done.wait_for(std::max<Duration>(until - Clock::now(), std::chrono::seconds(5)))) {
    impl_->remoting->stop();
    return failed ? std::move(*failed) : late("leaving");
  }
  auto r = done.get();
  impl_->remoting->stop();
  if (failed) return std::move(*failed);
  if (!r.ok()) return std::move(r).error();
  return report;
}

}  // namespace troupe::cluster
