#pragma once
// The runtime's one timer queue: an indexed binary min-heap of intrusive,
// reference-counted nodes, ordered by (deadline, start order).
//
// With a SystemClock a dedicated thread sleeps until the earliest deadline.
// With a ManualClock there is no thread: ManualClock::advance() calls
// fire_due(), which fires due nodes one by one on the advancing thread.
//
// Cancellation removes the node from the heap (O(log n)), so a cancelled timer
// costs no memory until its deadline. Whether a fire that already left the
// heap still counts is NOT decided here: actor timers carry a generation
// that the actor checks when the fire reaches it (see actor_timers.hpp),
// which is what makes a stale fire impossible to observe.
//
// Thread-safety: all members are thread-safe. fire() runs without the lock
// held, so it may schedule or cancel timers.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "troupe/core/clock.hpp"

namespace troupe::detail {

class TimerService final : public ManualClock::Listener {
 public:
  // Base of anything that can sit in the timer queue.
  class Node {
   public:
    Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
    void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
    void release() noexcept {
      if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }
    TimePoint deadline() const noexcept { return deadline_; }
    // Non-zero makes the node periodic: the service re-queues it at
    // deadline + interval, under its lock, before each fire. Set before the
    // first schedule().
    void set_interval(Duration d) noexcept { interval_ = d; }

   protected:
    virtual ~Node() = default;
    // Called once per scheduling, without the service lock, after the node
    // left the heap. The heap's reference is released after it returns.
    virtual void fire() noexcept = 0;

   private:
    friend class TimerService;
    std::atomic<std::uint32_t> refs_{1};
    std::uint32_t heap_index_ = kNotQueued;
    TimePoint deadline_{};
    Duration interval_{};
    std::uint64_t seq_ = 0;
    static constexpr std::uint32_t kNotQueued = 0xffffffffu;
  };

  explicit TimerService(std::shared_ptr<Clock> clock);
  ~TimerService() override;

  void start();  // starts the timer thread (system clock only)
  void stop();   // stops the thread and releases every queued node; idempotent

  // Queues `n` to fire at `deadline` (takes its own reference). A node that is
  // already queued is moved to the new deadline. False once stopped: the
  // node will never fire.
  bool schedule(Node* n, TimePoint deadline);
  // Removes `n` if still queued, releasing the queue's reference. True if it
  // was removed: it will not fire again (a fire already under way may still
  // complete).
  bool cancel(Node* n) noexcept;

  Clock& clock() const noexcept { return *clock_; }
  std::size_t pending() const;

  // ManualClock::Listener
  TimePoint next_deadline() override;
  void fire_due(TimePoint until) override;

 private:
  void run_thread();
  bool before(const Node* a, const Node* b) const noexcept {
    return a->deadline_ < b->deadline_ || (a->deadline_ == b->deadline_ && a->seq_ < b->seq_);
  }
  void sift_up(std::uint32_t i) noexcept;
  void sift_down(std::uint32_t i) noexcept;
  void remove_at(std::uint32_t i) noexcept;
  void place(std::uint32_t i, Node* n) noexcept {
    heap_[i] = n;
    n->heap_index_ = i;
  }
  Node* pop_due(TimePoint until) noexcept;

  std::shared_ptr<Clock> clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Node*> heap_;
  std::uint64_t next_seq_ = 0;
  // What the timer thread sleeps until (max = no deadline, min = awake).
  TimePoint sleeping_until_ = TimePoint::min();
  bool stopping_ = false;
  bool started_ = false;
  std::thread thread_;
};

}  // namespace troupe::detail
