// The durable job service (SPEC J6) killed with SIGKILL: a job_crash_node
// process runs the service on a SQLite journal and logs every acceptance,
// run start, end of work and stored outcome to a side file. It is killed
// at an unlucky moment and started again on the same journal; then no
// accepted job may be lost, and no job whose outcome was stored may run
// again (jobs without a stored outcome run again: at least once).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../cluster/sharding/node_process.hpp"

#ifndef TROUPE_JOB_CRASH_NODE
#error "TROUPE_JOB_CRASH_NODE (the job_crash_node binary) must be defined"
#endif

namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;
using troupe::cluster::proc::NodeProcess;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr std::chrono::milliseconds kSlowBuildSlack{3000};
#else
constexpr std::chrono::milliseconds kSlowBuildSlack{0};
#endif

constexpr int kJobs = 6;

// One line of the side file, in the order the processes wrote them.
struct Line {
  std::string what;  // accepted, start, done, outcome, recovered
  std::uint64_t id = 0;
  std::string pid;
  std::string rest;
};

class JobCrash : public ::testing::Test {
 protected:
  std::filesystem::path dir;
  std::unique_ptr<NodeProcess> node;

  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-job-crash-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir = pattern;
  }
  void TearDown() override {
    node.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  void start(int enqueue) {
    node = std::make_unique<NodeProcess>(
        TROUPE_JOB_CRASH_NODE, "jobs",
        std::vector<std::string>{"--journal", (dir / "jobs.db").string(), "--side", side_path(), "--enqueue",
                                 std::to_string(enqueue), "--work-ms", "300", "--after-done-ms", "300"});
  }
  std::string side_path() const { return (dir / "side.log").string(); }

  std::vector<Line> lines() const {
    std::vector<Line> out;
    std::ifstream in(side_path());
    std::string text;
    while (std::getline(in, text)) {
      std::istringstream ss(text);
      Line l;
      ss >> l.what;
      if (l.what == "recovered") {
        ss >> l.rest >> l.pid;
      } else {
        ss >> l.id >> l.pid;
        std::getline(ss, l.rest);
      }
      out.push_back(l);
    }
    return out;
  }
  std::size_t count(const std::string& what) const {
    std::size_t n = 0;
    for (auto& l : lines()) n += l.what == what ? 1 : 0;
    return n;
  }
  // The id of the n-th `what` line (1-based), once there is one.
  std::uint64_t await_nth(const std::string& what, std::size_t n) {
    auto until = Steady::now() + 20s + kSlowBuildSlack;
    while (Steady::now() < until) {
      std::size_t seen = 0;
      for (auto& l : lines())
        if (l.what == what && ++seen == n) return l.id;
      std::this_thread::sleep_for(1ms);
    }
    ADD_FAILURE() << "no " << n << "th '" << what << "' line";
    return 0;
  }
  // Until every accepted job has an outcome.
  void await_all_outcomes() {
    auto until = Steady::now() + 30s + kSlowBuildSlack;
    while (Steady::now() < until) {
      std::set<std::uint64_t> accepted, decided;
      for (auto& l : lines()) {
        if (l.what == "accepted") accepted.insert(l.id);
        if (l.what == "outcome") decided.insert(l.id);
      }
      if (!accepted.empty() && std::includes(decided.begin(), decided.end(), accepted.begin(), accepted.end())) return;
      std::this_thread::sleep_for(10ms);
    }
  }

  // Starts the service with kJobs jobs and kills it `after` the n-th
  // `what` line; that line's job.
  std::uint64_t kill_at(const std::string& what, std::size_t n, Steady::duration after) {
    start(kJobs);
    std::uint64_t id = await_nth(what, n);
    std::this_thread::sleep_for(after);
    node->kill9();
    EXPECT_EQ(count("accepted"), static_cast<std::size_t>(kJobs)) << "killed before every job was accepted";
    EXPECT_EQ(count("outcome"), n - 1) << "outcomes stored before the kill";
    return id;
  }

  // Starts the service again on the same journal, lets it finish every job
  // it recovers and checks the history.
  void restart_and_check(std::uint64_t again) {
    const std::size_t stored_before = count("outcome");
    start(0);
    await_all_outcomes();
    node->kill9();
    std::vector<std::string> recovered;
    for (auto& l : lines())
      if (l.what == "recovered") recovered.push_back(l.rest);
    ASSERT_EQ(recovered.size(), 2u);
    EXPECT_EQ(recovered[1], std::to_string(kJobs - stored_before)) << "jobs re-queued from the journal";
    check(again);
  }

  // J6 on the whole history: every accepted job has exactly one stored
  // outcome; no run of a job starts after its outcome was stored; and
  // `again`, whose outcome was never stored before the kill, ran again.
  void check(std::uint64_t again) {
    auto all = lines();
    std::set<std::uint64_t> accepted;
    std::map<std::uint64_t, std::size_t> outcomes, starts, stored_at;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Line& l = all[i];
      if (l.what == "accepted") accepted.insert(l.id);
      if (l.what == "start") {
        ++starts[l.id];
        EXPECT_FALSE(stored_at.count(l.id)) << "job " << l.id << " ran again after its outcome was stored";
      }
      if (l.what == "outcome") {
        ++outcomes[l.id];
        stored_at.emplace(l.id, i);
        EXPECT_NE(l.rest.find("succeeded ran job-"), std::string::npos) << l.rest;
      }
    }
    EXPECT_EQ(accepted.size(), static_cast<std::size_t>(kJobs));
    for (auto id : accepted) EXPECT_EQ(outcomes[id], 1u) << "job " << id << ": accepted, and its outcomes: " << outcomes[id];
    EXPECT_GE(starts[again], 2u) << "job " << again << " had no stored outcome at the kill and did not run again";
  }
};

// Killed while a job's work runs: that job and the queued ones run after
// the restart; the ones already finished do not.
// proves: J6
TEST_F(JobCrash, AServiceKilledWhileAJobRunsLosesNoAcceptedJobAndRunsNoFinishedJobAgain) {
  // 100 ms into its 300 ms of work, when the previous job's outcome, decided
  // before this job started, has surely been stored and reported.
  std::uint64_t running = kill_at("start", 3, 100ms);
  ASSERT_NE(running, 0u);
  for (auto& l : lines())
    ASSERT_FALSE(l.what == "done" && l.id == running) << "the kill came after job " << running << "'s work";
  restart_and_check(running);
}

// Killed after a job's work is over but before the worker gave its outcome
// to the service, so before it was stored: that job runs again (at least
// once); those whose outcome was stored do not.
// proves: J6
TEST_F(JobCrash, AServiceKilledAfterAJobsWorkButBeforeItsOutcomeIsStoredRunsThatJobAgainAndNoStoredJob) {
  std::uint64_t finished = kill_at("done", 3, 0ms);  // 300 ms before its outcome is given
  ASSERT_NE(finished, 0u);
  for (auto& l : lines())
    ASSERT_FALSE(l.what == "outcome" && l.id == finished) << "the kill came after job " << finished << "'s outcome was stored";
  restart_and_check(finished);
}

}  // namespace
