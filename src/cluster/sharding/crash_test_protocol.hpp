#pragma once
// What the crash tests (lock_crash.test.cpp, process_manager_crash.test.cpp)
// share with their node process, crash_test_node: the gateway's messages
// and the files through which a lock node is told its key and reports its
// hold. Every crash in these tests is a SIGKILL of that process.

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>

#include "troupe/cluster/messages.hpp"
#include "troupe/core.hpp"

namespace troupe::cluster::crash {

// --- for the tests ------------------------------------------------------------------

#ifdef TROUPE_CRASH_TEST_NODE
inline constexpr const char* kCrashTestNode = TROUPE_CRASH_TEST_NODE;
#endif
// Slack on the tests' real-time bounds: a sanitizer build runs the nodes
// several times slower; what the bounds bound stays the same.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr std::chrono::milliseconds kSlowBuildSlack{3000};
#else
inline constexpr std::chrono::milliseconds kSlowBuildSlack{0};
#endif

// --- the gateway role: an actor that holds requests --------------------------

// A charge: answered "<node> charged <amount>" at once, or never while the
// gateway holds requests (--hold).
struct Charge {
  std::int64_t amount = 0;
  ReplyTo<std::string> reply_to;
};
// How many charges the gateway holds unanswered now.
struct HeldCharges {
  ReplyTo<std::int64_t> reply_to;
};
using GatewayMsg = std::variant<Charge, HeldCharges>;

inline constexpr const char* kGateway = "gateway";

inline MessageCodecs<GatewayMsg> gateway_codecs() {
  MessageCodecs<GatewayMsg> c;
  auto str = [](const std::string& v, ByteWriter& w) { w.str(v); };
  auto str_back = [](ByteReader& r) -> Result<std::string> {
    std::string v = r.str();
    return r.finish(std::move(v));
  };
  auto i64 = [](const std::int64_t& v, ByteWriter& w) { w.i64(v); };
  auto i64_back = [](ByteReader& r) -> Result<std::int64_t> {
    std::int64_t v = r.i64();
    return r.finish(v);
  };
  (void)c.add<Charge>(
      "crash.Charge", [](const Charge& m, ByteWriter& w) { w.i64(m.amount); },
      [](ByteReader& r) -> Result<Charge> {
        Charge m;
        m.amount = r.i64();
        return r.finish(std::move(m));
      },
      str, str_back);
  (void)c.add<HeldCharges>(
      "crash.HeldCharges", [](const HeldCharges&, ByteWriter&) {},
      [](ByteReader& r) -> Result<HeldCharges> { return r.finish(HeldCharges{}); }, i64, i64_back);
  return c;
}

// --- the lock role --------------------------------------------------------------

// The cluster lock every lock node starts, and its shard count.
inline constexpr const char* kLockName = "accounts";
inline constexpr std::uint32_t kLockShards = 8;
// The Redis key prefix of the lock nodes' cluster.
inline constexpr const char* kLockClusterPrefix = "lock-crash";

// The test writes the key to take into "<marker>.key"; the node writes
// "<token> <steady_ns>" into "<marker>" (atomically, by rename) once its
// block holds the key: the fencing token and the steady clock
// (CLOCK_MONOTONIC, one clock for every process of the host) when the
// block started, so the holder's lease ends no later than steady_ns + lease.
inline std::string key_file(const std::string& marker) { return marker + ".key"; }

}  // namespace troupe::cluster::crash
