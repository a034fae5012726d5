#pragma once
// Private to src/core: the scheduler and the state behind ActorSystem.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/core/actor_system.hpp"
#include "troupe/core/detail/cell.hpp"
#include "troupe/core/detail/timer_service.hpp"

namespace troupe::detail {

class SystemImpl;

// The first message of every actor: runs on_start.
struct SysStart final : SysEnvelope<SysStart> {
  void run(CellBase& c) {
    delete this;
    c.start_incarnation();
  }
  void drop(CellBase&) { delete this; }
};

// A FIFO of cells linked through CellBase::sched_next_; not synchronised.
struct CellQueue {
  CellBase* head = nullptr;
  CellBase* tail = nullptr;

  void push(CellBase* c) noexcept {
    c->sched_next_ = nullptr;
    if (tail) {
      tail->sched_next_ = c;
    } else {
      head = c;
    }
    tail = c;
  }
  CellBase* pop() noexcept {
    CellBase* c = head;
    if (!c) return nullptr;
    head = c->sched_next_;
    if (!head) tail = nullptr;
    c->sched_next_ = nullptr;
    return c;
  }
  // Appends the chain first..last (already linked, last->sched_next_ null).
  void append(CellBase* first, CellBase* last) noexcept {
    if (tail) {
      tail->sched_next_ = first;
    } else {
      head = first;
    }
    tail = last;
  }
};

// Work-stealing scheduler over cells.
//
// Each worker owns a `next` slot (the actor just made runnable by the actor it
// is running, run next for locality, as in Go's runnext) and a local FIFO run
// queue; outside threads feed a global queue. An idle worker first steals
// from other workers' queues and the global queue, then takes another
// worker's `next` slot if that slot has not changed for a few microseconds
// (its owner is stuck in a long handler), then spins briefly and parks on a
// condition variable. A push wakes a parked worker only when no worker is
// already searching, so a busy system makes no wake-up syscalls.
class Scheduler {
 public:
  Scheduler(SystemImpl& sys, std::size_t threads, std::uint32_t throughput);
  ~Scheduler();

  void start();
  void stop();  // joins the workers; idempotent

  void schedule(CellBase* c) noexcept;
  // True when every worker is parked and no queue holds work.
  bool quiescent() const noexcept;
  std::size_t size() const noexcept { return workers_.size(); }
  bool on_worker_thread() const noexcept;

  // User messages put into mailboxes and taken out by their actors, for
  // stats(). A worker counts in its own slot (no read-modify-write: only it
  // writes there); other threads share one atomic. Sums are exact once the
  // counting threads are quiet, and within a few in-flight messages always.
  void count_delivered(std::uint32_t n) noexcept;
  void count_taken(std::uint32_t n) noexcept;
  std::uint64_t delivered() const noexcept;
  std::uint64_t taken() const noexcept;
  // Actors waiting for a worker right now (run queues and `next` slots).
  std::uint64_t runnable() const noexcept;

 private:
  struct alignas(64) Worker {
    std::size_t index = 0;
    Scheduler* owner = nullptr;
    std::thread thread;
    std::atomic<CellBase*> next{nullptr};
    std::atomic<std::uint64_t> next_seq{0};
    alignas(64) std::mutex mu;
    CellQueue queue;  // under mu
    std::atomic<std::size_t> q_size{0};
    // Written by the owner only, read by stats().
    alignas(64) std::atomic<std::uint64_t> delivered{0};
    std::atomic<std::uint64_t> taken{0};
    // owner-only
    std::uint32_t lifo_streak = 0;
    std::uint64_t tick = 0;
  };

  void run_worker(Worker& w);
  CellBase* find_local(Worker& w) noexcept;
  CellBase* search(Worker& w) noexcept;
  void park(Worker& w);
  void run(Worker& w, CellBase* c) noexcept;
  void push_local(Worker& w, CellBase* c) noexcept;
  CellBase* pop_local(Worker& w) noexcept;
  CellBase* steal_from(Worker& victim, Worker& thief) noexcept;
  void push_global(CellBase* c) noexcept;
  CellBase* pop_global() noexcept;
  bool has_work() const noexcept;
  void notify_if_needed() noexcept;

  SystemImpl& sys_;
  std::uint32_t throughput_;
  std::vector<std::unique_ptr<Worker>> workers_;

  alignas(64) std::mutex global_mu_;
  CellQueue global_;  // under global_mu_
  std::atomic<std::size_t> g_size_{0};
  alignas(64) std::atomic<std::uint64_t> external_delivered_{0};
  std::atomic<std::uint64_t> external_taken_{0};

  alignas(64) std::atomic<int> searching_{0};
  std::atomic<int> sleepers_{0};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  int wake_tokens_ = 0;
  bool stopping_ = false;
  std::atomic<bool> stop_flag_{false};
  bool started_ = false;
};

// The root of the supervision tree: a cell that never runs. Its children are
// the top-level actors.
class RootCell final : public CellBase {
 public:
  explicit RootCell(SystemImpl* sys) : CellBase(sys, nullptr, 0) {}

 protected:
  void invoke_user(Envelope* e) override { destroy_user(e); }
  void destroy_user(Envelope*) noexcept override {}
  const char* message_type_name() const noexcept override { return "none"; }
  void on_start_hook() override {}
  void on_stop_hook() noexcept override {}
  bool recreate() noexcept override { return false; }
  const char* type_name() const noexcept override { return "root"; }
};

class SystemImpl {
 public:
  explicit SystemImpl(SystemConfig cfg);
  ~SystemImpl();

  void start();
  void shutdown();

  // The impl lives while the ActorSystem or any cell does: a ref that
  // outlives the system still finds counters and a closed mailbox.
  void cell_created() noexcept;
  void cell_freed() noexcept;
  bool wait_idle(Duration timeout);

  // Called by the scheduler after a cell's final activation.
  void on_terminated(CellBase* c) noexcept;
  void on_dead_letter(const CellBase& recipient, const char* mangled_type) noexcept;
  void log_failure(const CellBase& c, const std::string& what) noexcept;

  SystemConfig config;
  std::shared_ptr<Clock> clock;
  TimerService timers;
  Scheduler scheduler;
  CellBase* root = nullptr;  // one reference, released in the destructor

  std::atomic<bool> closing{false};
  std::mutex hooks_mu;
  std::vector<std::pair<std::uint64_t, std::function<void()>>> shutdown_hooks;
  std::uint64_t next_hook_id = 0;
  bool hooks_ran = false;
  std::atomic<bool> owner_alive{true};
  bool root_closed = false;  // under root's children_mu
  std::atomic<std::int64_t> external_inflight{0};

  std::atomic<std::uint64_t> spawned{0};
  std::atomic<std::uint64_t> live{0};
  std::atomic<std::uint64_t> dead_letters{0};
  std::atomic<std::uint64_t> mailbox_overflows{0};
  std::atomic<std::uint64_t> failures{0};
  std::atomic<std::uint64_t> restarts{0};
  std::atomic<std::uint64_t> stale_timers{0};

  std::mutex live_mu;
  std::condition_variable live_cv;

 private:
  std::atomic<std::int64_t> cells_{1};  // the owner's share + one per cell
  std::once_flag shutdown_once_;
};

}  // namespace troupe::detail
