#pragma once
// OneJobExecutor: runs one job at a time on a thread of its own, and
// refuses a job offered while one runs, so that an admin request that waits
// on something slow (POST /rebalance waits on Redis) takes no thread from
// the server and a client cannot make the node start more threads.
//
// Ownership: owns its worker thread, started with the first job and joined
// by stop() (or the destructor). Thread safety: every member may be called
// from any thread, except that stop() and the destructor must not run on
// the worker itself (from inside a job).

#include <condition_variable>
#include <mutex>
#include <thread>

#include "troupe/core/actor.hpp"

namespace troupe::node::detail {

class OneJobExecutor {
 public:
  using Job = troupe::detail::UniqueFunction<void()>;  // move-only: a job may own a Responder

  OneJobExecutor() = default;
  ~OneJobExecutor() { stop(); }
  OneJobExecutor(const OneJobExecutor&) = delete;
  OneJobExecutor& operator=(const OneJobExecutor&) = delete;

  // Runs `job` on the worker. False, with `job` dropped unrun, while
  // another job runs or after stop().
  bool try_run(Job job);
  // Lets the running job finish, then joins the worker. Refuses every job
  // after it. Idempotent.
  void stop();

 private:
  void work();

  std::mutex mu_;
  std::condition_variable cv_;
  Job job_;            // offered, not yet taken by the worker
  bool busy_ = false;  // a job is offered or running
  bool stopping_ = false;
  std::thread worker_;  // started by the first job
};

}  // namespace troupe::node::detail
