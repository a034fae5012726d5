#pragma once
// Helpers shared by the job service tests: the names they use, a real-time
// bound for answers that worker threads produce (it never decides an
// outcome), and outcomes as short strings for EXPECT_EQ.

#include <chrono>
#include <string>

#include "troupe/core.hpp"
#include "troupe/patterns/job_service.hpp"

namespace troupe::job_test {

using namespace std::chrono_literals;
using troupe::ErrorCode;
using troupe::Future;
using troupe::Job;
using troupe::JobFailed;
using troupe::JobId;
using troupe::JobOutcome;
using troupe::JobRun;
using troupe::JobService;
using troupe::JobSettings;
using troupe::JobSucceeded;
using troupe::JobTimedOut;
using troupe::JobWorkerCall;
using troupe::JobWorkers;
using troupe::Result;

inline constexpr troupe::Duration kBound = 10s;

// "succeeded: x", "failed: why", "timed out".
inline std::string describe(const JobOutcome& o) {
  return troupe::match(
      o, [](const JobSucceeded& s) { return "succeeded: " + s.output; },
      [](const JobFailed& f) { return "failed: " + f.reason; },
      [](const JobTimedOut&) { return std::string("timed out"); });
}

// As above, or "error <code>: message".
inline std::string describe(const Result<JobOutcome>& r) {
  if (!r.ok()) return "error " + std::string(troupe::to_string(r.error().code())) + ": " + r.error().message();
  return describe(r.value());
}

// The answer, or a timeout error if none came within kBound.
template <class T>
Result<T> await(Future<T>& f) {
  if (!f.wait_for(kBound)) return troupe::Error(ErrorCode::timeout, "test: no answer within the real-time bound");
  return f.get();
}

inline std::string outcome(Future<JobOutcome>& f) { return describe(await(f)); }

}  // namespace troupe::job_test
