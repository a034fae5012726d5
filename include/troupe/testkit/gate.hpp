#pragma once
// A one-shot gate for tests that must hold an actor inside a handler.
//
// Deterministic concurrency tests often need "the actor is busy right now":
// a handler signals that it has started (`entered.open()`) and then blocks on
// a second gate (`release.wait()`) until the test lets it go. While it is
// blocked, the test can fill its mailbox, advance a manual clock, and so on,
// knowing exactly what is queued behind the running message.
//
// Ownership: a plain value; share it by reference or shared_ptr with the
// actor. Thread safety: all members are thread-safe.
//
// wait() is bounded so that a broken test fails instead of hanging the suite;
// the bound is real time and generous, it never decides an outcome.

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "troupe/core/clock.hpp"

namespace troupe::testkit {

class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Opens the gate; every current and future wait() returns true at once.
  // Notifies under the lock: a waiter may destroy the gate as soon as it
  // returns, so open() must not touch it after releasing the lock.
  void open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }

  // Blocks until the gate is open; false if `timeout` passed first.
  [[nodiscard]] bool wait(Duration timeout = std::chrono::seconds(10)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return open_; });
  }

  bool is_open() const {
    std::lock_guard lk(mu_);
    return open_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace troupe::testkit
