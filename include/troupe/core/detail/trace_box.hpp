#pragma once
// How a trace travels with messages (troupe/core/trace.hpp): one shared,
// reference-counted box per trace, a thread-local pointer to the trace of
// the work running on this thread, and the reference that queues keep
// beside work they run later. Every envelope holds a reference to the box
// that was current when it was made (none, outside any trace: one
// thread-local read, and no reference count is touched).
// Not part of the public API: names and layout change without notice.

#include <atomic>
#include <cstdint>
#include <utility>

#include "troupe/core/detail/pool.hpp"
#include "troupe/core/trace.hpp"

namespace troupe::detail {

// One trace, shared by the scope that started it and every message sent
// under it. Freed with its last reference, on whichever thread drops it.
struct TraceBox : Pooled {
  explicit TraceBox(const TraceContext& c) noexcept : ctx(c) {}
  std::atomic<std::uint32_t> refs{1};
  TraceContext ctx;
};

inline void trace_retain(TraceBox* b) noexcept { b->refs.fetch_add(1, std::memory_order_relaxed); }
inline void trace_release(TraceBox* b) noexcept {
  if (b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete b;
}

// The trace of the work running on this thread, borrowed: whoever set it
// (a TraceScope, or the activation running a message that carries it)
// holds a reference until it restores the previous value.
inline thread_local TraceBox* t_trace = nullptr;

// A new reference to the current trace, or nullptr outside any.
inline TraceBox* retain_current_trace() noexcept {
  TraceBox* b = t_trace;
  if (b) [[unlikely]] trace_retain(b);
  return b;
}

// A counted reference to a trace, or to none: what a queue keeps beside
// work it runs later (a command waiting for its entity, a command waiting
// for its shard's owner). Pointer-sized; an empty one costs nothing.
// Thread safety: like a shared_ptr (copies may be used on any thread).
class TraceRef {
 public:
  TraceRef() = default;
  // The trace current on this thread (empty outside any).
  static TraceRef current() noexcept { return TraceRef(retain_current_trace()); }
  static TraceRef make(const TraceContext& c) { return TraceRef(new TraceBox(c)); }
  TraceRef(const TraceRef& o) noexcept : b_(o.b_) {
    if (b_) trace_retain(b_);
  }
  TraceRef(TraceRef&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  TraceRef& operator=(TraceRef o) noexcept {
    std::swap(b_, o.b_);
    return *this;
  }
  ~TraceRef() {
    if (b_) trace_release(b_);
  }
  TraceBox* box() const noexcept { return b_; }
  const TraceContext* get() const noexcept { return b_ ? &b_->ctx : nullptr; }
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  explicit TraceRef(TraceBox* b) noexcept : b_(b) {}
  TraceBox* b_ = nullptr;
};

// Runs what follows under the trace of `b` (under none if null), then
// restores the one before. Borrows: the caller keeps `b` alive meanwhile.
class BorrowedTraceScope {
 public:
  explicit BorrowedTraceScope(TraceBox* b) noexcept : saved_(t_trace) { t_trace = b; }
  explicit BorrowedTraceScope(const TraceRef& r) noexcept : BorrowedTraceScope(r.box()) {}
  ~BorrowedTraceScope() { t_trace = saved_; }
  BorrowedTraceScope(const BorrowedTraceScope&) = delete;
  BorrowedTraceScope& operator=(const BorrowedTraceScope&) = delete;

 private:
  TraceBox* saved_;
};

}  // namespace troupe::detail
