#pragma once
// Keeper: one thread that runs blocking steps in the order they were
// posted, some after a delay, and a periodic sweep. Internal to
// src/cluster/sharding/.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "troupe/core/clock.hpp"

namespace troupe::cluster::detail {

// One thread that runs the blocking steps (a shard's start reads its log;
// its stop waits for its actors), in the order placement asked for them,
// and a sweep every `every`. Its state is shared with the thread, so the
// last owner may let go of it on that thread.
class Keeper {
 public:
  using Clock = std::chrono::steady_clock;
  ~Keeper() { stop(); }
  void post(std::function<void()> fn, Duration delay = Duration::zero()) {
    {
      std::lock_guard lk(st_->mu);
      if (st_->quit) return;
      st_->tasks.emplace(Clock::now() + std::chrono::duration_cast<Clock::duration>(delay), std::move(fn));
    }
    st_->cv.notify_one();
  }
  void start(std::function<void()> sweep, Duration every) {
    thread_ = std::thread([st = st_, sweep = std::move(sweep), every] { run(*st, sweep, every); });
  }
  // Drops what is not yet due and joins (detaches, on the thread itself).
  void stop() {
    {
      std::lock_guard lk(st_->mu);
      st_->quit = true;
      st_->tasks.clear();
    }
    st_->cv.notify_one();
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::multimap<Clock::time_point, std::function<void()>> tasks;
    bool quit = false;
  };
  static void run(State& st, const std::function<void()>& sweep, Duration every) {
    const auto period = std::chrono::duration_cast<Clock::duration>(every);
    auto next_sweep = Clock::now() + period;
    std::unique_lock lk(st.mu);
    while (!st.quit) {
      auto due = st.tasks.empty() ? next_sweep : std::min(next_sweep, st.tasks.begin()->first);
      if (Clock::now() < due) {
        st.cv.wait_until(lk, due);
        continue;
      }
      std::function<void()> fn;
      if (!st.tasks.empty() && st.tasks.begin()->first <= Clock::now()) {
        fn = std::move(st.tasks.begin()->second);
        st.tasks.erase(st.tasks.begin());
      } else {
        next_sweep = Clock::now() + period;
        fn = sweep;
      }
      lk.unlock();
      fn();
      fn = nullptr;  // what it holds goes now, not under the lock
      lk.lock();
    }
  }

  std::shared_ptr<State> st_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace troupe::cluster::detail
