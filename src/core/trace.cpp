// Trace ids (troupe/core/trace.hpp): reading and writing W3C traceparent
// headers, drawing new ids, and the thread's current trace.

#include "troupe/core/trace.hpp"

#include <chrono>
#include <random>
#include <thread>

#include "troupe/core/detail/trace_box.hpp"

namespace troupe {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// A lowercase hex digit's value, or -1 (the specification allows no
// uppercase: "HEXDIGLC").
int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

template <std::size_t N>
bool read_hex(std::string_view hex, std::array<std::uint8_t, N>& out) noexcept {
  if (hex.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    int hi = hex_value(hex[2 * i]);
    int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <std::size_t N>
void write_hex(const std::array<std::uint8_t, N>& in, char* out) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    out[2 * i] = kHex[in[i] >> 4];
    out[2 * i + 1] = kHex[in[i] & 0xf];
  }
}

template <std::size_t N>
bool nonzero(const std::array<std::uint8_t, N>& b) noexcept {
  for (auto x : b)
    if (x) return true;
  return false;
}

// Per-thread generator, seeded once from the system's entropy and the
// thread: ids must not repeat across nodes and restarts.
std::uint64_t next_random() {
  thread_local std::mt19937_64 gen = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(),
                      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()),
                      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()))};
    return std::mt19937_64(seq);
  }();
  return gen();
}

template <std::size_t N>
void fill_random(std::array<std::uint8_t, N>& b) {
  do {
    for (std::size_t i = 0; i < N; i += 8) {
      std::uint64_t r = next_random();
      for (std::size_t k = 0; k < 8 && i + k < N; ++k) b[i + k] = static_cast<std::uint8_t>(r >> (8 * k));
    }
  } while (!nonzero(b));
}

}  // namespace

bool TraceId::valid() const noexcept { return nonzero(bytes); }
void TraceId::to_hex(char* out) const noexcept { write_hex(bytes, out); }
std::string TraceId::hex() const {
  std::string s(32, '0');
  to_hex(s.data());
  return s;
}
std::optional<TraceId> TraceId::from_hex(std::string_view hex) noexcept {
  TraceId t;
  if (!read_hex(hex, t.bytes) || !t.valid()) return std::nullopt;
  return t;
}

bool SpanId::valid() const noexcept { return nonzero(bytes); }
void SpanId::to_hex(char* out) const noexcept { write_hex(bytes, out); }
std::string SpanId::hex() const {
  std::string s(16, '0');
  to_hex(s.data());
  return s;
}
std::optional<SpanId> SpanId::from_hex(std::string_view hex) noexcept {
  SpanId s;
  if (!read_hex(hex, s.bytes) || !s.valid()) return std::nullopt;
  return s;
}

// version "-" trace-id "-" parent-id "-" trace-flags: 2+1+32+1+16+1+2 = 55.
std::optional<TraceContext> TraceContext::parse(std::string_view h) noexcept {
  constexpr std::size_t kLength = 55;
  if (h.size() < kLength) return std::nullopt;
  std::array<std::uint8_t, 1> version{};
  if (!read_hex(h.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  // Version 00 is exactly 55 characters; a later one may carry more
  // fields after another '-'.
  if (version[0] == 0 ? h.size() != kLength : (h.size() > kLength && h[kLength] != '-')) return std::nullopt;
  if (h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  TraceContext c;
  std::array<std::uint8_t, 1> flags{};
  if (!read_hex(h.substr(3, 32), c.trace_id.bytes) || !read_hex(h.substr(36, 16), c.span_id.bytes) ||
      !read_hex(h.substr(53, 2), flags))
    return std::nullopt;
  if (!c.valid()) return std::nullopt;
  c.flags = flags[0];
  return c;
}

TraceContext TraceContext::generate() {
  TraceContext c;
  fill_random(c.trace_id.bytes);
  fill_random(c.span_id.bytes);
  c.flags = 1;
  return c;
}

TraceContext TraceContext::from_header(std::string_view traceparent) {
  if (traceparent.empty()) return generate();
  auto c = parse(traceparent);
  return c ? c->child() : generate();
}

TraceContext TraceContext::child() const {
  TraceContext c = *this;
  fill_random(c.span_id.bytes);
  return c;
}

std::string TraceContext::traceparent() const {
  std::string s = "00-";
  s.resize(55, '-');
  trace_id.to_hex(s.data() + 3);
  span_id.to_hex(s.data() + 36);
  s[53] = kHex[flags >> 4];
  s[54] = kHex[flags & 0xf];
  return s;
}

const TraceContext* current_trace() noexcept {
  auto* b = detail::t_trace;
  return b ? &b->ctx : nullptr;
}

std::string current_trace_id() {
  auto* c = current_trace();
  return c ? c->trace_id.hex() : std::string();
}

TraceScope::TraceScope() noexcept : saved_(detail::t_trace), mine_(nullptr) { detail::t_trace = nullptr; }

TraceScope::TraceScope(const TraceContext& ctx) : saved_(detail::t_trace), mine_(new detail::TraceBox(ctx)) {
  detail::t_trace = mine_;
}

TraceScope::~TraceScope() {
  detail::t_trace = saved_;
  if (mine_) detail::trace_release(mine_);
}

}  // namespace troupe
