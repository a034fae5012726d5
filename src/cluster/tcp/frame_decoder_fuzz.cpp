// libFuzzer target for the transport's FrameDecoder (scripts/fuzz runs it).
//
// The input is a byte stream as a peer could send it. It is decoded three
// times: whole, one byte at a time, and in pseudo-random chunks (sizes drawn
// from a generator seeded by the input, through both feed() and
// prepare()/commit(), from a tiny starting buffer so that compaction and
// growth run). Beyond "no crash, no undefined behaviour, no leak" under
// ASan/UBSan, it checks:
//   - the three decodings agree: same frames, same error, whatever the
//     split of the stream;
//   - decoding loses nothing: the frames re-encoded are exactly the bytes
//     they were decoded from;
//   - no frame is longer than the limit, and every error has a message.
// The limit itself comes from the last input byte (the first is the top
// byte of a length, nearly always 0), between the largest HELLO and about
// 16 KiB, so both small and large limits are explored.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "frame.hpp"

namespace {

using troupe::cluster::append_data_frame;
using troupe::cluster::frame_length_bytes;
using troupe::cluster::tcp::Frame;
using troupe::cluster::tcp::FrameDecoder;
using troupe::cluster::tcp::FrameError;
using troupe::cluster::tcp::FrameKind;
using Status = FrameDecoder::Status;

void check(bool ok) {
  if (!ok) std::abort();
}

struct Outcome {
  std::string reencoded;  // every frame decoded, encoded again, in order
  std::size_t frames = 0;
  FrameError error = FrameError::none;
  bool operator==(const Outcome&) const = default;
};

void reencode(const Frame& f, std::size_t max_frame, std::string& out) {
  check(f.wire_bytes >= frame_length_bytes + 2 && f.wire_bytes <= frame_length_bytes + max_frame);
  const std::size_t before = out.size();
  switch (f.kind) {
    case FrameKind::hello:
      check(!f.node_id.empty() && f.node_id.size() <= 64);
      troupe::cluster::tcp::append_hello(out, f.incarnation, f.node_id);
      break;
    case FrameKind::data:
      append_data_frame(out, f.type, f.payload);
      break;
    case FrameKind::ping:
      troupe::cluster::tcp::append_ping(out);
      break;
    case FrameKind::pong:
      troupe::cluster::tcp::append_pong(out);
      break;
  }
  check(out.size() - before == f.wire_bytes);
}

// Decodes `in` handed over in pieces of next_chunk() bytes.
template <class Chunks>
Outcome decode(std::string_view in, std::size_t max_frame, Chunks&& next_chunk) {
  FrameDecoder d(max_frame, 64);
  Outcome out;
  std::size_t at = 0;
  bool copy = false;
  for (;;) {
    Frame f;
    Status st;
    while ((st = d.next(f)) == Status::frame) {
      reencode(f, max_frame, out.reencoded);
      ++out.frames;
    }
    if (st == Status::error) {
      out.error = d.error();
      check(out.error != FrameError::none);
      check(!d.error_message().empty());
      check(d.next(f) == Status::error);  // final
      break;
    }
    (void)d.pending_kind();
    if (at == in.size()) break;
    const std::size_t n = std::min(next_chunk(), in.size() - at);
    copy = !copy;
    if (copy) {
      d.feed(in.substr(at, n));
    } else {
      auto room = d.prepare(n);
      check(room.size() >= n);
      std::memcpy(room.data(), in.data() + at, n);
      d.commit(n);
    }
    at += n;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t max_frame = 75 + (size > 0 ? data[size - 1] : 0) * 64u;

  const Outcome whole = decode(in, max_frame, [&] { return in.size(); });
  const Outcome bytewise = decode(in, max_frame, [] { return std::size_t{1}; });
  std::uint64_t state = 0xcbf29ce484222325ull;  // FNV-1a of the input seeds the chunk sizes
  for (std::uint8_t b : in) state = (state ^ b) * 0x100000001b3ull;
  const Outcome chunked = decode(in, max_frame, [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return std::size_t{1} + static_cast<std::size_t>(state % (std::size_t{1} << (state >> 60)));
  });

  check(whole == bytewise);
  check(whole == chunked);
  // Lossless: the frames are exactly the bytes they came from.
  check(whole.reencoded.size() <= in.size());
  check(std::memcmp(whole.reencoded.data(), in.data(), whole.reencoded.size()) == 0);
  return 0;
}
