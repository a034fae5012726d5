#pragma once
// One process's state and its shell (process_manager.hpp). ProcessState is
// what a process's handles, its shell and the manager share: the result
// (first completion wins) and the actor to stop once it is settled.
// ProcessShell is the subclass of the user's process type that runs, so
// that the exception escaping its handlers reaches the caller whole.

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "troupe/core/actor.hpp"
#include "troupe/core/result.hpp"

namespace troupe {

// process_manager.hpp
using ProcessId = std::uint64_t;
template <class R>
class ProcessHandle;

namespace detail {

// What a requester whose process ended without completing is told
// (src/patterns/process_manager.cpp).
Error process_ended_error(const std::string& process, ExitReason reason, const std::string& detail,
                          const std::exception_ptr& thrown);

// Shared by a process's handles, its shell and the manager. The result is
// written once (first completion wins); the manager reads it when the
// process actor has terminated.
template <class R>
class ProcessState {
 public:
  explicit ProcessState(ProcessId id) noexcept : id_(id) {}

  ProcessId id() const noexcept { return id_; }
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

  // First completion wins. Stops the process actor if the manager has
  // attached it already (else attach() does).
  bool settle(Result<R>&& r) {
    CellRef to_stop;
    {
      std::lock_guard lk(mu_);
      if (done_.load(std::memory_order_relaxed)) return false;
      result_.emplace(std::move(r));
      done_.store(true, std::memory_order_release);
      to_stop = std::move(cell_);
    }
    if (to_stop) to_stop->request_stop();
    return true;
  }

  // The manager links the spawned actor. Holding the cell here forms a
  // cycle (the actor holds a handle to this state), which settle(),
  // outcome() and close() break; the manager always reaches one of them.
  void attach(CellRef cell) {
    {
      std::lock_guard lk(mu_);
      if (!done_.load(std::memory_order_relaxed)) {
        cell_ = std::move(cell);
        return;
      }
    }
    cell->request_stop();
  }
  // The manager stops before the actor ended: its result if it has one;
  // otherwise later completions are ignored from here on.
  std::optional<Result<R>> close() {
    CellRef drop;  // released after the lock
    std::lock_guard lk(mu_);
    drop = std::move(cell_);
    if (result_) return std::move(*result_);
    done_.store(true, std::memory_order_release);
    return std::nullopt;
  }

  // Kept so that a caller can rethrow what the process threw.
  void note_exception(std::exception_ptr e) noexcept {
    std::lock_guard lk(mu_);
    thrown_ = std::move(e);
  }

  // After the actor terminated: its result, or why it has none. Later
  // completions are ignored from here on.
  Result<R> outcome(const std::string& process, ExitReason reason, const std::string& why) {
    CellRef drop;  // released after the lock
    std::lock_guard lk(mu_);
    drop = std::move(cell_);
    if (result_) return std::move(*result_);
    done_.store(true, std::memory_order_release);
    return process_ended_error(process, reason, why, thrown_);
  }

 private:
  const ProcessId id_;
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::optional<Result<R>> result_;
  std::exception_ptr thrown_;
  CellRef cell_;
};

template <class R>
std::shared_ptr<ProcessState<R>> state_of(const ProcessHandle<R>& h) noexcept {
  return h.st_;
}

// Process actors are spawned as this subclass of A (unless A is final):
// it keeps the exception that escapes receive() or on_start(), so that a
// caller can rethrow the original object. The rest of A is untouched.
template <class A>
class ProcessShell final : public A {
 public:
  using R = typename A::result_type;
  using Msg = typename A::message_type;

  template <class... X>
  explicit ProcessShell(ProcessHandle<R>& h, X&... x) : A(h, x...), troupe_process_state_(state_of(h)) {}

  void on_start() {
    try {
      A::on_start();
    } catch (...) {
      troupe_process_state_->note_exception(std::current_exception());
      throw;
    }
  }
  void receive(Msg& m) {
    try {
      A::receive(m);
    } catch (...) {
      troupe_process_state_->note_exception(std::current_exception());
      throw;
    }
  }

 private:
  std::shared_ptr<ProcessState<R>> troupe_process_state_;
};

template <class A>
using ProcessActorOf = std::conditional_t<std::is_final_v<A>, A, ProcessShell<A>>;

}  // namespace detail
}  // namespace troupe
