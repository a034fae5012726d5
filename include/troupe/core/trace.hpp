#pragma once
// Trace ids: what ties together every log line and stored event of one
// request, on every node it reaches (SPEC X2, X4). The format is W3C Trace
// Context (https://www.w3.org/TR/trace-context/): a request that arrives
// with a `traceparent` header keeps its trace id; one without (or with a
// malformed one) gets a new id.
//
//   // where a request enters (troupe's HTTP server does this for you)
//   auto ctx = troupe::TraceContext::from_header(req.header("traceparent"));
//   troupe::TraceScope scope(ctx);
//   region.tell(id, cmd);  // the command carries the trace, to any node
//
// The trace is ambient: while a thread runs inside a TraceScope, or while an
// actor handles a message that carries a trace, every message it sends
// (tell, ask, the continuation of its ask, a command to an entity on
// another node) carries the same trace, the log facade (troupe/core/log.hpp)
// prints its id on every line, and entities store it with their events.
// A message sent outside any trace carries none, at the cost of one
// thread-local read.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe {

namespace detail {
struct TraceBox;
}  // namespace detail

// A trace id: 16 bytes, shown as 32 lowercase hex digits. All zeroes is no
// trace. A plain value: copy it freely; no thread safety of its own.
struct TraceId {
  std::array<std::uint8_t, 16> bytes{};

  bool valid() const noexcept;
  // 32 lowercase hex digits into `out` (no terminating NUL).
  void to_hex(char* out) const noexcept;
  std::string hex() const;
  // From exactly 32 lowercase hex digits, not all zero; nullopt otherwise.
  static std::optional<TraceId> from_hex(std::string_view hex) noexcept;

  friend bool operator==(const TraceId&, const TraceId&) = default;
};

// A span id (traceparent's parent-id): 8 bytes, 16 lowercase hex digits.
// A plain value, like TraceId.
struct SpanId {
  std::array<std::uint8_t, 8> bytes{};

  bool valid() const noexcept;
  void to_hex(char* out) const noexcept;
  std::string hex() const;
  static std::optional<SpanId> from_hex(std::string_view hex) noexcept;

  friend bool operator==(const SpanId&, const SpanId&) = default;
};

// One request's trace context: its trace id, the span that sent it on
// (parent-id) and the trace flags. A plain value (25 bytes, no heap): copy
// it freely. Thread safety: none of its own, like any value.
struct TraceContext {
  TraceId trace_id;
  SpanId span_id;
  std::uint8_t flags = 0;  // trace-flags; bit 0 is "sampled"

  bool valid() const noexcept { return trace_id.valid() && span_id.valid(); }

  // Reads a traceparent header: "00-<32 hex>-<16 hex>-<2 hex>", lowercase.
  // nullopt for anything else: a wrong length or separator, a digit that is
  // not lowercase hex, an all-zero trace or span id, version ff, or version
  // 00 with anything after the flags. A later version (01..fe) is read by
  // its first four fields, as the specification asks.
  static std::optional<TraceContext> parse(std::string_view traceparent) noexcept;
  // A new trace: random trace and span ids, flags 01 (sampled).
  static TraceContext generate();
  // Where a request enters: the trace of `traceparent` with a new span id of
  // this node's own, or a new trace when the header is absent or malformed
  // (a malformed header is never an error to the caller).
  static TraceContext from_header(std::string_view traceparent);
  // The same trace and flags under a new span id.
  TraceContext child() const;
  // "00-<trace id>-<span id>-<flags>", for a traceparent header.
  std::string traceparent() const;

  friend bool operator==(const TraceContext&, const TraceContext&) = default;
};

// The trace of the work running on this thread, or nullptr outside any. The
// pointer is valid until the scope or the message handler it belongs to ends.
const TraceContext* current_trace() noexcept;
// 32 hex digits of the current trace id, or empty.
std::string current_trace_id();

// Makes `ctx` the current trace on this thread for the scope's lifetime,
// then restores the one before. A default-constructed scope clears the
// current trace (work that must not inherit it). Ownership: holds one
// reference to the shared trace that messages sent meanwhile also hold.
// Thread safety: a scope belongs to the thread that made it; nest them like
// any RAII guard, never destroy one on another thread.
class TraceScope {
 public:
  TraceScope() noexcept;
  explicit TraceScope(const TraceContext& ctx);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  detail::TraceBox* saved_;
  detail::TraceBox* mine_;
};

}  // namespace troupe
