#pragma once
// The load report a node sends every other member once a second
// (doc/wire.md, troupe.node.Load), and its codec. Internal to src/node/
// (and the wire-codec fuzz target): plain values, no state.

#include <cstdint>
#include <string>

#include "troupe/cluster/messages.hpp"

namespace troupe::node::load_wire {

// One node's load, sent to every member once a second so that any node's
// overview shows every member's load (doc/wire.md: troupe.node.Load).
struct NodeLoad {
  std::string node;
  std::string admin;
  std::uint64_t shards = 0;
  std::uint64_t entities_active = 0;
  std::uint64_t mailbox_depth = 0;
  std::uint64_t messages_per_s_milli = 0;  // messages/s x 1000
  bool draining = false;
};

inline cluster::MessageCodecs<NodeLoad> load_codecs() {
  cluster::MessageCodecs<NodeLoad> c;
  (void)c.add<NodeLoad>(
      "troupe.node.Load",
      [](const NodeLoad& m, ByteWriter& w) {
        w.str(m.node).str(m.admin).u64(m.shards).u64(m.entities_active).u64(m.mailbox_depth);
        w.u64(m.messages_per_s_milli).u64(m.draining ? 1 : 0);
      },
      [](ByteReader& r) -> Result<NodeLoad> {
        NodeLoad m;
        m.node = r.str();
        m.admin = r.str();
        m.shards = r.u64();
        m.entities_active = r.u64();
        m.mailbox_depth = r.u64();
        m.messages_per_s_milli = r.u64();
        m.draining = r.u64() != 0;
        return r.finish(std::move(m));
      });
  return c;
}

}  // namespace troupe::node::load_wire
