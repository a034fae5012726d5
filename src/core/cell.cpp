#include <cmath>
#include <exception>
#include <typeinfo>

#include "system_impl.hpp"
#include "troupe/core/actor.hpp"

namespace troupe::detail {

namespace {

// Exit reason, stored in the state word once terminated (bits 8..9).
constexpr std::uint16_t kReasonShift = 8;

std::string what_of(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "non-standard exception";
  }
}

struct StartEnvelope final : SysEnvelope<StartEnvelope> {
  void run(CellBase& c);
  void drop(CellBase&) { delete this; }
};

}  // namespace

struct StopEnvelope final : SysEnvelope<StopEnvelope> {
  explicit StopEnvelope(ExitReason r) : reason(r) {}
  void run(CellBase& c) {
    ExitReason r = reason;
    delete this;
    c.state_ = static_cast<std::uint16_t>(c.state_ | CellBase::kStopRequested |
                                          (static_cast<std::uint16_t>(r) << kReasonShift));
  }
  void drop(CellBase&) { delete this; }
  ExitReason reason;
};

// Fires when a restart back-off ends: reschedules the suspended cell.
class RestartNode final : public TimerService::Node {
 public:
  explicit RestartNode(CellBase* c) : cell_(c) {}

 private:
  void fire() noexcept override {
    SystemImpl& s = cell_->system();
    bool external = !s.scheduler.on_worker_thread();
    if (external) s.external_inflight.fetch_add(1, std::memory_order_seq_cst);
    s.scheduler.schedule(cell_.get());
    if (external) s.external_inflight.fetch_sub(1, std::memory_order_seq_cst);
  }
  CellRef cell_;
};

namespace {
void StartEnvelope::run(CellBase& c) {
  std::unique_ptr<StartEnvelope> self(this);
  c.start_incarnation();
}
}  // namespace

Extras::~Extras() {
  for (auto& s : timers) s.node->release();
  if (rt_node) rt_node->release();
  if (behavior && behavior_deleter) behavior_deleter(behavior);
  for (auto* c : watching) c->release();
}

CellBase::CellBase(SystemImpl* sys, CellBase* parent, std::uint16_t opts) noexcept
    : opts_(opts), system_(sys), parent_(parent) {
  sys->cell_created();
}

CellBase::~CellBase() {
  // Anything still queued (a cell that never ran, or freed after close).
  Envelope* h = head_.load(std::memory_order_acquire);
  if (h != kIdle && h != kClosed) drain_dead(h);
  if (cache_) drain_dead(cache_);
  if (extras_) {
    if (extras_->stash_head) drain_dead(extras_->stash_head);
    delete extras_;
  }
  system_->cell_freed();
}

Extras& CellBase::extras() {
  if (!extras_) extras_ = new Extras();
  return *extras_;
}

const std::string& CellBase::name() const noexcept {
  static const std::string empty;
  return extras_ ? extras_->name : empty;
}

TimePoint CellBase::now() const noexcept { return system_->clock->now(); }

void CellBase::note_activity_slow() {
  if (extras_) extras_->last_activity = now();
}

// --- mailbox -----------------------------------------------------------------

Delivery CellBase::push_system(Envelope* e) noexcept {
  if (head_.load(std::memory_order_acquire) == kClosed) return Delivery::dead_letter;
  bool external = !system_->scheduler.on_worker_thread();
  if (external) system_->external_inflight.fetch_add(1, std::memory_order_seq_cst);
  Envelope* old = head_.load(std::memory_order_relaxed);
  Delivery d = Delivery::delivered;
  for (;;) {
    if (old == kClosed) {
      d = Delivery::dead_letter;
      break;
    }
    e->next = (old == kIdle) ? nullptr : old;
    if (head_.compare_exchange_weak(old, e, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      if (old == kIdle) system_->scheduler.schedule(this);
      break;
    }
  }
  if (external) system_->external_inflight.fetch_sub(1, std::memory_order_seq_cst);
  return d;
}

Delivery CellBase::push_user(Envelope* e) noexcept {
  if (head_.load(std::memory_order_acquire) == kClosed) return Delivery::dead_letter;
  if (system_->closing.load(std::memory_order_relaxed)) [[unlikely]] {
    // Intake is closed: only actors (draining) may still send.
    if (!system_->scheduler.on_worker_thread()) return Delivery::dead_letter;
  }
  if (opts_ & kBounded) [[unlikely]] {
    auto& q = extras_->queued;
    if (q.fetch_add(1, std::memory_order_relaxed) >= extras_->capacity) {
      q.fetch_sub(1, std::memory_order_relaxed);
      return Delivery::mailbox_full;
    }
    Delivery d = push_system(e);
    if (d != Delivery::delivered) q.fetch_sub(1, std::memory_order_relaxed);
    return d;
  }
  return push_system(e);
}

bool CellBase::take_batch() noexcept {
  Envelope* h = head_.exchange(nullptr, std::memory_order_acquire);
  if (!h) return false;
  Envelope* prev = nullptr;
  std::uint32_t users = 0;
  while (h) {
    Envelope* next = h->next;
    h->next = prev;
    users += (h->sys == nullptr);
    prev = h;
    h = next;
  }
  cache_ = prev;
  if ((opts_ & kBounded) && users) extras_->queued.fetch_sub(users, std::memory_order_relaxed);
  return true;
}

void CellBase::request_stop() noexcept {
  auto* e = new (std::nothrow) StopEnvelope(ExitReason::normal);
  if (e && push_system(e) != Delivery::delivered) delete e;
}

void CellBase::request_stop_for_shutdown() noexcept {
  auto* e = new (std::nothrow) StopEnvelope(ExitReason::shutdown);
  if (e && push_system(e) != Delivery::delivered) delete e;
}

// --- activation ----------------------------------------------------------------

void CellBase::start_incarnation() {
  state_ = static_cast<std::uint16_t>(state_ | kStarted);
  on_start_hook();
}

Resume CellBase::resume(std::uint32_t budget) noexcept {
  if (state_ & kSuspended) {
    // A restart back-off ended: build the fresh object and start it first.
    state_ = static_cast<std::uint16_t>(state_ & ~kSuspended);
    if (!recreate()) {
      terminate(ExitReason::failure, "restart failed: the actor could not be rebuilt");
      return Resume::terminated;
    }
    auto* s = new (std::nothrow) StartEnvelope();
    if (s) {
      s->next = cache_;
      cache_ = s;
    }
  }
  for (std::uint32_t n = 0; n < budget; ++n) {
    if (!cache_ && !take_batch()) {
      Envelope* expected = nullptr;
      if (head_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) {
        return Resume::idle;
      }
      take_batch();
    }
    Envelope* e = cache_;
    cache_ = e->next;
    e->next = nullptr;
    run_one(e);
    if (state_ & (kStopRequested | kSuspended)) [[unlikely]] {
      if (state_ & kStopRequested) {
        auto reason = static_cast<ExitReason>((state_ >> kReasonShift) & 3);
        terminate(reason, stop_detail_take());
        return Resume::terminated;
      }
      return Resume::suspended;
    }
  }
  if (!cache_) {
    Envelope* expected = nullptr;
    if (head_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) return Resume::idle;
  }
  return Resume::more;
}

void CellBase::run_one(Envelope* e) {
  try {
    if (!e->sys) {
      invoke_user(e);
    } else {
      e->sys(e, this, SysOp::run);
    }
  } catch (...) {
    handle_failure(std::current_exception());
  }
}

std::string CellBase::stop_detail_take() {
  if (!extras_) return {};
  return std::move(extras_->stop_detail);
}

void CellBase::handle_failure(std::exception_ptr ep) noexcept {
  system_->failures.fetch_add(1, std::memory_order_relaxed);
  std::string what = what_of(ep);
  system_->log_failure(*this, what);
  auto directive = extras_ ? static_cast<Supervision::Directive>(extras_->directive)
                           : Supervision::Directive::stop;
  if (directive == Supervision::Directive::resume) return;
  if (directive == Supervision::Directive::restart) {
    auto& x = *extras_;
    TimePoint t = now();
    if (x.restarts_in_window == 0 || t - x.window_start > x.restart_window) {
      x.window_start = t;
      x.restarts_in_window = 0;
    }
    if (++x.restarts_in_window <= x.max_restarts) {
      system_->restarts.fetch_add(1, std::memory_order_relaxed);
      reset_incarnation();
      double scale = std::pow(x.backoff_factor, static_cast<double>(x.restarts_in_window - 1));
      auto min_ns = static_cast<double>(x.min_backoff.count());
      auto delay = Duration(static_cast<Duration::rep>(
          std::min(min_ns * scale, static_cast<double>(x.max_backoff.count()))));
      if (delay <= Duration::zero()) {
        on_stop_hook();
        if (!recreate()) {
          x.stop_detail = "restart failed: the actor could not be rebuilt";
          state_ = static_cast<std::uint16_t>(state_ | kStopRequested |
                                              (static_cast<std::uint16_t>(ExitReason::failure) << kReasonShift));
          return;
        }
        auto* s = new (std::nothrow) StartEnvelope();
        if (s) {
          s->next = cache_;
          cache_ = s;
        }
        return;
      }
      // Destroy the broken object now; the mailbox waits for the back-off.
      on_stop_hook();
      state_ = static_cast<std::uint16_t>(state_ | kSuspended);
      auto* node = new RestartNode(this);
      system_->timers.schedule(node, t + delay);
      node->release();
      return;
    }
    what = "restart limit reached (" + std::to_string(x.max_restarts) + "), last failure: " + what;
  }
  extras().stop_detail = what;
  state_ = static_cast<std::uint16_t>(state_ | kStopRequested |
                                      (static_cast<std::uint16_t>(ExitReason::failure) << kReasonShift));
}

// Drops what belonged to the failed incarnation: timers, receive timeout,
// behaviour. Stashed messages go back to the front of the mailbox so that the
// new incarnation sees them.
void CellBase::reset_incarnation() noexcept {
  if (!extras_) return;
  auto& x = *extras_;
  for (auto& s : x.timers) {
    system_->timers.cancel(s.node);
    s.node->release();
  }
  x.timers.clear();
  ++x.timer_gen;
  if (x.rt_node) {
    system_->timers.cancel(x.rt_node);
    x.rt_node->release();
    x.rt_node = nullptr;
  }
  ++x.rt_gen;
  state_ = static_cast<std::uint16_t>(state_ & ~(kReceiveTimeout | kStarted));
  set_behavior(nullptr, nullptr);
  unstash_all();
}

void CellBase::terminate(ExitReason reason, const std::string& detail) noexcept {
  state_ = static_cast<std::uint16_t>((state_ & ~(3u << kReasonShift)) | kTerminated |
                                      (static_cast<std::uint16_t>(reason) << kReasonShift));
  reset_incarnation();
  on_stop_hook();
  set_behavior(nullptr, nullptr);
  // Close the mailbox: from here every push fails (dead letter).
  Envelope* rest = head_.exchange(kClosed, std::memory_order_acq_rel);
  if (rest != kIdle && rest) drain_dead(rest);
  if (cache_) {
    drain_dead(cache_);
    cache_ = nullptr;
  }
  if (extras_) {
    auto& x = *extras_;
    if (x.stash_head) {
      drain_dead(x.stash_head);
      x.stash_head = x.stash_tail = nullptr;
      x.stash_size = 0;
    }
    for (auto& w : x.watchers) w->notify(*this, reason, detail);
    x.watchers.clear();
    for (auto* c : x.watching) c->release();
    x.watching.clear();
    std::lock_guard lk(x.children_mu);
    for (CellBase* c = x.children; c; c = c->sib_next_) {
      reason == ExitReason::shutdown ? c->request_stop_for_shutdown() : c->request_stop();
    }
  }
  if (parent_) {
    auto& px = *parent_->extras_;
    {
      std::lock_guard lk(px.children_mu);
      if (sib_prev_) {
        sib_prev_->sib_next_ = sib_next_;
      } else {
        px.children = sib_next_;
      }
      if (sib_next_) sib_next_->sib_prev_ = sib_prev_;
      sib_prev_ = sib_next_ = nullptr;
    }
    CellBase* p = parent_;
    parent_ = nullptr;
    p->release();
  }
}

ExitReason CellBase::exit_reason() const noexcept {
  return static_cast<ExitReason>((state_ >> kReasonShift) & 3);
}

void CellBase::drain_dead(Envelope* list) noexcept {
  while (list) {
    Envelope* next = list->next;
    list->next = nullptr;
    if (!list->sys) {
      count_dead_letter(nullptr);
      destroy_user(list);
    } else {
      list->sys(list, this, SysOp::drop);
    }
    list = next;
  }
}

void CellBase::count_dead_letter(const char* what) noexcept {
  system_->on_dead_letter(*this, what ? what : type_name());
}

// --- stash, children, watch ----------------------------------------------------

Result<void> CellBase::stash_envelope(Envelope* e) {
  auto& x = extras();
  if (x.stash_size >= x.stash_capacity) {
    return Error(ErrorCode::stash_overflow,
                 "stash of '" + name() + "' is full (" + std::to_string(x.stash_capacity) + ")");
  }
  e->next = nullptr;
  if (x.stash_tail) {
    x.stash_tail->next = e;
  } else {
    x.stash_head = e;
  }
  x.stash_tail = e;
  ++x.stash_size;
  return {};
}

void CellBase::unstash_all() noexcept {
  if (!extras_ || !extras_->stash_head) return;
  auto& x = *extras_;
  x.stash_tail->next = cache_;
  cache_ = x.stash_head;
  x.stash_head = x.stash_tail = nullptr;
  x.stash_size = 0;
}

void CellBase::link_child(CellBase* child) {
  auto& x = extras();
  std::lock_guard lk(x.children_mu);
  child->sib_prev_ = nullptr;
  child->sib_next_ = x.children;
  if (x.children) x.children->sib_prev_ = child;
  x.children = child;
  retain();  // the child's reference to its parent
}

void CellBase::add_watcher(std::unique_ptr<DownNotifier> n) { extras().watchers.push_back(std::move(n)); }

void CellBase::set_behavior(void* b, void (*deleter)(void*)) noexcept {
  if (!b && !extras_) return;
  auto& x = extras();
  if (x.behavior && x.behavior_deleter) x.behavior_deleter(x.behavior);
  x.behavior = b;
  x.behavior_deleter = deleter;
}

void WatchEnvelope::drop(CellBase& c) {
  std::unique_ptr<WatchEnvelope> self(this);
  notifier->notify(c, c.exit_reason(), "");
}

void UnwatchEnvelope::run(CellBase& c) {
  std::unique_ptr<UnwatchEnvelope> self(this);
  auto* x = c.extras_if();
  if (!x) return;
  auto& ws = x->watchers;
  for (auto it = ws.begin(); it != ws.end(); ++it) {
    if ((*it)->watcher == watcher.get()) {
      ws.erase(it);
      return;
    }
  }
}

}  // namespace troupe::detail
