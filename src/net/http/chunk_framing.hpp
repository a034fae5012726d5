#pragma once
// Follows a chunked body's framing (RFC 9112 7.1) ahead of Beast's parser:
// each chunk-size line is checked strictly, chunk data and their CRLF are
// counted, and the trailer section is bounded, byte by byte in order. A
// malformed line is refused where it stands, however the bytes arrive:
// Beast 1.74's own reading of chunk extensions depends on how much has
// arrived (a quoted value runs past its line's end when more bytes are
// there), so one body would be read two ways. Internal to src/net/http/.
// Thread safety: none; one per message being read.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::http::detail {

class ChunkFraming {
 public:
  // What look() found wrong: the status a server answers (400, or 413 for
  // a body past its limit, 431 for a trailer section past its limit) and why.
  struct Bad {
    int status = 400;
    std::string reason;
  };

  // `max_body`: the decoded body's limit; `max_trailer`: the trailer
  // section's (and a chunk-size line's).
  ChunkFraming(std::uint64_t max_body, std::size_t max_trailer) : max_body_(max_body), max_trailer_(max_trailer) {}

  // Looks at the body's next bytes, the ones after those already looked
  // at. Returns how many of them belong to the body (fewer than given
  // once it ends), or what is wrong.
  std::size_t look(std::string_view bytes, std::optional<Bad>& bad);

  bool done() const noexcept { return state_ == State::done; }

 private:
  enum class State { size_line, data, data_cr, data_lf, trailer_line, done };
  std::optional<Bad> end_size_line();

  std::uint64_t max_body_;
  std::size_t max_trailer_;
  State state_ = State::size_line;
  std::string line_;         // the chunk-size line being read, without its CRLF
  std::uint64_t left_ = 0;   // of the current chunk's data
  std::uint64_t body_ = 0;   // decoded so far, with the current chunk's size
  std::size_t trailer_ = 0;  // bytes of the trailer section so far
  std::size_t trailer_line_ = 0;  // bytes of the trailer line being read
  bool cr_ = false;          // the previous byte of a line was CR
};

}  // namespace troupe::http::detail
