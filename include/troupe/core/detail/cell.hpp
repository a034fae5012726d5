#pragma once
// Runtime internals shared by the typed front end (actor.hpp) and src/core.
// Not part of the public API: names and layout change without notice.
//
// An actor lives in one heap block, a `CellImpl<A>` (typed_cell.hpp): the
// runtime header `CellBase` below, followed by the user's actor object. The header is
// kept to 80 bytes; everything an actor may never use (name, timers, stash,
// watchers, children, bounded-mailbox counter, behaviour stack) lives in an
// `Extras` block allocated on first use.
//
// Mailbox: an intrusive lock-free LIFO stack (`head_`, many producers) plus a
// FIFO list owned by the running activation (`cache_`). A producer pushes with
// one CAS; the consumer takes the whole stack with one exchange, reverses it
// into `cache_`, and only does so when `cache_` is empty, so order per sender
// is kept. Two tag values in `head_` carry the scheduling state, so that the
// push that finds the actor idle is the one that schedules it:
//   kIdle   — empty, not scheduled: the pushing thread must schedule it;
//   nullptr — empty, scheduled or running: the activation will look again;
//   kClosed — terminated: pushes fail (dead letter).

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include "troupe/core/clock.hpp"
#include "troupe/core/detail/pool.hpp"
#include "troupe/core/detail/timer_service.hpp"
#include "troupe/core/detail/trace_box.hpp"
#include "troupe/core/result.hpp"

namespace troupe {

class ActorSystem;

// What happened to a tell. Not an error type: a full mailbox or a stopped
// recipient are normal outcomes a sender may act on.
enum class Delivery : std::uint8_t {
  delivered,     // enqueued; it will be handled unless the recipient stops first
  mailbox_full,  // the recipient's bounded mailbox was at its limit; message dropped
  dead_letter,   // the recipient had stopped (or the system is shutting down)
};

std::string_view to_string(Delivery d) noexcept;

// Why an actor terminated.
enum class ExitReason : std::uint8_t {
  normal,    // it stopped itself or was asked to stop
  failure,   // a handler threw and supervision decided to stop it
  shutdown,  // the actor system shut down
};

std::string_view to_string(ExitReason r) noexcept;

namespace detail {

class CellBase;
class HandlerFrame;
class SystemImpl;
class TimerService;

enum class SysOp : std::uint8_t { run, drop };

// A mailbox node. User messages carry `sys == nullptr` and are dispatched by
// the cell, which knows the message type; runtime messages carry a function
// that either runs them in the actor's context or drops them (actor gone).
// Each carries the trace current where it was made (trace.hpp), and runs
// under it.
struct Envelope : Pooled {
  Envelope() noexcept : trace(retain_current_trace()) {}
  ~Envelope() {
    if (trace) [[unlikely]] trace_release(trace);
  }
  Envelope(const Envelope&) = delete;
  Envelope& operator=(const Envelope&) = delete;
  Envelope* next = nullptr;
  void (*sys)(Envelope* self, CellBase* cell, SysOp op) = nullptr;
  TraceBox* trace;  // a reference, or nullptr
};

// A runtime message implemented by a class with run/drop members. Both take
// ownership of `this` (delete it, or hand it on).
template <class Derived>
struct SysEnvelope : Envelope {
  SysEnvelope() { sys = &dispatch; }
  static void dispatch(Envelope* e, CellBase* c, SysOp op) {
    auto* d = static_cast<Derived*>(e);
    if (op == SysOp::run) {
      d->run(*c);
    } else {
      d->drop(*c);
    }
  }
};

// Something that must hear of a termination (see watch()).
struct DownNotifier {
  virtual ~DownNotifier() = default;
  virtual void notify(CellBase& dead, ExitReason reason, const std::string& detail) = 0;
  CellBase* watcher = nullptr;  // strong reference, released by the owner
};

// One keyed timer of an actor. `gen` is unique per actor and identifies the
// arming: a fire whose generation is no longer in the table is stale.
struct TimerSlot {
  std::string key;
  std::uint64_t gen = 0;
  TimerService::Node* node = nullptr;  // owner's reference
  bool periodic = false;
};

// Per-actor state an actor only pays for when it uses it. Owned by the cell.
// All fields except `children_mu`/`children` and the bounded counter are
// touched only by the actor's own activations.
struct Extras : Pooled {
  std::string name;

  // bounded mailbox: set before the cell is published, read by senders
  std::uint32_t capacity = 0;
  std::atomic<std::uint32_t> queued{0};

  // children, linked through CellBase::sib_*; children unlink themselves
  std::mutex children_mu;
  CellBase* children = nullptr;

  // keyed timers
  std::vector<TimerSlot> timers;
  std::uint64_t timer_gen = 0;

  // stash
  Envelope* stash_head = nullptr;
  Envelope* stash_tail = nullptr;
  std::size_t stash_size = 0;
  std::size_t stash_capacity = 1000;

  // receive timeout
  Duration rt_duration{};
  TimePoint last_activity{};
  std::uint64_t rt_gen = 0;
  TimerService::Node* rt_node = nullptr;  // owner's reference

  // watch
  std::vector<std::unique_ptr<DownNotifier>> watchers;  // who watches me
  std::vector<CellBase*> watching;                      // whom I watch (no refs)

  // behaviour set by become(); owned here so restart can drop it
  void* behavior = nullptr;
  void (*behavior_deleter)(void*) = nullptr;

  // supervision
  std::uint8_t directive = 0;  // Supervision::Directive
  Duration min_backoff{};
  Duration max_backoff{};
  double backoff_factor = 2.0;
  std::uint32_t max_restarts = 0;
  Duration restart_window{};
  std::uint32_t restarts_in_window = 0;
  TimePoint window_start{};
  std::string stop_detail;  // failure text for watchers, kept for late ones

  // restart back-off
  TimePoint restart_at{};
  TimerService::Node* restart_node = nullptr;  // owner's reference, while armed
  Envelope* deferred_head = nullptr;           // held back while suspended
  Envelope* deferred_tail = nullptr;

  // behaviours replaced during the current message, freed after it
  std::vector<std::pair<void*, void (*)(void*)>> retired;

  // coroutine handlers suspended now (coroutine.hpp), destroyed at a stop
  // or restart
  HandlerFrame* handlers = nullptr;

  ~Extras();
};

// Result of one activation, for the scheduler.
enum class Resume : std::uint8_t {
  idle,        // mailbox empty; the next push schedules it again
  more,        // budget used up with messages left: schedule again
  terminated,  // done for good; the scheduler releases the parent link's reference
};

// The runtime part of every actor. Reference counted (ActorRef and runtime
// holds); the memory is freed when the last reference goes. Thread-safety:
// push_*(), request_stop*(), retain()/release(), name(), closed() and
// exit_reason() (once closed) are thread-safe; everything else runs only
// inside the actor's own activation, which the mailbox protocol makes
// exclusive.
class CellBase : public Pooled {
 public:
  static inline Envelope* const kIdle = reinterpret_cast<Envelope*>(std::uintptr_t{1});
  static inline Envelope* const kClosed = reinterpret_cast<Envelope*>(std::uintptr_t{2});

  // Immutable after spawn.
  enum Opt : std::uint16_t { kBounded = 1 };
  // Touched only by the activation.
  enum State : std::uint16_t {
    kStarted = 1,         // on_start ran for the current incarnation
    kStopRequested = 2,   // stop after the current message
    kTerminated = 4,
    kReceiveTimeout = 8,  // receive timeout armed: track activity
    kSuspended = 16,      // restart back-off: only stop/restart run, the rest waits
    kObjectLive = 32,     // the user object is constructed (CellImpl)
  };

  CellBase(SystemImpl* sys, CellBase* parent, std::uint16_t opts) noexcept;
  CellBase(const CellBase&) = delete;
  CellBase& operator=(const CellBase&) = delete;

  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Enqueues a user message (counts against the bound) or a runtime message
  // (never bounded). On failure the envelope is NOT consumed: the caller
  // decides what a failed send means (dead letter, ask error, ...).
  Delivery push_user(Envelope* e) noexcept;
  Delivery push_system(Envelope* e) noexcept;

  // Runs up to `budget` messages. Called by the scheduler only.
  Resume resume(std::uint32_t budget) noexcept;

  // Asks the actor to stop after the messages already in its mailbox.
  void request_stop() noexcept;
  void request_stop_for_shutdown() noexcept;
  // Runs on_start for a new incarnation (activation only).
  void start_incarnation();
  // Valid once closed().
  ExitReason exit_reason() const noexcept;
  const std::string& exit_detail() const noexcept;

  // Spawn protocol (src/core/system.cpp): a new cell is born "scheduled"
  // (head_ == nullptr), so that messages its constructor sends to itself only
  // queue; start_cell() puts the start message first and schedules it once,
  // or abandon() closes it if the system refused it.
  void prime_start(Envelope* start) noexcept { cache_ = start; }
  void abandon() noexcept;

  SystemImpl& system() const noexcept { return *system_; }
  Extras& extras();  // allocates on first use (activation, or before publication)
  Extras* extras_if() const noexcept { return extras_.load(std::memory_order_acquire); }
  const std::string& name() const noexcept;
  const char* actor_type_name() const noexcept { return type_name(); }
  bool terminated_flag() const noexcept { return (state_ & kTerminated) != 0; }
  bool closed() const noexcept { return head_.load(std::memory_order_acquire) == kClosed; }

  // --- used by the typed front end, inside the activation ---
  void stop_self() noexcept { state_ = static_cast<std::uint16_t>(state_ | kStopRequested); }
  // Receive-timeout bookkeeping; a flag test unless a receive timeout is set.
  void note_activity() {
    if (state_ & kReceiveTimeout) [[unlikely]] note_activity_slow();
  }
  void set_receive_timeout_flag(bool on) noexcept {
    state_ = static_cast<std::uint16_t>(on ? (state_ | kReceiveTimeout) : (state_ & ~kReceiveTimeout));
  }
  // Before publication only (spawn).
  void add_opts(std::uint16_t o) noexcept { opts_ = static_cast<std::uint16_t>(opts_ | o); }
  Result<void> stash_envelope(Envelope* e);
  // Takes `e` back out of the stash if it is the last one stashed (a handler
  // that stashed and then threw: the failing message is dropped, not kept).
  bool unstash_last(Envelope* e) noexcept;
  void unstash_all() noexcept;
  std::size_t stash_size() const noexcept {
    auto* x = extras_if();
    return x ? x->stash_size : 0;
  }
  void add_watcher(std::unique_ptr<DownNotifier> n);
  // Replaces the become() behaviour; the old one is freed after the current
  // message, since it may be the closure that is running.
  void set_behavior(void* b, void (*deleter)(void*)) noexcept;
  void* behavior() const noexcept {
    auto* x = extras_.load(std::memory_order_relaxed);
    return x ? x->behavior : nullptr;
  }
  void count_dead_letter(const char* mangled_type) noexcept;
  TimePoint now() const noexcept;
  TimePoint coarse_now() const noexcept;

  CellBase* sched_next_ = nullptr;  // scheduler run-queue link

 protected:
  virtual ~CellBase();

  // Delivers and frees a user envelope (type known to CellImpl).
  virtual void invoke_user(Envelope* e) = 0;
  // Frees a user envelope that will not be delivered.
  virtual void destroy_user(Envelope* e) noexcept = 0;
  virtual const char* message_type_name() const noexcept = 0;
  virtual void on_start_hook() = 0;
  virtual void on_stop_hook() noexcept = 0;
  // Replaces the user object with a fresh one; false if it cannot be rebuilt.
  virtual bool recreate() noexcept = 0;
  virtual const char* type_name() const noexcept = 0;

  bool object_live() const noexcept { return (state_ & kObjectLive) != 0; }
  void set_object_live(bool on) noexcept {
    state_ = static_cast<std::uint16_t>(on ? (state_ | kObjectLive) : (state_ & ~kObjectLive));
  }

  friend class SystemImpl;
  friend struct RestartEnvelope;
  friend struct StopEnvelope;
  friend bool start_cell(SystemImpl& s, CellBase* cell, CellBase* parent);

 private:
  void note_activity_slow();
  void run_one(Envelope* e);
  void free_retired() noexcept;
  void handle_failure(std::exception_ptr ep) noexcept;
  void request_failure_stop(std::string detail) noexcept;
  void terminate(ExitReason reason) noexcept;
  // Counts and frees the user messages in `list` and drops the runtime ones.
  // With `watches`, watch requests are set aside there instead of being
  // answered, so that the caller notifies only after the whole count.
  void drain_dead(Envelope* list, Envelope** watches = nullptr) noexcept;
  // Counts the user messages of a mailbox closed before they were taken.
  void count_taken_at_close(const Envelope* list) noexcept;
  void reset_incarnation() noexcept;
  void defer(Envelope* e) noexcept;
  void arm_restart() noexcept;
  void restart_now() noexcept;
  void restart_now_from_failure() noexcept;
  bool take_batch() noexcept;
  bool is_control(const Envelope* e) const noexcept;
  void link_child_locked(Extras& x, CellBase* child) noexcept;

  std::atomic<std::uint32_t> refs_{1};
  std::uint16_t opts_;
  std::uint16_t state_ = 0;
  std::atomic<Envelope*> head_{nullptr};  // born scheduled; see prime_start()
  Envelope* cache_ = nullptr;
  SystemImpl* system_;
  CellBase* parent_;

 public:  // owned by the parent's children list, under its children_mu
  CellBase* sib_prev_ = nullptr;
  CellBase* sib_next_ = nullptr;

 private:
  // Written once, by the activation (or before publication); read by other
  // threads only through name(), hence atomic.
  std::atomic<Extras*> extras_{nullptr};
};

// Owning smart pointer for a cell (one reference).
class CellRef {
 public:
  CellRef() = default;
  explicit CellRef(CellBase* c, bool add_ref = true) noexcept : c_(c) {
    if (c_ && add_ref) c_->retain();
  }
  CellRef(const CellRef& o) noexcept : c_(o.c_) {
    if (c_) c_->retain();
  }
  CellRef(CellRef&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
  CellRef& operator=(CellRef o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~CellRef() {
    if (c_) c_->release();
  }
  CellBase* get() const noexcept { return c_; }
  CellBase* operator->() const noexcept { return c_; }
  explicit operator bool() const noexcept { return c_ != nullptr; }
  CellBase* detach() noexcept {
    auto* c = c_;
    c_ = nullptr;
    return c;
  }
  friend bool operator==(const CellRef& a, const CellRef& b) noexcept { return a.c_ == b.c_; }

 private:
  CellBase* c_ = nullptr;
};

}  // namespace detail
}  // namespace troupe
