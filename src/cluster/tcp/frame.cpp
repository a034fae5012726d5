#include "frame.hpp"

#include <algorithm>
#include <cstring>

#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {

namespace {

inline void put_u32(char* p, std::uint32_t v) noexcept {
  p[0] = static_cast<char>(v >> 24);
  p[1] = static_cast<char>(v >> 16);
  p[2] = static_cast<char>(v >> 8);
  p[3] = static_cast<char>(v);
}

inline std::uint32_t get_u32(const char* p) noexcept {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (std::uint32_t{u[0]} << 24) | (std::uint32_t{u[1]} << 16) | (std::uint32_t{u[2]} << 8) | u[3];
}

inline std::uint64_t get_u64(const char* p) noexcept {
  return (std::uint64_t{get_u32(p)} << 32) | get_u32(p + 4);
}

// Length field, version, kind.
inline void put_header(char* p, std::size_t length, tcp::FrameKind kind) noexcept {
  put_u32(p, static_cast<std::uint32_t>(length));
  p[4] = static_cast<char>(wire_version);
  p[5] = static_cast<char>(kind);
}

}  // namespace

void append_data_frame(std::string& out, std::uint32_t type, std::string_view payload) {
  char head[data_frame_overhead];
  put_header(head, 2 + tcp::data_fixed_bytes + payload.size(), tcp::FrameKind::data);
  put_u32(head + frame_header_bytes, type);
  out.append(head, sizeof head);
  out.append(payload.data(), payload.size());
}

namespace tcp {

std::string_view to_string(FrameKind kind) noexcept {
  switch (kind) {
    case FrameKind::hello: return "HELLO";
    case FrameKind::data: return "DATA";
    case FrameKind::ping: return "PING";
    case FrameKind::pong: return "PONG";
  }
  return "unknown";
}

std::string_view to_string(FrameError error) noexcept {
  switch (error) {
    case FrameError::none: return "none";
    case FrameError::undersized: return "undersized";
    case FrameError::oversized: return "oversized";
    case FrameError::bad_version: return "bad_version";
    case FrameError::unknown_kind: return "unknown_kind";
    case FrameError::short_body: return "short_body";
    case FrameError::bad_body: return "bad_body";
  }
  return "unknown";
}

void append_hello(std::string& out, std::uint64_t incarnation, std::string_view node_id) {
  char head[frame_header_bytes + hello_fixed_bytes];
  put_header(head, 2 + hello_fixed_bytes + node_id.size(), FrameKind::hello);
  put_u32(head + 6, static_cast<std::uint32_t>(incarnation >> 32));
  put_u32(head + 10, static_cast<std::uint32_t>(incarnation));
  head[14] = static_cast<char>(node_id.size());
  out.append(head, sizeof head);
  out.append(node_id.data(), node_id.size());
}

void append_ping(std::string& out) {
  char head[frame_header_bytes];
  put_header(head, 2, FrameKind::ping);
  out.append(head, sizeof head);
}

void append_pong(std::string& out) {
  char head[frame_header_bytes];
  put_header(head, 2, FrameKind::pong);
  out.append(head, sizeof head);
}

FrameDecoder::FrameDecoder(std::size_t max_frame_bytes, std::size_t initial_capacity)
    : buf_(new char[std::max<std::size_t>(initial_capacity, 64)]),
      capacity_(std::max<std::size_t>(initial_capacity, 64)),
      initial_capacity_(capacity_),
      max_frame_(max_frame_bytes) {}

std::span<char> FrameDecoder::prepare(std::size_t min_free) {
  const std::size_t held = end_ - begin_;
  std::size_t need = std::max<std::size_t>(min_free, 1);
  if (want_ > held) need = std::max(need, want_ - held);
  if (held == 0) {
    begin_ = end_ = 0;
    // A large frame grew the buffer; give the memory back once it is consumed.
    if (capacity_ > 4 * initial_capacity_ && need <= initial_capacity_) {
      buf_.reset(new char[initial_capacity_]);
      capacity_ = initial_capacity_;
    }
  }
  if (capacity_ - end_ < need) {
    if (capacity_ - held >= need) {
      std::memmove(buf_.get(), buf_.get() + begin_, held);
    } else {
      const std::size_t grown = std::max(capacity_ * 2, held + need);
      std::unique_ptr<char[]> bigger(new char[grown]);
      std::memcpy(bigger.get(), buf_.get() + begin_, held);
      buf_ = std::move(bigger);
      capacity_ = grown;
    }
    begin_ = 0;
    end_ = held;
  }
  return {buf_.get() + end_, capacity_ - end_};
}

void FrameDecoder::commit(std::size_t n) noexcept { end_ += std::min(n, capacity_ - end_); }

void FrameDecoder::feed(std::string_view bytes) {
  if (bytes.empty()) return;
  std::span<char> room = prepare(bytes.size());
  std::memcpy(room.data(), bytes.data(), bytes.size());
  commit(bytes.size());
}

FrameDecoder::Status FrameDecoder::fail(FrameError e, std::uint64_t detail) noexcept {
  error_ = e;
  error_detail_ = detail;
  return Status::error;
}

FrameDecoder::Status FrameDecoder::next(Frame& out) noexcept {
  if (error_ != FrameError::none) return Status::error;
  const std::size_t held = end_ - begin_;
  if (held < frame_length_bytes) return Status::need_more;
  const char* p = buf_.get() + begin_;
  const std::uint32_t length = get_u32(p);
  if (length < 2) return fail(FrameError::undersized, length);
  if (length > max_frame_) return fail(FrameError::oversized, length);
  if (held < 5) return Status::need_more;
  const auto version = static_cast<std::uint8_t>(p[4]);
  if (version != wire_version) return fail(FrameError::bad_version, version);
  if (held < frame_header_bytes) return Status::need_more;
  const auto kind = static_cast<std::uint8_t>(p[5]);
  error_kind_ = kind;
  const std::size_t body = length - 2;
  // Checks that need only the header, so a frame that can never be valid is
  // refused before its body is waited for.
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::hello:
      if (body < hello_fixed_bytes + 1) return fail(FrameError::short_body, body);
      if (body > hello_fixed_bytes + max_node_id_length) return fail(FrameError::bad_body, body);
      break;
    case FrameKind::data:
      if (body < data_fixed_bytes) return fail(FrameError::short_body, body);
      break;
    case FrameKind::ping:
    case FrameKind::pong:
      if (body != 0) return fail(FrameError::bad_body, body);
      break;
    default:
      return fail(FrameError::unknown_kind, kind);
  }
  // Only a header that passed every check makes prepare() reserve room for
  // the whole frame.
  want_ = frame_length_bytes + length;
  if (held < want_) return Status::need_more;

  const char* b = p + frame_header_bytes;
  out = Frame{};
  out.kind = static_cast<FrameKind>(kind);
  out.wire_bytes = want_;
  if (out.kind == FrameKind::hello) {
    const std::size_t n = static_cast<unsigned char>(b[8]);
    if (n != body - hello_fixed_bytes) return fail(FrameError::bad_body, body);
    out.incarnation = get_u64(b);
    out.node_id = std::string_view(b + hello_fixed_bytes, n);
  } else if (out.kind == FrameKind::data) {
    out.type = get_u32(b);
    out.payload = std::string_view(b + data_fixed_bytes, body - data_fixed_bytes);
  }
  begin_ += want_;
  want_ = 0;
  return Status::frame;
}

int FrameDecoder::pending_kind() const noexcept {
  if (error_ != FrameError::none || end_ - begin_ < frame_header_bytes) return -1;
  return static_cast<unsigned char>(buf_[begin_ + 5]);
}

std::string FrameDecoder::error_message() const {
  const std::string d = std::to_string(error_detail_);
  const std::string kind(to_string(static_cast<FrameKind>(error_kind_)));
  switch (error_) {
    case FrameError::none: return "no error";
    case FrameError::undersized: return "frame length " + d + " leaves no room for version and kind";
    case FrameError::oversized:
      return "frame length " + d + " exceeds the limit of " + std::to_string(max_frame_) + " bytes";
    case FrameError::bad_version:
      return "frame version " + d + ", expected " + std::to_string(wire_version);
    case FrameError::unknown_kind: return "unknown frame kind " + d;
    case FrameError::short_body:
      return kind + " body of " + d + " bytes is shorter than its fixed part (" +
             std::to_string(error_kind_ == static_cast<std::uint8_t>(FrameKind::hello) ? hello_fixed_bytes + 1
                                                                                       : data_fixed_bytes) +
             " bytes)";
    case FrameError::bad_body:
      if (error_kind_ == static_cast<std::uint8_t>(FrameKind::hello))
        return "HELLO body of " + d + " bytes does not match its node id length";
      return kind + " with a " + d + "-byte body (must be empty)";
  }
  return "unknown error";
}

std::size_t encoded_frame_size(const char* frame) noexcept { return frame_length_bytes + get_u32(frame); }

bool count_data_frames(std::string_view frames, std::size_t max_frame_bytes, std::size_t& count,
                       std::string& why) {
  count = 0;
  std::size_t pos = 0;
  while (pos < frames.size()) {
    const std::size_t left = frames.size() - pos;
    if (left < data_frame_overhead) {
      why = "bytes end inside a frame header at offset " + std::to_string(pos);
      return false;
    }
    const char* p = frames.data() + pos;
    const std::uint32_t length = get_u32(p);
    if (static_cast<std::uint8_t>(p[4]) != wire_version || static_cast<FrameKind>(p[5]) != FrameKind::data ||
        length < 2 + data_fixed_bytes) {
      why = "no DATA frame header at offset " + std::to_string(pos);
      return false;
    }
    if (length > max_frame_bytes) {
      why = "frame length " + std::to_string(length) + " at offset " + std::to_string(pos) +
            " exceeds max_frame_bytes " + std::to_string(max_frame_bytes);
      return false;
    }
    if (left - frame_length_bytes < length) {
      why = "bytes end inside the frame at offset " + std::to_string(pos);
      return false;
    }
    pos += frame_length_bytes + length;
    ++count;
  }
  return true;
}

}  // namespace tcp
}  // namespace troupe::cluster
