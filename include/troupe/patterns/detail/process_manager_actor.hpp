#pragma once
// The process manager's actor (process_manager.hpp): the FIFO of waiting
// requests, the table of running processes (its children, each watched),
// the start throttle (P3), and what it answers when it stops (P2).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/patterns/detail/process_requests.hpp"
#include "troupe/patterns/detail/process_state.hpp"

namespace troupe::detail {

// Messages into the manager actor.
template <class A>
struct ProcessSubmit {
  std::unique_ptr<ProcessRequest<A>> request;
};
struct ProcessEnded {
  ProcessId id = 0;
  ExitReason reason = ExitReason::normal;
  std::string detail;
};
struct ProcessTick {};
template <class A>
using ProcessManagerMsg = std::variant<ProcessSubmit<A>, ProcessEnded, ProcessTick>;

inline void raise_peak(std::atomic<std::uint64_t>& peak, std::uint64_t v) noexcept {
  auto p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

// The manager: a FIFO of waiting requests, a table of running processes
// (its children, each watched), and the start throttle.
template <class A>
class ProcessManagerActor final : public Actor<ProcessManagerMsg<A>> {
 public:
  using R = typename A::result_type;
  using Msg = ProcessManagerMsg<A>;
  using ProcMsg = typename A::message_type;
  using Request = ProcessRequest<A>;
  using Outcome = typename Request::Outcome;

  explicit ProcessManagerActor(std::shared_ptr<ProcessManagerCore<A>> core)
      : core_(std::move(core)),
        max_running_(core_->settings.max_running),
        slack_(burst_slack(core_->start_interval, core_->settings.burst)) {}

  void on_start() { next_start_ = this->now(); }

  void receive(Msg& m) {
    match(
        m, [&](ProcessSubmit<A>& s) { on_submit(std::move(s.request)); },
        [&](ProcessEnded& e) { on_ended(e); }, [&](ProcessTick&) { pump(); });
  }

  // P2: whatever is still here is answered; the runtime stops the process
  // actors (our children) right after.
  void on_stop() {
    core_->closed.store(true, std::memory_order_release);
    auto& c = core_->counters;
    while (!queue_.empty()) {
      auto req = std::move(queue_.front());
      queue_.pop_front();
      core_->finish(*req,
                    Error(ErrorCode::shutting_down, "process manager '" + core_->settings.name +
                                                        "' stopped before the process started"),
                    Outcome::cancelled);
    }
    c.buffered.store(0, std::memory_order_relaxed);
    for (auto& [id, run] : running_) {
      // A process that finished just before (its end not seen yet) still
      // gets its own outcome through.
      if (auto r = run.state->close()) {
        Outcome o = r->ok() ? Outcome::completed : Outcome::failed;
        core_->finish(*run.request, std::move(*r), o);
      } else {
        core_->finish(*run.request, Error(ErrorCode::shutting_down, core_->stopped_message()),
                      Outcome::cancelled);
      }
    }
    running_.clear();
    c.running.store(0, std::memory_order_relaxed);
  }

  // For ProcessRequestWith: spawns a child process actor.
  template <class S, class... X>
  ActorRef<ProcMsg> spawn_process(const SpawnOptions& o, X&&... x) {
    return this->template spawn<S>(o, std::forward<X>(x)...);
  }

 private:
  struct Running {
    std::unique_ptr<Request> request;
    std::shared_ptr<ProcessState<R>> state;
  };

  static Duration burst_slack(Duration interval, std::size_t burst) noexcept {
    if (interval <= Duration::zero() || burst <= 1) return Duration::zero();
    // Saturate: a burst this large means "no limit on bursts" anyway.
    constexpr auto kMax = std::chrono::duration_cast<Duration>(std::chrono::hours(24 * 365 * 100)).count();
    auto n = static_cast<std::uint64_t>(burst - 1);
    auto per = static_cast<std::uint64_t>(interval.count());
    if (n > static_cast<std::uint64_t>(kMax) / per) return Duration(kMax);
    return Duration(static_cast<Duration::rep>(n * per));
  }

  void on_submit(std::unique_ptr<Request> req) {
    if (core_->closed.load(std::memory_order_acquire)) {
      core_->finish(*req, Error(ErrorCode::shutting_down, core_->stopped_message()), Outcome::cancelled);
      return;
    }
    if (queue_.empty() && running_.size() < max_running_ && take_token()) {
      start(std::move(req));
      return;
    }
    queue_.push_back(std::move(req));
    auto& c = core_->counters;
    c.buffered.store(queue_.size(), std::memory_order_relaxed);
    raise_peak(c.peak_buffered, queue_.size());
    pump();
  }

  void on_ended(ProcessEnded& e) {
    auto it = running_.find(e.id);
    if (it == running_.end()) return;
    Running run = std::move(it->second);
    running_.erase(it);
    core_->counters.running.store(running_.size(), std::memory_order_relaxed);
    std::string name = process_name(e.id);
    Result<R> r = run.state->outcome(name, e.reason, e.detail);
    Outcome o = r.ok()                                         ? Outcome::completed
                : r.error().code() == ErrorCode::shutting_down ? Outcome::cancelled
                                                               : Outcome::failed;
    core_->finish(*run.request, std::move(r), o);
    pump();
  }

  // Starts waiting requests while there are free slots and start tokens;
  // if only a token is missing, wakes up when the next one is due.
  void pump() {
    auto& c = core_->counters;
    while (!queue_.empty() && running_.size() < max_running_) {
      if (!take_token()) {
        if (!this->timer_active("throttle"))
          this->start_timer("throttle", next_start_ - slack_ - this->now(), Msg{ProcessTick{}});
        break;
      }
      auto req = std::move(queue_.front());
      queue_.pop_front();
      c.buffered.store(queue_.size(), std::memory_order_relaxed);
      start(std::move(req));
    }
  }

  // P3: a token bucket kept as its "theoretical arrival time" (GCRA):
  // integer nanoseconds, so the manual clock decides starts exactly.
  bool take_token() {
    if (core_->start_interval <= Duration::zero()) return true;
    TimePoint t = this->now();
    if (t < next_start_ - slack_) return false;
    next_start_ = std::max(next_start_, t) + core_->start_interval;
    return true;
  }

  std::string process_name(ProcessId id) const { return core_->process_prefix + std::to_string(id); }

  void start(std::unique_ptr<Request> req) {
    const ProcessId id = req->id();
    auto state = std::make_shared<ProcessState<R>>(id);
    ProcessHandle<R> handle(state);
    SpawnOptions o = core_->settings.process_options;
    o.name = process_name(id);
    ActorRef<ProcMsg> ref;
    try {
      ref = req->spawn(*this, o, handle);
    } catch (...) {
      core_->finish(
          *req,
          Error::from_exception(std::current_exception(), "process '" + o.name + "' could not be built"),
          Outcome::failed);
      return;
    }
    if (!ref) {
      core_->finish(*req,
                    Error(ErrorCode::shutting_down,
                          "process '" + o.name + "' refused: the actor system is shutting down"),
                    Outcome::cancelled);
      return;
    }
    running_.emplace(id, Running{std::move(req), state});
    auto& c = core_->counters;
    c.running.store(running_.size(), std::memory_order_relaxed);
    raise_peak(c.peak_running, running_.size());
    this->watch(ref, [id](const Down& d) { return Msg{ProcessEnded{id, d.reason, d.detail}}; });
    state->attach(ref.cell());
  }

  std::shared_ptr<ProcessManagerCore<A>> core_;
  std::size_t max_running_;
  Duration slack_;          // (burst - 1) start intervals
  TimePoint next_start_{};  // GCRA: starts are allowed from next_start_ - slack_
  std::deque<std::unique_ptr<Request>> queue_;
  std::unordered_map<ProcessId, Running> running_;
};

}  // namespace troupe::detail
