#pragma once
// What a process manager's callers and its actor share
// (process_manager.hpp): the admission count and the metrics counters, one
// accepted request with its arguments and the way it is answered, and the
// core that holds them with the settings. The manager actor itself is in
// process_manager_actor.hpp.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/patterns/detail/process_state.hpp"

namespace troupe {

// process_manager.hpp
template <class R>
struct ProcessManagerSettings;
struct ProcessStats;

namespace detail {

template <class A>
class ProcessManagerActor;

// The counters behind ProcessStats; snapshot() and the three functions
// below are in src/patterns/process_manager.cpp.
struct ProcessCounters {
  // The admission count every caller races on, on a cache line of its own;
  // then the other counters callers write; then those only the manager writes.
  alignas(64) std::atomic<std::uint64_t> outstanding{0};
  alignas(64) std::atomic<std::uint64_t> next_id{0};
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> refused{0};
  // Written by the manager actor only.
  alignas(64) std::atomic<std::uint64_t> running{0};
  std::atomic<std::uint64_t> buffered{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> peak_running{0};
  std::atomic<std::uint64_t> peak_buffered{0};

  ProcessStats snapshot() const noexcept;
};

// invalid_argument naming the manager and the offending setting, or ok.
Result<void> validate_process_manager(const std::string& name, std::size_t max_running, std::size_t buffer,
                                      double starts_per_second, std::size_t burst);
// Time between two starts at `starts_per_second` (> 0), rounded up to 1 ns.
Duration process_start_interval(double starts_per_second) noexcept;
// The buffer_overflow text: names the manager and its bounds.
std::string process_overflow_message(const std::string& name, std::size_t max_running, std::size_t buffer);

template <class A>
class ProcessManagerCore;

// One accepted request. If it is destroyed armed and unanswered (its
// message was dropped by a stopping manager), it answers shutting_down.
template <class A>
class ProcessRequest {
 public:
  using R = typename A::result_type;
  using ProcMsg = typename A::message_type;

  ProcessRequest(ProcessManagerCore<A>* core, ProcessId id, FutureAsk<R>* reply) noexcept
      : core_(core), id_(id), reply_(reply) {}
  ProcessRequest(const ProcessRequest&) = delete;
  ProcessRequest& operator=(const ProcessRequest&) = delete;
  virtual ~ProcessRequest() {
    if (armed_)
      core_->finish(*this, Error(ErrorCode::shutting_down, core_->stopped_message()), Outcome::cancelled);
    if (reply_) reply_->release();
  }

  // Spawns the process under `mgr`; may throw what A's constructor throws.
  virtual ActorRef<ProcMsg> spawn(ProcessManagerActor<A>& mgr, const SpawnOptions& o,
                                  ProcessHandle<R>& h) = 0;

  ProcessId id() const noexcept { return id_; }

  enum class Outcome : std::uint8_t { completed, failed, cancelled };

  // Answers the requester: submit() through its future, enqueue() through
  // settings.on_outcome.
  void answer(Result<R>&& r, const std::function<void(ProcessId, const Result<R>&)>& on_outcome) noexcept {
    armed_ = false;
    if (auto* f = std::exchange(reply_, nullptr)) {
      f->complete(std::move(r));
      f->release();
    } else if (on_outcome) {
      try {
        on_outcome(id_, r);
      } catch (...) {
        // the callback has nobody to report to: its exception is dropped
      }
    }
  }
  // Armed once its message is built: from then on, dropping the request
  // answers it. Disarmed again if the message could not be sent (the
  // caller then reports that itself).
  void arm() noexcept { armed_ = true; }
  void disarm() noexcept { armed_ = false; }

 private:
  ProcessManagerCore<A>* core_;
  ProcessId id_;
  FutureAsk<R>* reply_;  // one reference, or null for enqueue()
  bool armed_ = false;
};

template <class A, class... Args>
class ProcessRequestWith final : public ProcessRequest<A> {
 public:
  using R = typename A::result_type;
  using ProcMsg = typename A::message_type;

  template <class... X>
  ProcessRequestWith(ProcessManagerCore<A>* core, ProcessId id, FutureAsk<R>* reply, X&&... x)
      : ProcessRequest<A>(core, id, reply), args_(std::forward<X>(x)...) {}

  ActorRef<ProcMsg> spawn(ProcessManagerActor<A>& mgr, const SpawnOptions& o, ProcessHandle<R>& h) override {
    return std::apply(
        [&](Args&... a) { return mgr.template spawn_process<ProcessActorOf<A>>(o, h, std::move(a)...); },
        args_);
  }

 private:
  std::tuple<Args...> args_;
};

// What the handles, the manager actor and its requests share. Lives as long
// as any handle or the manager actor (which keeps it as a constructor
// argument); requests point to it without owning it, which is safe because
// a request dies in the manager actor (at the latest when its cell drains
// its mailbox) or in the caller that built it, which holds the core.
template <class A>
class ProcessManagerCore {
 public:
  using R = typename A::result_type;
  using Settings = ProcessManagerSettings<R>;
  using Outcome = typename ProcessRequest<A>::Outcome;

  explicit ProcessManagerCore(Settings s)
      : settings(std::move(s)),
        capacity(settings.max_running + settings.buffer),
        start_interval(settings.starts_per_second > 0 ? process_start_interval(settings.starts_per_second)
                                                      : Duration::zero()),
        overflow_message(process_overflow_message(settings.name, settings.max_running, settings.buffer)),
        process_prefix(
            (settings.process_options.name.empty() ? settings.name : settings.process_options.name) + "/") {}

  // P1: takes one of the max_running + buffer admissions, or refuses.
  // A compare-and-swap loop rather than add-then-undo, so the count itself
  // never passes the bound, not even for an instant.
  bool admit() noexcept {
    auto cur = counters.outstanding.load(std::memory_order_relaxed);
    do {
      if (cur >= capacity) return false;
    } while (!counters.outstanding.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed));
    return true;
  }
  void unadmit() noexcept { counters.outstanding.fetch_sub(1, std::memory_order_relaxed); }

  // Frees the request's admission, counts its outcome and answers it. The
  // admission is freed first: whoever is answered may submit again at once.
  void finish(ProcessRequest<A>& req, Result<R>&& r, Outcome o) noexcept {
    unadmit();
    auto& c = o == Outcome::completed ? counters.completed
              : o == Outcome::failed  ? counters.failed
                                      : counters.cancelled;
    c.fetch_add(1, std::memory_order_relaxed);
    req.answer(std::move(r), settings.on_outcome);
  }

  std::string stopped_message() const {
    return "process manager '" + settings.name + "' stopped before the process finished";
  }
  std::string closed_message() const {
    return "process manager '" + settings.name + "' no longer takes requests (stopped or shutting down)";
  }

  const Settings settings;
  const std::size_t capacity;
  const Duration start_interval;  // zero: no throttle
  const std::string overflow_message;
  const std::string process_prefix;
  ProcessCounters counters;
  std::atomic<bool> closed{false};
};

// A future that is already complete with `r`.
template <class T>
Future<T> ready_future(Result<T> r) {
  auto* st = new FutureAsk<T>();
  Future<T> f(st);
  st->complete(std::move(r));
  return f;
}

}  // namespace detail
}  // namespace troupe
