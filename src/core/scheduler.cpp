#include <chrono>
#include <thread>

#include "system_impl.hpp"

namespace troupe::detail {

namespace {

thread_local void* t_worker = nullptr;  // Scheduler::Worker* of the running worker

// How long an idle worker keeps looking for work before it parks. Long
// enough that a steady flow of messages never pays a wake-up syscall, short
// enough that an idle system sleeps at once to a person's eye. Between its
// looks the worker yields its core (see search), so the spin costs nothing
// to other threads ready to run there.
constexpr auto kSpinFor = std::chrono::microseconds(200);
// A `next` slot unchanged for this long belongs to a worker stuck in a long
// handler: another worker may take it.
constexpr auto kNextStaleAfter = std::chrono::microseconds(4);
// Every so many activations, look at the global queue first (fairness).
constexpr std::uint64_t kGlobalCheckEvery = 61;
// Runs from the `next` slot in a row before the local queue gets a turn.
constexpr std::uint32_t kMaxLifoStreak = 16;

}  // namespace

Scheduler::Scheduler(SystemImpl& sys, std::size_t threads, std::uint32_t throughput)
    : sys_(sys), throughput_(throughput == 0 ? 1 : throughput) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t i = 0; i < threads; ++i) {
    auto w = std::make_unique<Worker>();
    w->index = i;
    w->owner = this;
    workers_.push_back(std::move(w));
  }
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  if (started_) return;
  started_ = true;
  for (auto& w : workers_) {
    Worker* wp = w.get();
    w->thread = std::thread([this, wp] { run_worker(*wp); });
  }
}

void Scheduler::stop() {
  {
    std::lock_guard lk(park_mu_);
    if (stopping_) return;
    stopping_ = true;
    stop_flag_.store(true);
  }
  park_cv_.notify_all();
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
}

bool Scheduler::on_worker_thread() const noexcept {
  auto* w = static_cast<Worker*>(t_worker);
  return w && w->owner == this;
}

void Scheduler::count_delivered(std::uint32_t n) noexcept {
  auto* w = static_cast<Worker*>(t_worker);
  if (w && w->owner == this) {
    w->delivered.store(w->delivered.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  } else {
    external_delivered_.fetch_add(n, std::memory_order_relaxed);
  }
}

void Scheduler::count_taken(std::uint32_t n) noexcept {
  auto* w = static_cast<Worker*>(t_worker);
  if (w && w->owner == this) {
    w->taken.store(w->taken.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  } else {
    external_taken_.fetch_add(n, std::memory_order_relaxed);  // a mailbox drained at close
  }
}

std::uint64_t Scheduler::delivered() const noexcept {
  std::uint64_t n = external_delivered_.load(std::memory_order_relaxed);
  for (auto& w : workers_) n += w->delivered.load(std::memory_order_relaxed);
  return n;
}

std::uint64_t Scheduler::taken() const noexcept {
  std::uint64_t n = external_taken_.load(std::memory_order_relaxed);
  for (auto& w : workers_) n += w->taken.load(std::memory_order_relaxed);
  return n;
}

std::uint64_t Scheduler::runnable() const noexcept {
  std::uint64_t n = g_size_.load(std::memory_order_relaxed);
  for (auto& w : workers_) {
    n += w->q_size.load(std::memory_order_relaxed);
    n += w->next.load(std::memory_order_relaxed) != nullptr;
  }
  return n;
}

void Scheduler::schedule(CellBase* c) noexcept {
  auto* w = static_cast<Worker*>(t_worker);
  if (w && w->owner == this) {
    // Runs next on this worker: the sender is likely to finish soon, and the
    // recipient's data is warm in this core's cache.
    CellBase* prev = w->next.exchange(c, std::memory_order_seq_cst);
    w->next_seq.fetch_add(1, std::memory_order_release);
    if (prev) push_local(*w, prev);
  } else {
    push_global(c);
  }
  notify_if_needed();
}

void Scheduler::notify_if_needed() noexcept {
  if (searching_.load(std::memory_order_seq_cst) != 0) return;
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  std::lock_guard lk(park_mu_);
  if (sleepers_.load(std::memory_order_relaxed) > wake_tokens_) {
    ++wake_tokens_;
    park_cv_.notify_one();
  }
}

void Scheduler::push_local(Worker& w, CellBase* c) noexcept {
  {
    std::lock_guard lk(w.mu);
    w.queue.push(c);
  }
  w.q_size.fetch_add(1, std::memory_order_seq_cst);
}

CellBase* Scheduler::pop_local(Worker& w) noexcept {
  if (w.q_size.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard lk(w.mu);
  CellBase* c = w.queue.pop();
  if (c) w.q_size.fetch_sub(1, std::memory_order_relaxed);
  return c;
}

// Takes up to half of the victim's queue (at most 32): one to run, the rest
// into the thief's own queue.
CellBase* Scheduler::steal_from(Worker& victim, Worker& thief) noexcept {
  if (victim.q_size.load(std::memory_order_relaxed) == 0) return nullptr;
  CellQueue taken;
  std::size_t n = 0;
  {
    std::unique_lock lk(victim.mu, std::try_to_lock);
    if (!lk.owns_lock()) return nullptr;
    std::size_t want = std::min<std::size_t>(32, (victim.q_size.load(std::memory_order_relaxed) + 1) / 2);
    while (n < want) {
      CellBase* c = victim.queue.pop();
      if (!c) break;
      taken.push(c);
      ++n;
    }
    victim.q_size.fetch_sub(n, std::memory_order_relaxed);
  }
  CellBase* first = taken.pop();
  if (taken.head) {
    {
      std::lock_guard lk(thief.mu);
      thief.queue.append(taken.head, taken.tail);
    }
    thief.q_size.fetch_add(n - 1, std::memory_order_seq_cst);
  }
  return first;
}

void Scheduler::push_global(CellBase* c) noexcept {
  {
    std::lock_guard lk(global_mu_);
    global_.push(c);
  }
  g_size_.fetch_add(1, std::memory_order_seq_cst);
}

CellBase* Scheduler::pop_global() noexcept {
  if (g_size_.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard lk(global_mu_);
  CellBase* c = global_.pop();
  if (c) g_size_.fetch_sub(1, std::memory_order_relaxed);
  return c;
}

bool Scheduler::has_work() const noexcept {
  if (g_size_.load(std::memory_order_seq_cst) != 0) return true;
  for (auto& w : workers_) {
    if (w->q_size.load(std::memory_order_seq_cst) != 0) return true;
    if (w->next.load(std::memory_order_seq_cst) != nullptr) return true;
  }
  return false;
}

bool Scheduler::quiescent() const noexcept {
  return sleepers_.load(std::memory_order_seq_cst) == static_cast<int>(workers_.size()) &&
         !has_work();
}

CellBase* Scheduler::find_local(Worker& w) noexcept {
  if (++w.tick % kGlobalCheckEvery == 0) {
    if (CellBase* c = pop_global()) return c;
  }
  if (w.lifo_streak < kMaxLifoStreak) {
    if (CellBase* c = w.next.exchange(nullptr, std::memory_order_acq_rel)) {
      ++w.lifo_streak;
      return c;
    }
  }
  w.lifo_streak = 0;
  if (CellBase* c = pop_local(w)) return c;
  if (CellBase* c = w.next.exchange(nullptr, std::memory_order_acq_rel)) return c;
  return pop_global();
}

CellBase* Scheduler::search(Worker& w) noexcept {
  searching_.fetch_add(1, std::memory_order_seq_cst);
  const std::size_t n = workers_.size();
  struct Seen {
    std::uint64_t seq = ~std::uint64_t{0};
    std::chrono::steady_clock::time_point since{};
  };
  Seen seen[64];
  CellBase* found = nullptr;
  auto start = std::chrono::steady_clock::now();
  for (std::uint32_t round = 0; !found && !stop_flag_.load(std::memory_order_relaxed); ++round) {
    if ((found = pop_global())) break;
    if ((found = find_local(w))) break;
    for (std::size_t k = 1; k < n && !found; ++k) {
      Worker& v = *workers_[(w.index + k) % n];
      found = steal_from(v, w);
    }
    if (found) break;
    auto now = std::chrono::steady_clock::now();
    for (std::size_t k = 1; k < n && k < 64 && !found; ++k) {
      Worker& v = *workers_[(w.index + k) % n];
      CellBase* c = v.next.load(std::memory_order_acquire);
      std::uint64_t seq = v.next_seq.load(std::memory_order_acquire);
      if (!c) {
        seen[k].seq = ~std::uint64_t{0};
        continue;
      }
      if (seen[k].seq != seq) {
        seen[k] = {seq, now};
      } else if (now - seen[k].since >= kNextStaleAfter) {
        if (v.next.compare_exchange_strong(c, nullptr, std::memory_order_acq_rel)) found = c;
      }
    }
    if (found || now - start >= kSpinFor) break;
    // The core goes to any other thread ready to run on it (sched_yield
    // returns at once when there is none, so on an idle machine this is a
    // plain spin). Without it, on a machine with more ready threads than
    // cores (several nodes beside their database), every idle worker would
    // hold its core for the whole spin while the threads that make the work
    // it waits for -- another node, PostgreSQL -- wait for a core.
    std::this_thread::yield();
  }
  // Leaving the search: pushes made while we searched skipped their wake-up
  // (a searcher would find the work). If we were the last searcher, that
  // promise passes to a parked worker whenever work may remain — whether or
  // not we found some ourselves.
  if (searching_.fetch_sub(1, std::memory_order_seq_cst) == 1 && (found || has_work())) notify_if_needed();
  return found;
}

void Scheduler::park(Worker&) {
  std::unique_lock lk(park_mu_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  // Re-check after announcing ourselves: a push that saw no sleeper has
  // made its work visible before we look here (both sides are seq_cst).
  if (stopping_ || has_work()) {
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    lk.unlock();
    // We take one item; more may be queued with nobody else awake for it.
    if (!stopping_) notify_if_needed();
    return;
  }
  park_cv_.wait(lk, [&] { return wake_tokens_ > 0 || stopping_; });
  if (wake_tokens_ > 0) --wake_tokens_;
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
}

void Scheduler::run(Worker& w, CellBase* c) noexcept {
  switch (c->resume(throughput_)) {
    case Resume::idle:
      break;
    case Resume::more:
      push_local(w, c);
      notify_if_needed();
      break;
    case Resume::terminated:
      sys_.on_terminated(c);
      break;
  }
}

void Scheduler::run_worker(Worker& w) {
  t_worker = &w;
  while (!stop_flag_.load(std::memory_order_acquire)) {
    CellBase* c = find_local(w);
    if (!c) c = search(w);
    if (c) {
      run(w, c);
      continue;
    }
    park(w);
  }
  t_worker = nullptr;
}

}  // namespace troupe::detail
