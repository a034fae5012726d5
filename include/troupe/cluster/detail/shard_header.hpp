#pragma once
// The header of an entity frame, as a shard region reads it after the
// remoting envelope (doc/wire.md, "Remoting inside DATA frames"): the
// shard, how many times the command was forwarded, the entity id and the
// command's message id, then the command's bytes. One pure function reads
// it, so region code and the fuzz target (wire_codecs_fuzz) read the same.
//
// Thread safety: a pure function over its arguments.

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/core/result.hpp"
#include "troupe/persist/codec.hpp"

namespace troupe::cluster::detail {

struct ShardHeader {
  std::uint32_t shard = 0;
  std::uint8_t hops = 0;  // forwards so far
  std::string id;         // never empty
  std::uint32_t msg_id = 0;
  std::string_view body;  // the command's bytes: the rest of the input
};

// `bytes`: u32 shard, u8 hops, str id, u32 message id, then the command.
// protocol_error naming node `from` when the header is cut short, the
// shard is not below `shard_count` or the id is empty.
inline Result<ShardHeader> parse_shard_header(std::string_view bytes, std::uint32_t shard_count,
                                              std::string_view from) {
  ByteReader r(bytes);
  ShardHeader h;
  h.shard = r.u32();
  h.hops = r.u8();
  h.id = r.str();
  h.msg_id = r.u32();
  if (r.failed() || h.shard >= shard_count || h.id.empty())
    return Error(ErrorCode::protocol_error, "entity frame from node '" + std::string(from) + "' with a bad header");
  h.body = bytes.substr(bytes.size() - r.remaining());
  return h;
}

}  // namespace troupe::cluster::detail
