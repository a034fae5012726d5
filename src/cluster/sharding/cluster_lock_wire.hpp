#pragma once
// The messages of the cluster-wide lock between nodes, and their codecs:
// a client's request to a lock shard's owner and the owner's answers, and
// a shard's new owner asking the others which keys of it they hold.
// doc/lock.md has the protocol. Internal to src/cluster/sharding/ (and its
// fuzz target): plain values, no state.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "troupe/cluster/messages.hpp"

namespace troupe::cluster::lock_wire {

struct Acquire {
  std::uint64_t req = 0;
  std::uint32_t shard = 0;
  std::string key;
};
struct Grant {
  std::uint64_t req = 0;
  std::uint32_t shard = 0;
  std::string key;
  std::uint64_t token = 0;
  std::uint64_t waited_ns = 0;  // on the owner's clock, from arrival to grant
};
struct Deny {
  std::uint64_t req = 0;
  std::string key;
  std::uint32_t code = 0;
  std::string message;
  bool retry = false;  // the shard is not (or no longer) served there
  std::string hint;    // its owner, if known
};
struct Release {
  std::uint32_t shard = 0;
  std::string key;
  std::uint64_t token = 0;
};
struct Query {  // from a shard's new owner: which keys of it do you hold?
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct HoldReport {
  std::string key;
  std::uint64_t token = 0;
};
struct QueryReply {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
  std::vector<HoldReport> holds;
};
using Wire = std::variant<Acquire, Grant, Deny, Release, Query, QueryReply>;

inline MessageCodecs<Wire> wire_codecs() {
  MessageCodecs<Wire> c;
  (void)c.add<Acquire>(
      "troupe.lock.Acquire", [](const Acquire& m, ByteWriter& w) { w.u64(m.req).u32(m.shard).str(m.key); },
      [](ByteReader& r) {
        Acquire m;
        m.req = r.u64();
        m.shard = r.u32();
        m.key = r.str();
        return r.finish(std::move(m));
      });
  (void)c.add<Grant>(
      "troupe.lock.Grant",
      [](const Grant& m, ByteWriter& w) { w.u64(m.req).u32(m.shard).str(m.key).u64(m.token).u64(m.waited_ns); },
      [](ByteReader& r) {
        Grant m;
        m.req = r.u64();
        m.shard = r.u32();
        m.key = r.str();
        m.token = r.u64();
        m.waited_ns = r.u64();
        return r.finish(std::move(m));
      });
  (void)c.add<Deny>(
      "troupe.lock.Deny",
      [](const Deny& m, ByteWriter& w) {
        w.u64(m.req).str(m.key).u32(m.code).str(m.message).boolean(m.retry).str(m.hint);
      },
      [](ByteReader& r) {
        Deny m;
        m.req = r.u64();
        m.key = r.str();
        m.code = r.u32();
        m.message = r.str();
        m.retry = r.boolean();
        m.hint = r.str();
        return r.finish(std::move(m));
      });
  (void)c.add<Release>(
      "troupe.lock.Release", [](const Release& m, ByteWriter& w) { w.u32(m.shard).str(m.key).u64(m.token); },
      [](ByteReader& r) {
        Release m;
        m.shard = r.u32();
        m.key = r.str();
        m.token = r.u64();
        return r.finish(std::move(m));
      });
  (void)c.add<Query>(
      "troupe.lock.Query", [](const Query& m, ByteWriter& w) { w.u32(m.shard).u64(m.epoch); },
      [](ByteReader& r) {
        Query m;
        m.shard = r.u32();
        m.epoch = r.u64();
        return r.finish(std::move(m));
      });
  (void)c.add<QueryReply>(
      "troupe.lock.QueryReply",
      [](const QueryReply& m, ByteWriter& w) {
        w.u32(m.shard).u64(m.epoch).u32(static_cast<std::uint32_t>(m.holds.size()));
        for (const auto& h : m.holds) w.str(h.key).u64(h.token);
      },
      [](ByteReader& r) -> Result<QueryReply> {
        QueryReply m;
        m.shard = r.u32();
        m.epoch = r.u64();
        std::uint32_t n = r.u32();
        // Each hold takes at least 12 bytes: a count larger than the bytes
        // left is malformed, not a reason to allocate.
        if (n > r.remaining() / 12) return Error(ErrorCode::corrupt_record, "a QueryReply counts more holds than it carries");
        m.holds.reserve(n);
        for (std::uint32_t i = 0; i < n && !r.failed(); ++i) {
          HoldReport h;
          h.key = r.str();
          h.token = r.u64();
          m.holds.push_back(std::move(h));
        }
        return r.finish(std::move(m));
      });
  return c;
}

}  // namespace troupe::cluster::lock_wire
