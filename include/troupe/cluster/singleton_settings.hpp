#pragma once
// The settings, start argument and counters of a cluster singleton
// (troupe/cluster/singleton.hpp). Plain values.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/core/clock.hpp"

namespace troupe::cluster {

struct SingletonSettings {
  // 1 to 64 of [A-Za-z0-9._-]; the same on every node.
  std::string name;
  // The members that may host it: those holding one of these roles
  // (ClusterSettings::roles); empty: any member. The same on every node.
  std::vector<std::string> roles{};
  // Messages a proxy holds while the instance moves (and that wait in its
  // mailbox): at least 1. Past it, tell() answers buffer_overflow.
  std::size_t buffer = 10'000;
  // How often a proxy that does not know where the instance runs asks the
  // live members, and checks that the instance's node is still one.
  Duration resolve_interval = std::chrono::milliseconds(100);
};

// The first argument of a singleton actor's constructor.
struct SingletonStart {
  std::string name;
  std::string node;         // the node it runs on
  std::uint64_t epoch = 0;  // its placement epoch: a fencing token that grows with every move
};

// A proxy's counters (since it started).
struct SingletonStats {
  std::size_t waiting = 0;      // told and not yet sent on (in the buffer or the proxy's mailbox)
  std::uint64_t delivered = 0;  // sent on to the instance (here, or to its node)
  std::uint64_t refused = 0;    // refused with buffer_overflow
  std::uint64_t lost = 0;       // handed to a local instance that had stopped, or held when the proxy stopped
  std::uint64_t moves = 0;      // times the proxy learned of a new instance
  std::string owner;            // where it runs as far as the proxy knows; empty: moving or unknown
  std::uint64_t epoch = 0;      // that instance's epoch
};

}  // namespace troupe::cluster
