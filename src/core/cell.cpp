#include <cmath>
#include <exception>
#include <limits>
#include <typeinfo>

#include "system_impl.hpp"
#include "troupe/core/actor.hpp"

namespace troupe::detail {

namespace {

// Exit reason, stored in the state word once terminated (bits 8..9).
constexpr std::uint16_t kReasonShift = 8;
constexpr std::uint16_t kReasonMask = 3u << kReasonShift;

std::uint16_t reason_bits(ExitReason r) {
  return static_cast<std::uint16_t>(static_cast<std::uint16_t>(r) << kReasonShift);
}

std::string what_of(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "non-standard exception";
  }
}

}  // namespace

struct StopEnvelope final : SysEnvelope<StopEnvelope> {
  explicit StopEnvelope(ExitReason r) : reason(r) {}
  void run(CellBase& c) {
    ExitReason r = reason;
    delete this;
    if (c.state_ & CellBase::kStopRequested) return;  // an earlier stop decides the reason
    c.state_ = static_cast<std::uint16_t>((c.state_ & ~kReasonMask) | CellBase::kStopRequested | reason_bits(r));
  }
  void drop(CellBase&) { delete this; }
  ExitReason reason;
};

// Ends a restart back-off, in the actor's own activation.
struct RestartEnvelope final : SysEnvelope<RestartEnvelope> {
  void run(CellBase& c) {
    delete this;
    c.restart_now();
  }
  void drop(CellBase&) { delete this; }
};

namespace {

// Fires when a restart back-off ends. It only enqueues a RestartEnvelope:
// the mailbox protocol alone decides who runs the actor, so the fire can
// never start a second activation.
class RestartNode final : public TimerService::Node {
 public:
  explicit RestartNode(CellBase* c) : cell_(c) {}

 private:
  void fire() noexcept override {
    auto* e = new (std::nothrow) RestartEnvelope();
    if (e && cell_->push_system(e) != Delivery::delivered) delete e;
  }
  CellRef cell_;
};

}  // namespace

Extras::~Extras() {
  for (auto& s : timers) s.node->release();
  if (rt_node) rt_node->release();
  if (restart_node) restart_node->release();
  if (behavior && behavior_deleter) behavior_deleter(behavior);
  for (auto& [b, d] : retired) d(b);
  for (auto* c : watching) c->release();
}

CellBase::CellBase(SystemImpl* sys, CellBase* parent, std::uint16_t opts) noexcept
    : opts_(opts), system_(sys), parent_(parent) {
  sys->cell_created();
}

// A cell is freed only after terminate() or abandon() emptied and closed its
// mailbox (a live cell is always held by its parent link), so nothing is
// left to drain here, where the derived parts are already gone.
CellBase::~CellBase() {
  delete extras_.load(std::memory_order_relaxed);
  system_->cell_freed();
}

Extras& CellBase::extras() {
  Extras* x = extras_.load(std::memory_order_relaxed);
  if (!x) {
    x = new Extras();
    extras_.store(x, std::memory_order_release);
  }
  return *x;
}

const std::string& CellBase::name() const noexcept {
  static const std::string empty;
  auto* x = extras_if();
  return x ? x->name : empty;
}

TimePoint CellBase::now() const noexcept { return system_->clock->now(); }
TimePoint CellBase::coarse_now() const noexcept { return system_->clock->coarse_now(); }

void CellBase::note_activity_slow() {
  if (auto* x = extras_if()) x->last_activity = now();
}

ExitReason CellBase::exit_reason() const noexcept {
  return static_cast<ExitReason>((state_ & kReasonMask) >> kReasonShift);
}

const std::string& CellBase::exit_detail() const noexcept {
  static const std::string empty;
  auto* x = extras_if();
  return x ? x->stop_detail : empty;
}

// --- mailbox -----------------------------------------------------------------

Delivery CellBase::push_system(Envelope* e) noexcept {
  // Acquire on every read of head_: a sender that sees kClosed may read what
  // terminate() wrote before closing (exit reason and detail, for watch).
  Envelope* old = head_.load(std::memory_order_acquire);
  if (old == kClosed) return Delivery::dead_letter;
  bool external = !system_->scheduler.on_worker_thread();
  if (external) system_->external_inflight.fetch_add(1, std::memory_order_seq_cst);
  // Read before the push: once pushed, the envelope is the recipient's,
  // which may run and free it at once.
  const bool user = e->sys == nullptr;
  Delivery d = Delivery::delivered;
  for (;;) {
    if (old == kClosed) {
      d = Delivery::dead_letter;
      break;
    }
    e->next = (old == kIdle) ? nullptr : old;
    if (head_.compare_exchange_weak(old, e, std::memory_order_acq_rel, std::memory_order_acquire)) {
      if (user) system_->scheduler.count_delivered(1);
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
    auto& x = *extras_if();
    if (x.queued.fetch_add(1, std::memory_order_relaxed) >= x.capacity) {
      x.queued.fetch_sub(1, std::memory_order_relaxed);
      return Delivery::mailbox_full;
    }
    Delivery d = push_system(e);
    if (d != Delivery::delivered) x.queued.fetch_sub(1, std::memory_order_relaxed);
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
  if ((opts_ & kBounded) && users) extras_if()->queued.fetch_sub(users, std::memory_order_relaxed);
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

void CellBase::abandon() noexcept {
  state_ = static_cast<std::uint16_t>(state_ | kTerminated);
  Envelope* rest = head_.exchange(kClosed, std::memory_order_acq_rel);
  Envelope* watches = nullptr;  // see terminate()
  if (rest != kIdle && rest != kClosed) {
    count_taken_at_close(rest);
    drain_dead(rest, &watches);
  }
  if (cache_) {
    count_taken_at_close(cache_);
    drain_dead(cache_, &watches);
    cache_ = nullptr;
  }
  reset_incarnation();
  if (cache_) {
    count_taken_at_close(cache_);
    drain_dead(cache_, &watches);
    cache_ = nullptr;
  }
  drain_dead(watches);
}

// --- activation ----------------------------------------------------------------

void CellBase::start_incarnation() {
  state_ = static_cast<std::uint16_t>(state_ | kStarted);
  on_start_hook();
}

bool CellBase::is_control(const Envelope* e) const noexcept {
  return e->sys == &SysEnvelope<StopEnvelope>::dispatch || e->sys == &SysEnvelope<RestartEnvelope>::dispatch;
}

Resume CellBase::resume(std::uint32_t budget) noexcept {
  if (state_ & kTerminated) [[unlikely]] return Resume::idle;  // defensive: never scheduled after close
  // User messages handled in this activation, counted once at its end. It
  // holds the scheduler, not the cell: once the cell went idle or
  // terminated below, another thread may release and free it before this
  // runs.
  using Sched = decltype(system_->scheduler);
  struct Taken {
    Sched& scheduler;
    std::uint32_t n = 0;
    ~Taken() {
      if (n) scheduler.count_taken(n);
    }
  } taken{system_->scheduler};
  for (std::uint32_t n = 0; n < budget; ++n) {
    if (!cache_ && !take_batch()) {
      // Last act before going idle: a suspended actor arms its restart timer
      // now, after this activation can no longer touch the cell's state.
      if (state_ & kSuspended) arm_restart();
      Envelope* expected = nullptr;
      if (head_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) return Resume::idle;
      take_batch();
    }
    Envelope* e = cache_;
    cache_ = e->next;
    e->next = nullptr;
    if ((state_ & kSuspended) && !is_control(e)) [[unlikely]] {
      defer(e);
      continue;
    }
    taken.n += (e->sys == nullptr);
    run_one(e);
    if (state_ & kStopRequested) [[unlikely]] {
      terminate(exit_reason());
      return Resume::terminated;
    }
  }
  if (!cache_) {
    if (state_ & kSuspended) arm_restart();
    Envelope* expected = nullptr;
    if (head_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) return Resume::idle;
  }
  return Resume::more;
}

void CellBase::run_one(Envelope* e) {
  // The message runs under its trace (none if it has none); a reference is
  // held across the call, as a runtime message frees its envelope first.
  TraceBox* const outer = t_trace;
  TraceBox* const trace = e->trace;
  if (trace) [[unlikely]] trace_retain(trace);
  t_trace = trace;
  try {
    if (!e->sys) {
      invoke_user(e);
    } else {
      e->sys(e, this, SysOp::run);
    }
  } catch (...) {
    handle_failure(std::current_exception());
  }
  t_trace = outer;
  if (trace) [[unlikely]] trace_release(trace);
  if (auto* x = extras_.load(std::memory_order_relaxed); x && !x->retired.empty()) [[unlikely]] {
    free_retired();
  }
}

void CellBase::free_retired() noexcept {
  auto& r = extras_.load(std::memory_order_relaxed)->retired;
  for (auto& [b, d] : r) d(b);
  r.clear();
}

// --- failure and restart ---------------------------------------------------------

void CellBase::request_failure_stop(std::string detail) noexcept {
  try {
    extras().stop_detail = std::move(detail);
  } catch (...) {
    // out of memory: the stop still happens, without its text
  }
  state_ = static_cast<std::uint16_t>((state_ & ~kReasonMask) | kStopRequested | reason_bits(ExitReason::failure));
}

void CellBase::handle_failure(std::exception_ptr ep) noexcept {
  system_->failures.fetch_add(1, std::memory_order_relaxed);
  std::string what = what_of(ep);
  system_->log_failure(*this, what);
  auto* x = extras_if();
  auto directive = x ? static_cast<Supervision::Directive>(x->directive) : Supervision::Directive::stop;
  if (directive == Supervision::Directive::resume) return;
  // A handler that asked to stop and then threw stops: no restart.
  if (directive == Supervision::Directive::restart && !(state_ & (kStopRequested | kSuspended))) {
    TimePoint t = now();
    if (x->restarts_in_window == 0 || t - x->window_start > x->restart_window) {
      x->window_start = t;
      x->restarts_in_window = 0;
    }
    if (++x->restarts_in_window <= x->max_restarts) {
      system_->restarts.fetch_add(1, std::memory_order_relaxed);
      // on_stop sees its timers cancelled; anything it arms is cancelled by
      // the second reset.
      reset_incarnation();
      on_stop_hook();
      reset_incarnation();
      double scale = std::pow(x->backoff_factor, static_cast<double>(x->restarts_in_window - 1));
      double ns = static_cast<double>(x->min_backoff.count()) * scale;
      double cap = static_cast<double>(x->max_backoff.count());
      if (!(ns <= cap)) ns = cap;  // also catches NaN
      if (!(ns > 0)) ns = 0;
      Duration delay = ns >= static_cast<double>(std::numeric_limits<Duration::rep>::max())
                           ? Duration::max()
                           : Duration(static_cast<Duration::rep>(ns));
      if (delay <= Duration::zero()) {
        restart_now_from_failure();
        return;
      }
      // Suspend: from now on only stop/restart messages run; the rest waits
      // in order. The timer is armed when this activation goes idle.
      x->restart_at = deadline_after(t, delay);
      state_ = static_cast<std::uint16_t>(state_ | kSuspended);
      return;
    }
    what = "restart limit reached (" + std::to_string(x->max_restarts) + "), last failure: " + what;
  }
  request_failure_stop(std::move(what));
}

void CellBase::restart_now_from_failure() noexcept {
  if (!recreate()) {
    request_failure_stop("restart failed: the actor could not be rebuilt");
    return;
  }
  auto* s = new (std::nothrow) SysStart();
  if (s) {
    s->next = cache_;
    cache_ = s;
  }
}

void CellBase::arm_restart() noexcept {
  auto& x = *extras_if();
  if (x.restart_node) return;
  auto* node = new (std::nothrow) RestartNode(this);
  if (!node) return;  // out of memory: the actor stays suspended until stopped
  x.restart_node = node;
  system_->timers.schedule(node, x.restart_at);
}

void CellBase::restart_now() noexcept {
  if (!(state_ & kSuspended)) return;
  auto& x = *extras_if();
  if (x.restart_node) {
    system_->timers.cancel(x.restart_node);
    x.restart_node->release();
    x.restart_node = nullptr;
  }
  state_ = static_cast<std::uint16_t>(state_ & ~kSuspended);
  // What waited during the back-off goes first, in order, after the start.
  if (x.deferred_head) {
    x.deferred_tail->next = cache_;
    cache_ = x.deferred_head;
    x.deferred_head = x.deferred_tail = nullptr;
  }
  restart_now_from_failure();
}

void CellBase::defer(Envelope* e) noexcept {
  auto& x = *extras_if();
  e->next = nullptr;
  if (x.deferred_tail) {
    x.deferred_tail->next = e;
  } else {
    x.deferred_head = e;
  }
  x.deferred_tail = e;
}

// Drops what belonged to the ending incarnation: suspended coroutine
// handlers, timers, receive timeout, behaviour. Stashed messages go back to
// the front of the mailbox so that a new incarnation sees them (or
// terminate() reports them).
void CellBase::reset_incarnation() noexcept {
  auto* x = extras_if();
  if (!x) return;
  // Suspended coroutine handlers go first, while the object they belong to
  // is alive; what they awaited is dropped when it arrives.
  if (x->handlers) drop_handlers(*x);
  for (auto& s : x->timers) {
    system_->timers.cancel(s.node);
    s.node->release();
  }
  x->timers.clear();
  ++x->timer_gen;
  if (x->rt_node) {
    system_->timers.cancel(x->rt_node);
    x->rt_node->release();
    x->rt_node = nullptr;
  }
  ++x->rt_gen;
  state_ = static_cast<std::uint16_t>(state_ & ~(kReceiveTimeout | kStarted));
  set_behavior(nullptr, nullptr);
  unstash_all();
}

// --- termination -----------------------------------------------------------------

void CellBase::terminate(ExitReason reason) noexcept {
  state_ = static_cast<std::uint16_t>((state_ & ~kReasonMask) | kTerminated | reason_bits(reason));
  reset_incarnation();
  on_stop_hook();  // sees its timers cancelled; arming more is refused (terminated)
  reset_incarnation();
  auto* x = extras_if();
  if (x && x->restart_node) {
    system_->timers.cancel(x->restart_node);
    x->restart_node->release();
    x->restart_node = nullptr;
  }
  // Close the mailbox: from here every push fails (dead letter). Everything
  // written above is visible to a sender that sees kClosed.
  Envelope* rest = head_.exchange(kClosed, std::memory_order_acq_rel);
  // Watch requests among the leftovers (queued behind the stop, or deferred
  // by a restart back-off) are answered only after every leftover message
  // has been counted, like the registered watchers below: a watcher that
  // reads stats() when its Down arrives sees all of this actor's dead
  // letters. Dropping them in mailbox order would send the Down in the
  // middle of the count.
  Envelope* watches = nullptr;
  if (rest != kIdle && rest != kClosed) {
    count_taken_at_close(rest);
    drain_dead(rest, &watches);
  }
  if (cache_) {
    count_taken_at_close(cache_);
    drain_dead(cache_, &watches);
    cache_ = nullptr;
  }
  if (x && x->deferred_head) {
    count_taken_at_close(x->deferred_head);
    drain_dead(x->deferred_head, &watches);
    x->deferred_head = x->deferred_tail = nullptr;
  }
  drain_dead(watches);  // notifies each of them (WatchEnvelope::drop)
  if (x) {
    for (auto& w : x->watchers) w->notify(*this, reason, x->stop_detail);
    x->watchers.clear();
    // Tell whom we watched to forget us, or our notifiers would pin this
    // cell for as long as they live.
    for (auto* c : x->watching) {
      auto* u = new (std::nothrow) UnwatchEnvelope(this);
      if (u && c->push_system(u) != Delivery::delivered) delete u;
      c->release();
    }
    x->watching.clear();
    std::lock_guard lk(x->children_mu);
    for (CellBase* c = x->children; c; c = c->sib_next_) {
      reason == ExitReason::shutdown ? c->request_stop_for_shutdown() : c->request_stop();
    }
  }
  if (parent_) {
    auto& px = *parent_->extras_if();
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

void CellBase::count_taken_at_close(const Envelope* list) noexcept {
  std::uint32_t users = 0;
  for (; list; list = list->next) users += (list->sys == nullptr);
  if (users) system_->scheduler.count_taken(users);
}

void CellBase::drain_dead(Envelope* list, Envelope** watches) noexcept {
  while (list) {
    Envelope* next = list->next;
    list->next = nullptr;
    if (watches && list->sys == &SysEnvelope<WatchEnvelope>::dispatch) {
      list->next = *watches;
      *watches = list;
    } else if (!list->sys) {
      count_dead_letter(message_type_name());
      destroy_user(list);
    } else {
      list->sys(list, this, SysOp::drop);
    }
    list = next;
  }
}

void CellBase::count_dead_letter(const char* mangled_type) noexcept {
  system_->on_dead_letter(*this, mangled_type);
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

bool CellBase::unstash_last(Envelope* e) noexcept {
  auto* x = extras_if();
  if (!x || x->stash_tail != e) return false;
  if (x->stash_head == e) {
    x->stash_head = x->stash_tail = nullptr;
  } else {
    Envelope* p = x->stash_head;
    while (p->next != e) p = p->next;
    p->next = nullptr;
    x->stash_tail = p;
  }
  --x->stash_size;
  return true;
}

void CellBase::unstash_all() noexcept {
  auto* x = extras_if();
  if (!x || !x->stash_head) return;
  x->stash_tail->next = cache_;
  cache_ = x->stash_head;
  x->stash_head = x->stash_tail = nullptr;
  // Back in the mailbox: counted as delivered again, since they will be
  // counted as taken again.
  system_->scheduler.count_delivered(static_cast<std::uint32_t>(x->stash_size));
  x->stash_size = 0;
}

void CellBase::link_child_locked(Extras& x, CellBase* child) noexcept {
  child->sib_prev_ = nullptr;
  child->sib_next_ = x.children;
  if (x.children) x.children->sib_prev_ = child;
  x.children = child;
  retain();  // the child's reference to its parent
}

void CellBase::add_watcher(std::unique_ptr<DownNotifier> n) { extras().watchers.push_back(std::move(n)); }

void CellBase::set_behavior(void* b, void (*deleter)(void*)) noexcept {
  auto* x = extras_if();
  if (!b && (!x || !x->behavior)) return;
  try {
    auto& ex = extras();
    if (ex.behavior && ex.behavior_deleter) ex.retired.emplace_back(ex.behavior, ex.behavior_deleter);
    ex.behavior = b;
    ex.behavior_deleter = deleter;
  } catch (...) {
    if (b && deleter) deleter(b);  // out of memory: keep the old behaviour
  }
}

void WatchEnvelope::run(CellBase& c) {
  std::unique_ptr<WatchEnvelope> self(this);
  c.add_watcher(std::move(notifier));
}

void WatchEnvelope::drop(CellBase& c) {
  std::unique_ptr<WatchEnvelope> self(this);
  notifier->notify(c, c.exit_reason(), c.exit_detail());
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

namespace troupe {

const std::string& AnyRef::name() const {
  static const std::string empty;
  return cell_ ? cell_->name() : empty;
}

}  // namespace troupe
