// The job service's priority queue (J4) and retry back-off: the queue actor
// that Idle FSMs pull jobs from. See include/troupe/patterns/job_service.hpp
// for the contract and doc/jobs.md for the design.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "job_internal.hpp"

namespace troupe::detail {
namespace {

// A single-consumer ring buffer that grows by doubling: the queue levels
// and the waiting FSMs, without an allocation per element.
template <class T>
class JobRing {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  void push_back(T&& v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }
  T pop_front() {
    T v = std::move(buf_[head_]);
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
    return v;
  }
  void clear() {
    buf_.clear();
    head_ = size_ = 0;
  }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 16 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) next[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// Priority queue (J4) and retry back-off

class JobQueue final : public Actor<QueueMsg> {
 public:
  explicit JobQueue(const std::weak_ptr<JobCore>& core)
      : core_(lock_job_core(core)), paused_(core_->settings.start_paused) {}

  void on_stop() {
    // Answer everything held here now (shutting_down), before stop() is
    // told the queue is down.
    for (auto& l : levels_) {
      l->q.clear();
      l->depth->store(0, std::memory_order_relaxed);
    }
    delayed_.clear();
    core_->waiting_retry.store(0, std::memory_order_relaxed);
    waiting_.clear();
    core_->note_down(JobCore::kQueueDown);
  }

  void receive(QueueMsg& m) {
    match(
        m,
        [&](QAccepted& a) {
          for (auto& r : a.recs) push(std::move(r));
          serve();
        },
        [&](QPull& p) {
          if (!paused_ && top_ != kNone && waiting_.empty()) {
            assign(p.fsm);
          } else {
            waiting_.push_back(std::move(p.fsm));
          }
        },
        [&](QRetry& r) { on_retry(r); }, [&](QRetryTick&) { on_retry_tick(); },
        [&](QPause& p) {
          paused_ = p.paused;
          serve();
        },
        [&](QStop&) { stop(); });
  }

 private:
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  // Empty levels are dropped once there are more than this many levels.
  static constexpr std::size_t kKeptLevels = 64;

  struct Level {
    int priority = 0;
    std::size_t index = 0;
    JobRing<JobRecord> q;
    std::atomic<std::uint64_t>* depth = nullptr;
  };
  struct Delayed {
    TimePoint due;
    std::uint64_t order;
    JobRecord rec;
  };
  struct Later {
    bool operator()(const Delayed& a, const Delayed& b) const noexcept {
      return a.due != b.due ? a.due > b.due : a.order > b.order;
    }
  };

  static void add(std::atomic<std::uint64_t>* c, std::int64_t by) noexcept {
    // single writer (this actor); stats() only reads
    c->store(c->load(std::memory_order_relaxed) + static_cast<std::uint64_t>(by), std::memory_order_relaxed);
  }

  Level& level_for(int priority) {
    if (last_ && last_->priority == priority) return *last_;
    auto it = std::lower_bound(levels_.begin(), levels_.end(), priority,
                               [](const std::unique_ptr<Level>& l, int p) { return l->priority > p; });
    if (it == levels_.end() || (*it)->priority != priority) {
      auto l = std::make_unique<Level>();
      l->priority = priority;
      {
        std::lock_guard lk(core_->levels_mu);
        l->depth = &core_->levels.try_emplace(priority).first->second;
      }
      it = levels_.insert(it, std::move(l));
      reindex();
    }
    last_ = it->get();
    return *last_;
  }

  void reindex() {
    top_ = kNone;
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      levels_[i]->index = i;
      if (top_ == kNone && !levels_[i]->q.empty()) top_ = i;
    }
  }

  void push(JobRecord&& rec) {
    Level& l = level_for(rec.priority);
    l.q.push_back(std::move(rec));
    add(l.depth, 1);
    if (top_ == kNone || l.index < top_) top_ = l.index;
  }

  JobRecord pop_top() {
    Level& l = *levels_[top_];
    JobRecord r = l.q.pop_front();
    add(l.depth, -1);
    if (l.q.empty()) {
      std::size_t i = top_ + 1;
      while (i < levels_.size() && levels_[i]->q.empty()) ++i;
      top_ = i < levels_.size() ? i : kNone;
      if (levels_.size() > kKeptLevels) prune();
    }
    return r;
  }

  // Many distinct priorities seen: forget the empty levels.
  void prune() {
    std::lock_guard lk(core_->levels_mu);
    std::erase_if(levels_, [&](const std::unique_ptr<Level>& l) {
      if (!l->q.empty()) return false;
      core_->levels.erase(l->priority);
      return true;
    });
    last_ = nullptr;
    reindex();
  }

  void assign(ActorRef<FsmMsg>& fsm) {
    JobRecord r = pop_top();
    core_->backlog.fetch_sub(1, std::memory_order_relaxed);
    (void)fsm.tell(FsmAssign{std::move(r)});
  }

  void serve() {
    while (!paused_ && top_ != kNone && !waiting_.empty()) {
      ActorRef<FsmMsg> f = waiting_.pop_front();
      if (f.terminated()) continue;  // a retired FSM's pull, never answered
      assign(f);
    }
  }

  void on_retry(QRetry& r) {
    if (r.delay <= Duration::zero()) {
      push(std::move(r.rec));
      serve();
      return;
    }
    const TimePoint now = this->now();
    delayed_.push_back(Delayed{deadline_after(now, r.delay), ++order_, std::move(r.rec)});
    std::push_heap(delayed_.begin(), delayed_.end(), Later{});
    core_->waiting_retry.fetch_add(1, std::memory_order_relaxed);
    arm(now);
  }

  void on_retry_tick() {
    armed_ = TimePoint::max();
    const TimePoint now = this->now();
    while (!delayed_.empty() && delayed_.front().due <= now) {
      std::pop_heap(delayed_.begin(), delayed_.end(), Later{});
      push(std::move(delayed_.back().rec));
      delayed_.pop_back();
      core_->waiting_retry.fetch_sub(1, std::memory_order_relaxed);
    }
    arm(now);
    serve();
  }

  void arm(TimePoint now) {
    if (delayed_.empty() || delayed_.front().due >= armed_) return;
    armed_ = delayed_.front().due;
    start_timer("retry", armed_ - now, QueueMsg{QRetryTick{}});
  }

  std::shared_ptr<JobCore> core_;
  bool paused_;
  std::vector<std::unique_ptr<Level>> levels_;  // highest priority first
  std::size_t top_ = kNone;                     // highest level holding jobs
  Level* last_ = nullptr;                       // the level of the last push
  JobRing<ActorRef<FsmMsg>> waiting_;           // Idle FSMs that pulled, in order
  std::vector<Delayed> delayed_;                // min-heap by due time
  std::uint64_t order_ = 0;
  TimePoint armed_ = TimePoint::max();
};

}  // namespace

ActorRef<QueueMsg> spawn_job_queue(ActorSystem& system, std::string name,
                                   const std::weak_ptr<JobCore>& core) {
  return system.spawn<JobQueue>(SpawnOptions{.name = std::move(name)}, core);
}

}  // namespace troupe::detail
