#pragma once
// The message types the wire-codec fuzz target decodes, in the order its
// first input byte picks them (src/cluster/wire_codecs_fuzz.cpp), shared
// with the program that writes its seeds (wire_fuzz_seeds_main.cpp).
// Adding a codec the cluster registers: add its name here, decode it in
// the fuzz target and give it seeds. Besides the codecs, one kind carries a
// whole remoting frame (its envelope: remote_envelope.hpp).

#include <array>
#include <cstdint>
#include <string_view>

namespace troupe::cluster::fuzz {

enum class WireKind : std::uint8_t {
  lock_acquire,
  lock_grant,
  lock_deny,
  lock_release,
  lock_query,
  lock_query_reply,
  job_request,   // RemoteJob, decoded as a request whose answer goes back
  job_answer,    // RemoteAnswer: the reply bytes of a job request
  unknown_id,    // four bytes of id, then bytes: no table knows the id
  node_load,     // a node's load report (src/node/load_wire.hpp)
  remote_envelope,  // a byte of DATA frame type, then a remoting frame's payload
  shard_header,     // two bytes of shard count, then an entity frame after its envelope
  count
};

// The registered name of each kind (empty: not a registered message).
inline constexpr std::array<std::string_view, static_cast<std::size_t>(WireKind::count)> kWireNames = {
    "troupe.lock.Acquire", "troupe.lock.Grant",   "troupe.lock.Deny", "troupe.lock.Release",
    "troupe.lock.Query",   "troupe.lock.QueryReply", "troupe.jobs.Job", "troupe.jobs.Job", "",
    "troupe.node.Load", "",                   ""};

}  // namespace troupe::cluster::fuzz
