// The durable job service's journal rows read back at start (J6): the
// jobs accepted without a journaled outcome, and where the proxy goes on.
// The format is doc/jobs.md's "Journal format"; job_journal.cpp writes it.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "job_internal.hpp"
#include "troupe/persist/codec.hpp"

namespace troupe::detail {

using job_rows::kAcceptedType;
using job_rows::kFinishedType;
using job_rows::kFormatVersion;
using job_rows::kTagTimedOut;

namespace {

// The next id is the highest stored one plus one: a row naming the last
// representable id would wrap that counter to 0 (ids are never 0).
constexpr JobId kLastJobId = std::numeric_limits<JobId>::max();

Error corrupt(const std::string& pid, std::uint64_t seq, const std::string& what) {
  return Error(ErrorCode::corrupt_record,
               "job journal '" + pid + "', row " + std::to_string(seq) + ": " + what + "; the service did not start");
}

}  // namespace

Result<std::vector<JobRecord>> decode_job_rows(Recovery& rec, const std::string& pid, Duration default_timeout,
                                               Duration watchdog_limit, JobJournalState& js) {
  std::map<JobId, JobRecord> open;
  JobId max_id = 0;
  std::uint64_t last_accept = 0;
  for (EventRecord& e : rec.events) {
    if (e.version != kFormatVersion) {
      return corrupt(pid, e.seq, "unsupported version " + std::to_string(e.version) + " of '" + e.type + "'");
    }
    ByteReader in(e.payload);
    const std::uint32_t n = in.u32();
    if (in.failed() || n == 0) return corrupt(pid, e.seq, "'" + e.type + "' without a job count");
    if (e.type == kAcceptedType) {
      for (std::uint32_t i = 0; i < n && !in.failed(); ++i) {
        JobRecord j;
        j.id = in.u64();
        const std::int64_t prio = in.i64();
        const std::int64_t timeout = in.i64();
        j.job.kind = in.str();
        j.job.payload = in.str();
        if (in.failed()) break;
        if (j.id == 0) return corrupt(pid, e.seq, "job id 0");
        if (j.id == kLastJobId) return corrupt(pid, e.seq, "job id " + std::to_string(j.id) + " leaves no id after it");
        if (prio < std::numeric_limits<int>::min() || prio > std::numeric_limits<int>::max())
          return corrupt(pid, e.seq, "job " + std::to_string(j.id) + " has priority " + std::to_string(prio));
        j.priority = static_cast<int>(prio);
        j.timeout = Duration(timeout);
        // A timeout this build would refuse (e.g. the watchdog limit shrank)
        // falls back to the default rather than failing the start.
        if (j.timeout <= Duration::zero() || j.timeout >= watchdog_limit)
          j.timeout = default_timeout;
        j.accept_seq = e.seq;
        const JobId id = j.id;
        max_id = std::max(max_id, id);
        if (!open.emplace(id, std::move(j)).second)
          return corrupt(pid, e.seq, "job " + std::to_string(id) + " accepted twice");
      }
      last_accept = e.seq;
    } else if (e.type == kFinishedType) {
      for (std::uint32_t i = 0; i < n && !in.failed(); ++i) {
        const JobId id = in.u64();
        const std::uint8_t tag = in.u8();
        (void)in.str();
        if (in.failed()) break;
        if (tag > kTagTimedOut) return corrupt(pid, e.seq, "unknown outcome tag " + std::to_string(tag));
        if (id == kLastJobId) return corrupt(pid, e.seq, "job id " + std::to_string(id) + " leaves no id after it");
        max_id = std::max(max_id, id);
        open.erase(id);  // unknown ids: their accepted row was compacted away
      }
    } else {
      return corrupt(pid, e.seq, "unknown event type '" + e.type + "'");
    }
    if (auto fin = in.finish(0); !fin.ok()) return corrupt(pid, e.seq, "'" + e.type + "': " + fin.error().message());
  }

  js.next_id = max_id + 1;
  js.next_seq = rec.highest_seq + 1;
  js.deleted_to = rec.events.empty() ? rec.highest_seq : rec.events.front().seq - 1;
  js.last_accept_seq = last_accept;
  std::map<std::uint64_t, std::uint64_t> per_row;
  if (last_accept > 0) per_row[last_accept] = 0;
  std::vector<JobRecord> jobs;
  jobs.reserve(open.size());
  for (auto& [id, j] : open) {
    ++per_row[j.accept_seq];
    jobs.push_back(std::move(j));
  }
  for (auto& [seq, n] : per_row) js.rows.push_back(JobRow{seq, n});
  return jobs;
}

}  // namespace troupe::detail
