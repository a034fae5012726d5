#pragma once
// The messages of a cluster-wide job service between nodes: a job sent to
// the node that serves its queue shard, and the answer. doc/wire.md
// ("Jobs") has the layout. Internal to src/cluster/sharding/.

#include <cstdint>
#include <string>

#include "troupe/cluster/messages.hpp"
#include "troupe/patterns/job_service.hpp"

namespace troupe::cluster::detail {

// The answer to a job sent to another node's shard.
struct RemoteAnswer {
  enum Kind : std::uint8_t { accepted = 0, finished = 1, moved = 2, failed = 3 };
  std::uint8_t kind = failed;
  JobId id = 0;         // accepted
  JobOutcome outcome;   // finished
  std::uint32_t code = 0;  // failed: the ErrorCode
  std::string message;     // failed
};

struct RemoteJob {
  std::uint32_t shard = 0;
  bool want_outcome = false;  // submit(): answer with the outcome, not on acceptance
  Job job;
  std::int64_t priority = 0;
  std::int64_t timeout_ns = 0;  // 0: the service's default
  ReplyTo<RemoteAnswer> reply_to;
};

// An outcome on the wire: its alternative's index, then its text (empty
// for JobTimedOut), so the decoder reads one layout.
inline void encode_outcome(const JobOutcome& o, ByteWriter& w) {
  w.u8(static_cast<std::uint8_t>(o.index()));
  match(
      o, [&](const JobSucceeded& s) { w.str(s.output); }, [&](const JobFailed& f) { w.str(f.reason); },
      [&](const JobTimedOut&) { w.str(""); });
}

inline MessageCodecs<RemoteJob> job_wire_codecs() {
  MessageCodecs<RemoteJob> c;
  (void)c.add<RemoteJob>(
      "troupe.jobs.Job",
      [](const RemoteJob& m, ByteWriter& w) {
        w.u32(m.shard).boolean(m.want_outcome).str(m.job.kind).str(m.job.payload).i64(m.priority).i64(m.timeout_ns);
      },
      [](ByteReader& r) {
        RemoteJob m;
        m.shard = r.u32();
        m.want_outcome = r.boolean();
        m.job.kind = r.str();
        m.job.payload = r.str();
        m.priority = r.i64();
        m.timeout_ns = r.i64();
        return r.finish(std::move(m));
      },
      [](const RemoteAnswer& a, ByteWriter& w) {
        w.u8(a.kind).u64(a.id);
        encode_outcome(a.outcome, w);
        w.u32(a.code).str(a.message);
      },
      [](ByteReader& r) -> Result<RemoteAnswer> {
        RemoteAnswer a;
        a.kind = r.u8();
        a.id = r.u64();
        std::uint8_t tag = r.u8();
        std::string text = r.str();
        if (tag == 0) a.outcome = JobSucceeded{std::move(text)};
        else if (tag == 1) a.outcome = JobFailed{std::move(text)};
        else if (tag == 2) a.outcome = JobTimedOut{};
        else return Error(ErrorCode::corrupt_record, "a job answer with outcome tag " + std::to_string(tag));
        a.code = r.u32();
        a.message = r.str();
        if (a.kind > RemoteAnswer::failed)
          return Error(ErrorCode::corrupt_record, "a job answer of kind " + std::to_string(a.kind));
        return r.finish(std::move(a));
      });
  return c;
}

}  // namespace troupe::cluster::detail
