#pragma once
// Remote actors: an actor published under a name on one node, told and
// asked from another.
//
//   // node b
//   remoting.publish<Counter::message_type>("counter", counter_ref, codecs);
//   // node a
//   auto counter = remoting.remote<Counter::message_type>("b", "counter", codecs);
//   counter.tell(Add{5});
//   troupe::Future<long> v = counter.ask<long>([](auto r) { return Get{std::move(r)}; }, 1s);
//
// Messages cross the node pair's one TCP connection (Transport), so
// messages from one sender to one remote actor arrive in the order sent.
// A remote ask completes with the reply, the error the remote actor
// answered, timeout, or unreachable if the connection to the node was lost
// while the request was out (the request may or may not have been handled:
// the usual at-most-once of a request over a network). On the target node,
// delivery follows the local rules for tells: a message to a stopped actor
// is a dead letter there; a request nobody published under that name is
// answered with dead_letter; a request the mailbox refuses (stopped, full)
// is answered with no_reply at once, never left to time out.
//
// Threads: frames arrive on the transport's io thread, which serves every
// connection of the node, so the only user code it runs is the message
// codecs (decoding a request or a reply). A request goes to its actor's
// mailbox. An answer completes the asker's future there: a blocked get() is
// woken, and a continuation attached with then() is handed to an actor
// (troupe.remoting.continuations) that runs such continuations on a worker,
// one after another in the order their answers arrived. A continuation that
// blocks therefore holds up the others, never the connections. A request
// or an answer sent on a connection on which something has just arrived is
// written by the sending thread itself (Transport::send).
//
// The frames are described in doc/wire.md ("Remote actors").

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "troupe/cluster/detail/remote_inbox.hpp"
#include "troupe/cluster/messages.hpp"
#include "troupe/cluster/transport.hpp"
#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/result.hpp"

namespace troupe::cluster {

class Transport;

// A reference to an actor published on another node. Copyable and cheap;
// thread-safe. Holds the remoting layer alive while it exists (tells after
// Remoting::stop() are refused with shutting_down).
template <class M>
class RemoteRef {
 public:
  RemoteRef() = default;

  // One-way. Errors: invalid_argument (no codec for the message),
  // unreachable (unknown node), buffer_overflow (the connection's outbound
  // queue is full), shutting_down. Success means queued for the node, not
  // delivered: a remote tell is at most once, like a local one to an actor
  // that may stop.
  Result<void> tell(M m) const {
    ByteWriter& w = detail::scratch_writer();
    w.bytes().clear();
    w.str(name_);
    std::size_t id_at = w.bytes().size();
    w.u32(0);
    std::optional<PendingReply> none;
    auto id = codecs_->encode(m, w, none);
    if (!id.ok()) return std::move(id).error();
    patch_u32(w.bytes(), id_at, id.value());
    return detail::send_frame(*core_, node_, detail::RemoteKind::actor_tell, w.bytes());
  }

  // Request/response: `make(ReplyTo<R>)` builds the request.
  template <class R, class Make>
  Future<R> ask(Make&& make, Duration timeout) const {
    auto [future, request] = detail::system_of(*core_).template ask_with<R>(std::forward<Make>(make), timeout);
    M m(std::move(request));
    ByteWriter& w = detail::scratch_writer();
    w.bytes().clear();
    w.u64(0);
    w.str(name_);
    std::size_t id_at = w.bytes().size();
    w.u32(0);
    std::optional<PendingReply> reply;
    auto id = codecs_->encode(m, w, reply);
    if (!id.ok()) {
      fail_request(m, id.error());
      return std::move(future);
    }
    if (!reply) {
      fail_request(m, Error(ErrorCode::invalid_argument, "ask with a message that has no reply_to member"));
      return std::move(future);
    }
    patch_u32(w.bytes(), id_at, id.value());
    std::uint64_t req = detail::add_pending(*core_, node_, std::move(*reply), timeout);
    patch_u64(w.bytes(), 0, req);
    auto sent = detail::send_frame(*core_, node_, detail::RemoteKind::actor_ask, w.bytes());
    if (!sent.ok()) detail::fail_pending(*core_, req, std::move(sent).error());
    return std::move(future);
  }

  const std::string& node() const noexcept { return node_; }
  const std::string& name() const noexcept { return name_; }
  explicit operator bool() const noexcept { return core_ != nullptr; }

 private:
  friend class Remoting;
  RemoteRef(std::shared_ptr<detail::RemotingCore> core, std::string node, std::string name,
            std::shared_ptr<const MessageCodecs<M>> codecs)
      : core_(std::move(core)), node_(std::move(node)), name_(std::move(name)), codecs_(std::move(codecs)) {}

  static void patch_u32(std::string& b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  static void patch_u64(std::string& b, std::size_t at, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  static void fail_request(M& m, const Error& e) {
    detail::fail_reply_target(m, e);
  }

  std::shared_ptr<detail::RemotingCore> core_;
  std::string node_;
  std::string name_;
  std::shared_ptr<const MessageCodecs<M>> codecs_;
};

// The remoting layer of one node: publishes local actors and makes
// references to remote ones. Owns its Transport (one listening port, one
// connection per node pair); shares the actor system with the caller, who
// must stop() this before shutting the system down. Thread-safe.
class Remoting {
 public:
  struct Settings {
    std::string node_id;
    std::string listen_host = "127.0.0.1";
    std::uint16_t listen_port = 0;  // 0: any free port
    std::size_t max_frame_bytes = 16u << 20;
    std::size_t max_outbound_bytes = 64u << 20;
    // Requests answered neither way this long after their own timeout are
    // forgotten (their futures completed with timeout long before).
    Duration forget_after = std::chrono::seconds(5);
    // Tells and asks sent under a trace carry it to the other node (SPEC
    // X4; doc/wire.md). Nodes built before trace ids drop such frames: turn
    // this off while any of them is still a member (a rolling upgrade).
    bool send_traces = true;
    // TLS (or insecure = true: plain TCP) and the limits of the transport's
    // port. One of tls and insecure must be given (transport.hpp).
    TransportSecurity security{};
  };

  // Errors: invalid_argument (node id), or what the transport reports
  // (the port in use...).
  static Result<std::unique_ptr<Remoting>> start(ActorSystem& system, Settings settings);
  ~Remoting();
  Remoting(const Remoting&) = delete;
  Remoting& operator=(const Remoting&) = delete;

  const std::string& node_id() const;
  std::uint16_t port() const;
  // The address book: where node `id` listens. Membership (Redis) fills it
  // in a cluster; tests and two-node setups call it directly.
  void set_peer(std::string id, std::string host, std::uint16_t port);
  void remove_peer(std::string_view id);

  // Makes `ref` reachable from other nodes as `name`. invalid_argument if
  // the name is taken or empty.
  template <class M>
  Result<void> publish(std::string name, ActorRef<M> ref, MessageCodecs<M> codecs) {
    if (!ref) return Error(ErrorCode::invalid_argument, "publish '" + name + "': empty actor reference");
    auto inbox = std::make_shared<detail::ActorInbox<M>>(std::move(ref), std::move(codecs));
    return add_inbox(std::move(name), std::move(inbox));
  }
  Result<void> unpublish(std::string_view name);

  // A reference to the actor published as `name` on `node`. Nothing is
  // checked until it is used (the node may not be up yet).
  template <class M>
  RemoteRef<M> remote(std::string node, std::string name, std::shared_ptr<const MessageCodecs<M>> codecs) const {
    return RemoteRef<M>(core_, std::move(node), std::move(name), std::move(codecs));
  }

  // For layers built on remoting (shard regions): an inbox under a name
  // for one frame kind.
  Result<void> add_inbox(std::string name, std::shared_ptr<detail::Inbox> inbox);
  // Cluster control notices between nodes (a node leaving): one handler,
  // called on a transport thread; and a notice to one node.
  using ControlHandler = std::function<void(std::string_view from, std::string_view payload)>;
  void on_control(ControlHandler handler);
  Result<void> send_control(std::string_view node, std::string_view payload);
  detail::RemotingCore& core() const { return *core_; }
  Transport& transport() const;

  // Replies this node owes other nodes: asks that arrived and whose reply
  // has not yet been handed to the transport (nor dropped unanswered).
  std::size_t owed_replies() const noexcept;
  // Asks this node sent that wait for their answer.
  std::size_t asks_waiting() const;
  // Data frames received since start: a leaving node waits until this stops
  // moving (and nothing is owed) before it stops.
  std::uint64_t frames_received() const noexcept;

  // Stops the transport: no inbox is called after it returns; asks still
  // waiting complete with shutting_down. Idempotent.
  void stop();

 private:
  explicit Remoting(std::shared_ptr<detail::RemotingCore> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::RemotingCore> core_;
};

}  // namespace troupe::cluster
