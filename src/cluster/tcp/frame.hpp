#pragma once
// Frames on a transport connection: the encoders and an incremental decoder.
//
//   u32 length (big-endian) | u8 version | u8 kind | body (length - 2 bytes)
//
//   HELLO  body: u64 incarnation (BE) | u8 n | n bytes node id (1 <= n <= 64)
//   DATA   body: u32 message type (BE) | payload
//   PING   body: empty
//   PONG   body: empty
//
// doc/wire.md is the reference. Everything here is pure: no sockets, no
// clock, no locks; the fuzz target (frame_decoder_fuzz.cpp) drives the
// decoder directly.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "troupe/cluster/transport.hpp"

namespace troupe::cluster::tcp {

enum class FrameKind : std::uint8_t {
  hello = 1,
  data = 2,
  ping = 3,
  pong = 4,
};

std::string_view to_string(FrameKind kind) noexcept;

// HELLO body: incarnation, id length, id.
inline constexpr std::size_t hello_fixed_bytes = 9;
// DATA body: message type.
inline constexpr std::size_t data_fixed_bytes = 4;

// One decoded frame. The views point into the decoder's buffer and stay
// valid until its next prepare() or feed().
struct Frame {
  FrameKind kind = FrameKind::data;
  std::uint32_t type = 0;         // DATA
  std::string_view payload;       // DATA
  std::uint64_t incarnation = 0;  // HELLO
  std::string_view node_id;       // HELLO (its characters are the transport's to check)
  std::size_t wire_bytes = 0;     // the whole frame, length field included
};

// Why a byte stream is not a sequence of frames. Each one is final: the
// connection it came from cannot be resynchronised.
enum class FrameError : std::uint8_t {
  none = 0,
  undersized,    // length below 2
  oversized,     // length above the decoder's max_frame_bytes
  bad_version,   // version byte is not wire_version
  unknown_kind,  // kind byte is not a FrameKind
  short_body,    // body shorter than its kind's fixed part
  bad_body,      // body contradicts its kind (HELLO id length, PING/PONG with bytes)
};

std::string_view to_string(FrameError error) noexcept;

// --- encoders: append one frame to `out` -----------------------------------------

void append_hello(std::string& out, std::uint64_t incarnation, std::string_view node_id);
void append_ping(std::string& out);
void append_pong(std::string& out);
// append_data_frame (transport.hpp) encodes DATA.

// --- decoder -------------------------------------------------------------------

// Turns a byte stream into frames, checking each header as soon as its bytes
// are in (a bad length, version or kind is reported before the body
// arrives). Owns one buffer that is reused: bytes are read into it
// (prepare/commit) or copied in (feed), and frames are views into it, so
// decoding allocates only when a frame needs more room than the buffer has.
// Value type; not thread-safe.
class FrameDecoder {
 public:
  enum class Status { frame, need_more, error };

  explicit FrameDecoder(std::size_t max_frame_bytes, std::size_t initial_capacity = 64u << 10);

  // Writable space at the end of the buffer, at least `min_free` bytes and
  // at least what the frame being decoded still needs. May move buffered
  // bytes, which invalidates every Frame returned before.
  std::span<char> prepare(std::size_t min_free = 4096);
  // Marks `n` bytes of the last prepare() as filled.
  void commit(std::size_t n) noexcept;
  // prepare + copy + commit.
  void feed(std::string_view bytes);

  // The next complete frame into `out`, or need_more, or error (then error()
  // says why; every later call answers error again).
  Status next(Frame& out) noexcept;

  FrameError error() const noexcept { return error_; }
  // A sentence about the error with the offending values, for logs.
  std::string error_message() const;
  // The kind byte of the frame being received once its header is in (before
  // its body), or -1. Lets a reader refuse a frame by kind without waiting
  // for, or making room for, its body.
  int pending_kind() const noexcept;
  // Bytes received and not yet returned as frames.
  std::size_t buffered() const noexcept { return end_ - begin_; }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t max_frame_bytes() const noexcept { return max_frame_; }

 private:
  Status fail(FrameError e, std::uint64_t detail) noexcept;

  std::unique_ptr<char[]> buf_;
  std::size_t capacity_ = 0;
  std::size_t initial_capacity_ = 0;
  std::size_t begin_ = 0;  // first byte not yet returned
  std::size_t end_ = 0;    // one past the last received byte
  std::size_t max_frame_ = 0;
  std::size_t want_ = 0;   // whole size of the frame at begin_, once its length is known
  FrameError error_ = FrameError::none;
  std::uint64_t error_detail_ = 0;  // the length, version or kind that was refused
  std::uint8_t error_kind_ = 0;
};

// The whole size, length field included, of the encoded frame that starts
// at `frame` (at least frame_length_bytes readable there).
std::size_t encoded_frame_size(const char* frame) noexcept;

// Walks `frames` (bytes that should be whole DATA frames, as
// append_data_frame writes them) without copying. True with `count` set if
// they are exactly that, each within `max_frame_bytes`; false with `why`
// set otherwise.
bool count_data_frames(std::string_view frames, std::size_t max_frame_bytes, std::size_t& count,
                       std::string& why);

}  // namespace troupe::cluster::tcp
