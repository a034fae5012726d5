// Rows the journal-row fuzz target (src/persist/journal_rows_fuzz.cpp,
// scripts/fuzz) found the durable job service mishandling, kept as tests
// so that each stays fixed. They go through the service's row decoding
// (decode_job_rows), as its recovery does at start.

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "job_internal.hpp"
#include "troupe/persist/codec.hpp"

namespace {

using troupe::ByteWriter;
using troupe::ErrorCode;
using troupe::EventRecord;
using troupe::JobId;

EventRecord row(std::uint64_t seq, std::string type, std::string payload) {
  EventRecord e;
  e.seq = seq;
  e.type = std::move(type);
  e.version = 1;
  e.payload = std::move(payload);
  return e;
}

std::string accepted(JobId id) {
  ByteWriter w;
  w.u32(1).u64(id).i64(0).i64(0).str("kind").str("payload");
  return w.take();
}

std::string finished(JobId id) {
  ByteWriter w;
  w.u32(1).u64(id).u8(0).str("done");
  return w.take();
}

// An id of 2^64 - 1 in a row left the id counter at max + 1, which wraps to
// 0: the next job accepted got id 0 (or the id of a job still open), and
// the restart after that refused the journal as corrupt.
// proves: X1
TEST(JobsFuzzRegressions, AJobIdThatLeavesNoIdAfterItIsACorruptRowNotAWrappedCounter) {
  using namespace std::chrono_literals;
  constexpr JobId kLast = std::numeric_limits<JobId>::max();
  for (bool in_finished : {true, false}) {
    troupe::Recovery rec;
    rec.events.push_back(row(1, "job.accepted", accepted(1)));
    rec.events.push_back(in_finished ? row(2, "job.finished", finished(kLast)) : row(2, "job.accepted", accepted(kLast)));
    rec.highest_seq = 2;
    troupe::detail::JobJournalState state;
    auto jobs = troupe::detail::decode_job_rows(rec, "jobs", 30s, 300s, state);
    ASSERT_FALSE(jobs.ok()) << "recovered with the next id " << state.next_id;
    EXPECT_EQ(jobs.error().code(), ErrorCode::corrupt_record);
    EXPECT_NE(jobs.error().message().find("row 2"), std::string::npos) << jobs.error().message();
  }
  // The largest id that leaves one after it is still read.
  troupe::Recovery rec;
  rec.events.push_back(row(1, "job.accepted", accepted(kLast - 1)));
  rec.highest_seq = 1;
  troupe::detail::JobJournalState state;
  auto jobs = troupe::detail::decode_job_rows(rec, "jobs", 30s, 300s, state);
  ASSERT_TRUE(jobs.ok()) << jobs.error().message();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(state.next_id, kLast);
}

}  // namespace
