#include "troupe/core/detail/timer_service.hpp"

#include <cassert>

namespace troupe::detail {

TimerService::TimerService(std::shared_ptr<Clock> clock) : clock_(std::move(clock)) {
  if (clock_->is_manual()) static_cast<ManualClock&>(*clock_).add_listener(this);
}

TimerService::~TimerService() {
  stop();
  if (clock_->is_manual()) static_cast<ManualClock&>(*clock_).remove_listener(this);
}

void TimerService::start() {
  std::lock_guard lk(mu_);
  if (started_ || clock_->is_manual()) return;
  started_ = true;
  thread_ = std::thread([this] { run_thread(); });
}

void TimerService::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<Node*> rest;
  {
    std::lock_guard lk(mu_);
    rest.swap(heap_);
    for (auto* n : rest) n->heap_index_ = Node::kNotQueued;
  }
  for (auto* n : rest) n->release();
}

bool TimerService::schedule(Node* n, TimePoint deadline) {
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return false;
    if (n->heap_index_ != Node::kNotQueued) {
      remove_at(n->heap_index_);
    } else {
      n->retain();
    }
    n->deadline_ = deadline;
    n->seq_ = next_seq_++;
    auto i = static_cast<std::uint32_t>(heap_.size());
    heap_.push_back(n);
    n->heap_index_ = i;
    sift_up(i);
    // Wake the timer thread only if it sleeps past this deadline: asks arm
    // and cancel a timer each, and must not cost a syscall each.
    wake = deadline < sleeping_until_;
    if (wake) sleeping_until_ = deadline;
  }
  if (wake) cv_.notify_one();
  return true;
}

bool TimerService::cancel(Node* n) noexcept {
  {
    std::lock_guard lk(mu_);
    if (n->heap_index_ == Node::kNotQueued) return false;
    remove_at(n->heap_index_);
  }
  n->release();
  return true;
}

std::size_t TimerService::pending() const {
  std::lock_guard lk(mu_);
  return heap_.size();
}

TimePoint TimerService::next_deadline() {
  std::lock_guard lk(mu_);
  return heap_.empty() ? TimePoint::max() : heap_.front()->deadline_;
}

// Pops the earliest node if due. A periodic node is re-queued at its next
// deadline under the same lock, so that a cancel() racing this fire either
// removes the re-queued node or happens after it; the caller gets its own
// reference for the fire.
TimerService::Node* TimerService::pop_due(TimePoint until) noexcept {
  if (heap_.empty() || heap_.front()->deadline_ > until) return nullptr;
  Node* n = heap_.front();
  remove_at(0);
  if (n->interval_ > Duration::zero()) {
    n->retain();  // the fire's reference; the queue keeps the one it had
    n->deadline_ += n->interval_;
    n->seq_ = next_seq_++;
    auto i = static_cast<std::uint32_t>(heap_.size());
    heap_.push_back(n);
    n->heap_index_ = i;
    sift_up(i);
  }
  return n;
}

void TimerService::fire_due(TimePoint until) {
  for (;;) {
    Node* n;
    {
      std::lock_guard lk(mu_);
      n = pop_due(until);
    }
    if (!n) return;
    n->fire();
    n->release();
  }
}

void TimerService::run_thread() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    if (heap_.empty()) {
      sleeping_until_ = TimePoint::max();
      cv_.wait(lk);
      continue;
    }
    TimePoint now = clock_->now();
    Node* n = pop_due(now);
    if (!n) {
      // steady_clock and the clock's now() share an epoch for SystemClock
      sleeping_until_ = heap_.front()->deadline_;
      cv_.wait_until(lk, std::chrono::steady_clock::time_point(sleeping_until_.time_since_epoch()));
      sleeping_until_ = TimePoint::min();  // awake: schedule() need not notify
      continue;
    }
    lk.unlock();
    n->fire();
    n->release();
    lk.lock();
  }
}

void TimerService::sift_up(std::uint32_t i) noexcept {
  Node* n = heap_[i];
  while (i > 0) {
    std::uint32_t p = (i - 1) / 2;
    if (!before(n, heap_[p])) break;
    place(i, heap_[p]);
    i = p;
  }
  place(i, n);
}

void TimerService::sift_down(std::uint32_t i) noexcept {
  Node* n = heap_[i];
  auto size = static_cast<std::uint32_t>(heap_.size());
  for (;;) {
    std::uint32_t l = 2 * i + 1;
    if (l >= size) break;
    std::uint32_t c = (l + 1 < size && before(heap_[l + 1], heap_[l])) ? l + 1 : l;
    if (!before(heap_[c], n)) break;
    place(i, heap_[c]);
    i = c;
  }
  place(i, n);
}

void TimerService::remove_at(std::uint32_t i) noexcept {
  Node* gone = heap_[i];
  Node* last = heap_.back();
  heap_.pop_back();
  gone->heap_index_ = Node::kNotQueued;
  if (gone == last) return;
  place(i, last);
  sift_down(i);
  sift_up(last->heap_index_);
}

}  // namespace troupe::detail
