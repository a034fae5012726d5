#pragma once
// The seam between remote.hpp and the remoting layer (src/cluster/remote.cpp):
// the inbox a published actor or a shard region receives frames through,
// the frame kinds, and the calls RemoteRef and shard regions send and ask
// with. Frames are described in doc/wire.md ("Remote actors").

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "troupe/cluster/messages.hpp"
#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/result.hpp"

namespace troupe::cluster::detail {


// What arrives for one published actor or one shard region. Implemented by
// ActorInbox below and by shard regions; called on a transport thread, must not block.
class Inbox {
 public:
  virtual ~Inbox() = default;
  // `sink` is set for an ask: the decoded request's reply target sends the
  // answer back through it. An error (bytes that do not decode) is logged
  // by the caller with the sending node; the sink, if any, was answered.
  virtual Result<void> deliver(std::string_view from, std::uint32_t msg_id, std::string_view bytes,
                               std::optional<ReplySink> sink) = 0;
  // Frames of the entity kinds: `rest` is everything after the inbox name.
  virtual Result<void> deliver_entity(std::string_view /*from*/, std::string_view /*rest*/,
                                      std::optional<ReplySink> /*sink*/) {
    return Error(ErrorCode::protocol_error, "an entity frame for an inbox that is not a shard region");
  }
};

// The shared part of Remoting: the transport, the published inboxes and the
// asks waiting for their replies. Thread-safe.
class RemotingCore;

// Frame kinds of the remoting layer inside a transport DATA frame (the
// transport's message type); doc/wire.md.
enum class RemoteKind : std::uint32_t {
  actor_tell = 1,
  actor_ask = 2,
  reply = 3,
  entity_tell = 4,
  entity_ask = 5,
  shard_control = 6,
};

// A tell or ask sent under a trace (SPEC X4) has this bit set in its frame
// type, and its payload starts with the trace context (kTraceBytes: 16
// bytes trace id, 8 bytes span id, 1 byte flags); doc/wire.md.
inline constexpr std::uint32_t kTracedKind = 0x100;
inline constexpr std::size_t kTraceBytes = 25;

// Starts a frame: kind-specific header written by the caller, then the
// message id and its bytes.
Result<void> send_frame(RemotingCore& core, std::string_view node, RemoteKind kind, std::string_view frame);
// Registers a pending ask; the frame must start with the returned request
// id (u64). Errors: shutting_down.
std::uint64_t add_pending(RemotingCore& core, std::string_view node, PendingReply reply, Duration timeout);
void fail_pending(RemotingCore& core, std::uint64_t req, Error e);
// True on the thread that completes the pending asks of a node whose
// connection was lost or that left the cluster, while it does: the
// `unreachable` error such an ask's reply function gets means "out on the
// wire when the owner went away" (handled or not), not an error the remote
// node answered. Shard regions re-send idempotent asks on it.
bool completing_lost_requests() noexcept;
ByteWriter& scratch_writer();
ActorSystem& system_of(RemotingCore& core);

// The inbox of an actor published with Remoting::publish: decodes each
// message and tells it to the actor.
template <class M>
class ActorInbox final : public Inbox {
 public:
  ActorInbox(ActorRef<M> r, MessageCodecs<M> c) : ref_(std::move(r)), codecs_(std::move(c)) {}
  Result<void> deliver(std::string_view, std::uint32_t msg_id, std::string_view bytes,
                       std::optional<ReplySink> sink) override {
    auto m = codecs_.decode(msg_id, bytes, sink ? &*sink : nullptr);
    if (!m.ok()) {
      if (sink) (*sink)(ReplyBytes(m.error()));
      return std::move(m).error();
    }
    // A refused request is answered no_reply as its reply target is
    // dropped with the message.
    (void)ref_.tell(std::move(m.value()));
    return {};
  }
 private:
  ActorRef<M> ref_;
  MessageCodecs<M> codecs_;
};

}  // namespace troupe::cluster::detail
