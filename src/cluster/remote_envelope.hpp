#pragma once
// The envelope of a remoting frame, parsed without side effects: a
// transport DATA frame's message type is a RemoteKind, and its payload
// starts with the fields doc/wire.md ("Remoting inside DATA frames") lists
// for that kind. parse_envelope() reads them and says where the message
// bytes are; RemotingCore::on_frame (remote.cpp) acts on the result, and
// remote_envelope_fuzz.cpp drives it with arbitrary bytes. Private to
// src/cluster. Inline: it runs for every remote message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "troupe/cluster/remote.hpp"
#include "troupe/core/trace.hpp"

namespace troupe::cluster::detail {

// One frame's envelope: views into the payload it was parsed from.
struct Envelope {
  RemoteKind kind{};
  // Asks and replies: the asking node's request id.
  std::uint64_t req = 0;
  // Tells and asks: the inbox (an actor's published name, or a region).
  std::string_view name;
  // Actor tells and asks: the message id; absent when the frame ends before
  // it. Checked after the inbox lookup, so that a name nothing is published
  // under is answered dead_letter first.
  std::optional<std::uint32_t> msg_id;
  // Actor tells and asks: the message bytes. Entity tells and asks: what
  // follows the region's name (the region parses it). A reply with status
  // 0: the answer's bytes. Control: the whole payload.
  std::string_view body;
  // A reply with status 1: the error the asker gets, its code and message.
  bool failed = false;
  ErrorCode code = ErrorCode::ok;
  std::string_view message;
};

// Reads the envelope of a DATA frame of `type`. Errors, all protocol_error
// with the reason: an unknown kind ("frame of unknown kind N"); a tell or
// ask that ends inside its request id or name ("frame ends inside its
// header"); a reply that ends inside its request id or status, or has a
// status other than 0 or 1 ("malformed reply"), or an error reply that ends
// inside its code or message ("malformed error reply").
// Always inlined into its caller, as it was written there before it was a
// function of its own.
[[gnu::always_inline]] inline Result<Envelope> parse_envelope(std::uint32_t type, std::string_view payload) {
  Envelope e;
  e.kind = static_cast<RemoteKind>(type);
  ByteReader r(payload);
  auto header_ends = [] { return Error(ErrorCode::protocol_error, "frame ends inside its header"); };
  switch (e.kind) {
    case RemoteKind::actor_ask:
    case RemoteKind::entity_ask:
      e.req = r.u64();
      [[fallthrough]];
    case RemoteKind::actor_tell:
    case RemoteKind::entity_tell: {
      // Strings as views (ByteReader::str would copy them): u32 length, bytes.
      const std::uint32_t n = r.u32();
      if (r.failed() || r.remaining() < n) return header_ends();
      const std::size_t at = payload.size() - r.remaining();
      e.name = payload.substr(at, n);
      const std::string_view rest = payload.substr(at + n);
      if (e.kind == RemoteKind::entity_tell || e.kind == RemoteKind::entity_ask) {
        e.body = rest;
        return e;
      }
      if (rest.size() < 4) return e;  // ends inside its message id: none
      e.msg_id = ByteReader(rest).u32();
      e.body = rest.substr(4);
      return e;
    }
    case RemoteKind::reply: {
      e.req = r.u64();
      const std::uint8_t status = r.u8();
      if (r.failed() || status > 1) return Error(ErrorCode::protocol_error, "malformed reply");
      if (status == 0) {
        e.body = payload.substr(payload.size() - r.remaining());
        return e;
      }
      e.code = static_cast<ErrorCode>(r.u32());
      const std::uint32_t n = r.u32();
      if (r.failed() || r.remaining() < n) return Error(ErrorCode::protocol_error, "malformed error reply");
      e.failed = true;
      e.message = payload.substr(payload.size() - r.remaining(), n);
      return e;
    }
    case RemoteKind::shard_control:
      e.body = payload;
      return e;
  }
  return Error(ErrorCode::protocol_error, "frame of unknown kind " + std::to_string(type));
}

// Takes the trace context off the front of a frame sent under a trace
// (kTracedKind set in its type), leaving `type` and `payload` as an
// untraced frame of the same kind would be. Untraced frames pass
// unchanged, with nullopt. An all-zero id is no trace. Errors
// (protocol_error): the traced bit on a kind other than a tell or an ask,
// or a payload shorter than the trace context.
inline Result<std::optional<TraceContext>> take_trace(std::uint32_t& type, std::string_view& payload) {
  if (!(type & kTracedKind)) [[likely]] return std::optional<TraceContext>();
  type &= ~kTracedKind;
  switch (static_cast<RemoteKind>(type)) {
    case RemoteKind::actor_tell:
    case RemoteKind::actor_ask:
    case RemoteKind::entity_tell:
    case RemoteKind::entity_ask:
      break;
    default:
      return Error(ErrorCode::protocol_error, "a trace on a frame of kind " + std::to_string(type));
  }
  if (payload.size() < kTraceBytes) return Error(ErrorCode::protocol_error, "frame ends inside its trace context");
  TraceContext c;
  std::memcpy(c.trace_id.bytes.data(), payload.data(), 16);
  std::memcpy(c.span_id.bytes.data(), payload.data() + 16, 8);
  c.flags = static_cast<std::uint8_t>(payload[24]);
  payload.remove_prefix(kTraceBytes);
  if (!c.trace_id.valid()) return std::optional<TraceContext>();
  return std::optional<TraceContext>(c);
}

// The trace context as take_trace() reads it, appended to `out`.
inline void put_trace(std::string& out, const TraceContext& c) {
  out.append(reinterpret_cast<const char*>(c.trace_id.bytes.data()), 16);
  out.append(reinterpret_cast<const char*>(c.span_id.bytes.data()), 8);
  out.push_back(static_cast<char>(c.flags));
}

// An ask's request id, as far as its frame holds one (0 if it ends
// before): where an ask whose envelope does not parse is answered.
inline std::uint64_t ask_request_id(std::string_view payload) noexcept {
  ByteReader r(payload);
  return r.u64();
}

}  // namespace troupe::cluster::detail
