#include "troupe/cluster/remote.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remote_envelope.hpp"
#include "troupe/cluster/node_id.hpp"
#include "troupe/cluster/transport.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster {
namespace detail {
namespace {

// Set while fail_node() completes the requests of a lost connection or a
// departed node (see completing_lost_requests()).
thread_local bool t_completing_lost = false;

struct LostRequests {
  LostRequests() noexcept : was_(std::exchange(t_completing_lost, true)) {}
  ~LostRequests() { t_completing_lost = was_; }
  LostRequests(const LostRequests&) = delete;
  LostRequests& operator=(const LostRequests&) = delete;

 private:
  bool was_;
};

}  // namespace

bool completing_lost_requests() noexcept { return t_completing_lost; }

// A continuation on its way from the io thread to a worker. It runs exactly
// once: when the runner handles it or, if the actor system refuses or drops
// it (shutting down), wherever it is destroyed.
class Continuation {
 public:
  explicit Continuation(troupe::detail::UniqueFunction<void()> f) : f_(std::move(f)) {}
  Continuation(Continuation&&) noexcept = default;
  Continuation& operator=(Continuation&&) = delete;
  ~Continuation() { run(); }
  void run() {
    if (auto f = std::move(f_)) f();
  }

 private:
  troupe::detail::UniqueFunction<void()> f_;
};

// Runs, one after another in the order they arrived, the continuations of
// futures that the io thread completed (see ContinuationsElsewhere).
struct ContinuationRunner final : Actor<Continuation> {
  void receive(Continuation& c) { c.run(); }
};

// Ownership: owned by Remoting and shared by RemoteRefs and reply sinks.
// Thread safety: every member may be called from any thread.
class RemotingCore : public std::enable_shared_from_this<RemotingCore>,
                     public troupe::detail::ContinuationExecutor {
 public:
  explicit RemotingCore(ActorSystem& s, Duration forget_after)
      : system(s),
        runner_(s.spawn<ContinuationRunner>(SpawnOptions{.name = "troupe.remoting.continuations"})),
        forget_after_(forget_after) {}

  ActorSystem& system;
  std::unique_ptr<Transport> transport;

  // Continuations of futures completed on the io thread: to the runner.
  void execute(troupe::detail::UniqueFunction<void()> task) noexcept override {
    (void)runner_.tell(Continuation(std::move(task)));
  }

  Result<void> add_inbox(std::string name, std::shared_ptr<Inbox> inbox) {
    if (name.empty()) return Error(ErrorCode::invalid_argument, "inbox name is empty");
    std::unique_lock lk(inbox_mu_);
    auto [it, fresh] = inboxes_.try_emplace(std::move(name), std::move(inbox));
    if (!fresh) return Error(ErrorCode::invalid_argument, "the name '" + it->first + "' is already published");
    return {};
  }
  Result<void> remove_inbox(std::string_view name) {
    std::unique_lock lk(inbox_mu_);
    auto it = inboxes_.find(std::string(name));
    if (it == inboxes_.end()) return Error(ErrorCode::invalid_argument, "nothing published as '" + std::string(name) + "'");
    inboxes_.erase(it);
    return {};
  }

  std::uint64_t add_pending(std::string_view node, PendingReply reply, Duration timeout) {
    auto now = std::chrono::steady_clock::now();
    std::vector<PendingReply> expired;
    std::uint64_t req;
    {
      std::lock_guard lk(pending_mu_);
      req = ++next_req_;
      pending_.emplace(req, Pending{std::string(node), std::move(reply), now + timeout + forget_after_});
      // Requests whose answer never comes (the node restarted, the reply was
      // refused there) would stay forever: forget them once their own
      // timeout is long past. Bounded work: at most once a second.
      if (now >= next_sweep_) {
        next_sweep_ = now + std::chrono::seconds(1);
        for (auto it = pending_.begin(); it != pending_.end();) {
          if (it->second.forget_at <= now) {
            expired.push_back(std::move(it->second.reply));
            it = pending_.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (auto& e : expired) e(Result<std::string_view>(Error(ErrorCode::timeout, "no answer from the remote node")));
    return req;
  }

  std::size_t waiting() {
    std::lock_guard lk(pending_mu_);
    return pending_.size();
  }

  void complete(std::uint64_t req, Result<std::string_view> r) {
    PendingReply reply;
    {
      std::lock_guard lk(pending_mu_);
      auto it = pending_.find(req);
      if (it == pending_.end()) return;  // answered after it was forgotten
      reply = std::move(it->second.reply);
      pending_.erase(it);
    }
    reply(std::move(r));
  }

  // The connection to `node` is gone, or the node left: requests out on it
  // may never be answered. They complete now rather than at their timeout,
  // in the order they were sent (request ids grow), so a layer that sends
  // some of them again (a shard region's idempotent asks) keeps their order.
  void fail_node(std::string_view node, const Error& e) {
    std::vector<std::pair<std::uint64_t, PendingReply>> failed;
    {
      std::lock_guard lk(pending_mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.node == node) {
          failed.emplace_back(it->first, std::move(it->second.reply));
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    std::sort(failed.begin(), failed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    LostRequests scope;
    for (auto& f : failed) f.second(Result<std::string_view>(e));
  }

  void fail_all(const Error& e) {
    std::unordered_map<std::uint64_t, Pending> all;
    {
      std::lock_guard lk(pending_mu_);
      all.swap(pending_);
    }
    for (auto& [req, p] : all) p.reply(Result<std::string_view>(e));
  }

  void log(std::string_view line) { log::warn(log::Component::cluster, line); }

  // Called on a transport thread for every data frame.
  void on_frame(std::string_view from, std::uint32_t type, std::string_view payload) {
    frames_in_.fetch_add(1, std::memory_order_relaxed);
    // A command sent under a trace is delivered under it: the messages the
    // inbox tells carry it on this node.
    auto trace = take_trace(type, payload);
    if (!trace.ok()) return refuse(from, static_cast<RemoteKind>(type), payload, trace.error());
    std::optional<TraceScope> scope;
    if (*trace) scope.emplace(**trace);
    auto parsed = parse_envelope(type, payload);
    if (!parsed.ok()) return refuse(from, static_cast<RemoteKind>(type), payload, parsed.error());
    Envelope& e = parsed.value();
    switch (e.kind) {
      case RemoteKind::actor_tell:
      case RemoteKind::entity_tell:
      case RemoteKind::actor_ask:
      case RemoteKind::entity_ask:
        return dispatch(from, e);
      case RemoteKind::reply:
        if (e.failed) return complete(e.req, Result<std::string_view>(Error(e.code, std::string(e.message))));
        return complete(e.req, Result<std::string_view>(e.body));
      case RemoteKind::shard_control: {
        ControlHandler h;
        {
          std::shared_lock lk(inbox_mu_);
          h = control_;
        }
        if (h) h(from, e.body);
        return;
      }
    }
  }

  Result<void> send(std::string_view node, RemoteKind kind, std::string_view frame) {
    if (stopped_.load(std::memory_order_acquire))
      return Error(ErrorCode::shutting_down, "remoting on node '" + node_id + "' is stopped");
    if (troupe::detail::t_trace && send_traces && kind != RemoteKind::reply && kind != RemoteKind::shard_control)
        [[unlikely]] {
      // Sent under a trace: the trace goes first (doc/wire.md).
      thread_local std::string traced;
      traced.clear();
      put_trace(traced, troupe::detail::t_trace->ctx);
      traced.append(frame);
      return transport->send(node, static_cast<std::uint32_t>(kind) | kTracedKind, traced);
    }
    return transport->send(node, static_cast<std::uint32_t>(kind), frame);
  }

  void stop() {
    if (stopped_.exchange(true)) return;
    if (transport) transport->stop();
    fail_all(Error(ErrorCode::shutting_down, "remoting on node '" + node_id + "' stopped"));
  }

  std::string node_id;
  bool send_traces = true;  // Remoting::Settings::send_traces
  using ControlHandler = Remoting::ControlHandler;
  void set_control(ControlHandler h) {
    std::unique_lock lk(inbox_mu_);
    control_ = std::move(h);
  }

 private:
  ControlHandler control_;
  struct Pending {
    std::string node;
    PendingReply reply;
    std::chrono::steady_clock::time_point forget_at;
  };

  std::shared_ptr<Inbox> find(std::string_view name) {
    std::shared_lock lk(inbox_mu_);
    auto it = inboxes_.find(std::string(name));
    return it == inboxes_.end() ? nullptr : it->second;
  }

  // One reply this node owes another: counted from the ask's arrival until
  // its reply was handed to the transport, or its sink was dropped
  // unanswered. Move-only; it holds the core weakly.
  class Owed {
   public:
    explicit Owed(RemotingCore& core) : core_(core.weak_from_this()) {
      core.owed_.fetch_add(1, std::memory_order_relaxed);
    }
    Owed(Owed&& o) noexcept : core_(std::move(o.core_)), live_(std::exchange(o.live_, false)) {}
    Owed& operator=(Owed&&) = delete;
    ~Owed() {
      if (!live_) return;
      if (auto c = core_.lock()) settle(*c);
    }
    std::shared_ptr<RemotingCore> core() const { return core_.lock(); }
    void settle(RemotingCore& c) {
      if (std::exchange(live_, false)) c.owed_.fetch_sub(1, std::memory_order_release);
    }

   private:
    std::weak_ptr<RemotingCore> core_;
    bool live_ = true;
  };

  ReplySink sink_for(std::string_view from, std::uint64_t req) {
    // The sink may run after remoting stopped (a late reply): it holds the
    // core weakly and drops the answer then.
    return [owed = Owed(*this), node = std::string(from), req](ReplyBytes r) mutable {
      auto core = owed.core();
      if (!core) return;
      ByteWriter& out = scratch_writer();
      out.bytes().clear();
      out.u64(req);
      if (r.ok()) {
        out.u8(0);
        out.bytes().append(r.value());
      } else {
        out.u8(1);
        out.u32(static_cast<std::uint32_t>(r.error().code()));
        out.str(r.error().message());
      }
      auto sent = core->send(node, RemoteKind::reply, out.bytes());
      owed.settle(*core);
      if (!sent.ok()) core->log("reply to node '" + node + "' not sent: " + sent.error().message());
    };
  }

  void dispatch(std::string_view from, Envelope& e) {
    const bool ask = e.kind == RemoteKind::actor_ask || e.kind == RemoteKind::entity_ask;
    std::optional<ReplySink> sink;
    if (ask) sink.emplace(sink_for(from, e.req));
    auto inbox = find(e.name);
    if (!inbox) {
      if (sink) (*sink)(ReplyBytes(Error(ErrorCode::dead_letter, "nothing is published as '" + std::string(e.name) + "' on node '" + node_id + "'")));
      return;
    }
    Result<void> done;
    if (e.kind == RemoteKind::actor_tell || e.kind == RemoteKind::actor_ask) {
      if (!e.msg_id) return bad_frame(from, "frame ends inside its header", ask, e.req);
      done = inbox->deliver(from, *e.msg_id, e.body, std::move(sink));
    } else {
      done = inbox->deliver_entity(from, e.body, std::move(sink));
    }
    if (!done.ok())
      log("message for '" + std::string(e.name) + "' from node '" + std::string(from) + "' dropped: " + done.error().message());
  }

  // A frame whose envelope does not parse: logged and dropped; an ask is
  // answered with the reason.
  void refuse(std::string_view from, RemoteKind kind, std::string_view payload, const Error& why) {
    switch (kind) {
      case RemoteKind::actor_tell:
      case RemoteKind::entity_tell:
        return bad_frame(from, why.message(), false, 0);
      case RemoteKind::actor_ask:
      case RemoteKind::entity_ask:
        return bad_frame(from, why.message(), true, ask_request_id(payload));
      case RemoteKind::reply:
        return log(why.message() + " from node '" + std::string(from) + "' dropped");
      default:
        return log(why.message() + " from node '" + std::string(from) + "' ignored");
    }
  }

  void bad_frame(std::string_view from, std::string_view why, bool ask, std::uint64_t req) {
    log("frame from node '" + std::string(from) + "' dropped: " + std::string(why));
    if (ask) sink_for(from, req)(ReplyBytes(Error(ErrorCode::protocol_error, std::string(why))));
  }

  ActorRef<Continuation> runner_;
  std::shared_mutex inbox_mu_;
  std::unordered_map<std::string, std::shared_ptr<Inbox>> inboxes_;
  std::mutex pending_mu_;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::uint64_t next_req_ = 0;
  std::chrono::steady_clock::time_point next_sweep_{};
  Duration forget_after_;
  std::atomic<bool> stopped_{false};

 public:
  std::atomic<std::size_t> owed_{0};
  std::atomic<std::uint64_t> frames_in_{0};
};

Result<void> send_frame(RemotingCore& core, std::string_view node, RemoteKind kind, std::string_view frame) {
  return core.send(node, kind, frame);
}
std::uint64_t add_pending(RemotingCore& core, std::string_view node, PendingReply reply, Duration timeout) {
  return core.add_pending(node, std::move(reply), timeout);
}
void fail_pending(RemotingCore& core, std::uint64_t req, Error e) { core.complete(req, Result<std::string_view>(std::move(e))); }
ByteWriter& scratch_writer() {
  thread_local ByteWriter w;
  return w;
}
ActorSystem& system_of(RemotingCore& core) { return core.system; }

}  // namespace detail

Result<std::unique_ptr<Remoting>> Remoting::start(ActorSystem& system, Settings settings) {
  if (auto ok = validate_node_id(settings.node_id); !ok.ok()) return std::move(ok).error();
  auto core = std::make_shared<detail::RemotingCore>(system, settings.forget_after);
  core->node_id = settings.node_id;
  core->send_traces = settings.send_traces;
  TransportSettings ts;
  ts.node_id = settings.node_id;
  ts.listen_host = settings.listen_host;
  ts.listen_port = settings.listen_port;
  ts.max_frame_bytes = settings.max_frame_bytes;
  ts.max_outbound_bytes = settings.max_outbound_bytes;
  settings.security.apply(ts);
  std::weak_ptr<detail::RemotingCore> weak = core;
  auto t = Transport::start(
      std::move(ts),
      [raw = core.get()](std::string_view from, std::uint32_t type, std::string_view payload) {
        // The transport is stopped (no handler runs any more) before the
        // core is destroyed, so the raw pointer is safe here.
        troupe::detail::ContinuationsElsewhere not_here(raw);
        raw->on_frame(from, type, payload);
      },
      [weak](std::string_view node, bool connected) {
        if (connected) return;
        if (auto c = weak.lock()) {
          troupe::detail::ContinuationsElsewhere not_here(c.get());
          c->fail_node(node, Error(ErrorCode::unreachable, "connection to node '" + std::string(node) +
                                                                "' lost; the request may or may not have been handled"));
        }
      });
  if (!t.ok()) return std::move(t).error();
  core->transport = std::move(t.value());
  return std::unique_ptr<Remoting>(new Remoting(std::move(core)));
}

Remoting::~Remoting() { stop(); }
const std::string& Remoting::node_id() const { return core_->node_id; }
std::uint16_t Remoting::port() const { return core_->transport->port(); }
void Remoting::set_peer(std::string id, std::string host, std::uint16_t port) {
  core_->transport->set_peer(std::move(id), std::move(host), port);
}
void Remoting::remove_peer(std::string_view id) {
  core_->transport->remove_peer(id);
  // What was queued for it is dropped with it: requests out to it complete
  // now rather than at their timeout.
  core_->fail_node(id, Error(ErrorCode::unreachable, "node '" + std::string(id) +
                                                         "' left the cluster; the request may or may not have been handled"));
}
Result<void> Remoting::unpublish(std::string_view name) { return core_->remove_inbox(name); }
Result<void> Remoting::add_inbox(std::string name, std::shared_ptr<detail::Inbox> inbox) {
  return core_->add_inbox(std::move(name), std::move(inbox));
}
Transport& Remoting::transport() const { return *core_->transport; }
void Remoting::on_control(ControlHandler handler) { core_->set_control(std::move(handler)); }
Result<void> Remoting::send_control(std::string_view node, std::string_view payload) {
  return core_->send(node, detail::RemoteKind::shard_control, payload);
}
void Remoting::stop() { core_->stop(); }
std::size_t Remoting::asks_waiting() const { return core_->waiting(); }
std::size_t Remoting::owed_replies() const noexcept { return core_->owed_.load(std::memory_order_acquire); }
std::uint64_t Remoting::frames_received() const noexcept { return core_->frames_in_.load(std::memory_order_relaxed); }

}  // namespace troupe::cluster
