// troupe::node::detail::OneJobExecutor: see one_job_executor.hpp.

#include "one_job_executor.hpp"

#include <utility>

namespace troupe::node::detail {

bool OneJobExecutor::try_run(Job job) {
  {
    std::lock_guard lk(mu_);
    if (stopping_ || busy_) return false;
    busy_ = true;
    job_ = std::move(job);
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  }
  cv_.notify_one();
  return true;
}

void OneJobExecutor::stop() {
  std::thread worker;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    worker = std::move(worker_);
  }
  cv_.notify_one();
  if (worker.joinable()) worker.join();
}

void OneJobExecutor::work() {
  std::unique_lock lk(mu_);
  for (;;) {
    // A job offered before stop() still runs: its caller was told it would.
    cv_.wait(lk, [&] { return static_cast<bool>(job_) || stopping_; });
    if (!job_) return;
    Job job = std::move(job_);
    job_ = Job();
    lk.unlock();
    job();
    job = Job();  // its captures go before another job may come
    lk.lock();
    busy_ = false;
  }
}

}  // namespace troupe::node::detail
