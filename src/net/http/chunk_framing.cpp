// A chunked body's framing, ahead of Beast; see chunk_framing.hpp.

#include "chunk_framing.hpp"

#include "syntax.hpp"

namespace troupe::http::detail {

namespace {

int hex(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool blank(char c) noexcept { return c == ' ' || c == '\t'; }

// chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] ), ext-val
// a token or a quoted-string (RFC 9112 7.1.1, RFC 9110 5.6).
bool extensions_ok(std::string_view s) noexcept {
  std::size_t i = 0;
  auto skip_blanks = [&] {
    while (i < s.size() && blank(s[i])) ++i;
  };
  auto token = [&] {
    const std::size_t start = i;
    while (i < s.size() && is_token(s.substr(i, 1))) ++i;
    return i > start;
  };
  for (;;) {
    const std::size_t before = i;
    skip_blanks();
    if (i == s.size()) return i == before;  // blanks only before a ";"
    if (s[i] != ';') return false;
    ++i;
    skip_blanks();
    if (!token()) return false;
    skip_blanks();
    if (i == s.size() || s[i] != '=') continue;
    ++i;
    skip_blanks();
    if (i < s.size() && s[i] == '"') {
      for (++i;; ++i) {
        if (i == s.size()) return false;
        const auto c = static_cast<unsigned char>(s[i]);
        if (c == '"') break;
        if (c == '\\') {
          if (++i == s.size()) return false;
          const auto q = static_cast<unsigned char>(s[i]);
          if (q != '\t' && (q < 0x20 || q == 0x7f)) return false;
        } else if (c != '\t' && (c < 0x20 || c == 0x7f)) {
          return false;
        }
      }
      ++i;
    } else if (!token()) {
      return false;
    }
  }
}

}  // namespace

std::optional<ChunkFraming::Bad> ChunkFraming::end_size_line() {
  std::size_t i = 0;
  std::uint64_t size = 0;
  while (i < line_.size() && hex(line_[i]) >= 0) {
    if (size >> 60) return Bad{400, "chunk size too large"};
    size = size * 16 + static_cast<std::uint64_t>(hex(line_[i]));
    ++i;
  }
  if (i == 0) return Bad{400, "malformed chunk size"};
  if (!extensions_ok(std::string_view(line_).substr(i))) return Bad{400, "malformed chunk extension"};
  line_.clear();
  if (size > max_body_ - body_) return Bad{413, "body over " + std::to_string(max_body_) + " bytes"};
  body_ += size;
  left_ = size;
  state_ = size == 0 ? State::trailer_line : State::data;
  return std::nullopt;
}

std::size_t ChunkFraming::look(std::string_view bytes, std::optional<Bad>& bad) {
  std::size_t i = 0;
  auto fail = [&](int status, const char* why) {
    bad = Bad{status, why};
    return i;
  };
  while (i < bytes.size() && state_ != State::done) {
    const char c = bytes[i];
    switch (state_) {
      case State::size_line:
        if (cr_) {
          if (c != '\n') return fail(400, "CR without LF in a chunk line");
          cr_ = false;
          bad = end_size_line();
          if (bad) return i;
        } else if (c == '\r') {
          cr_ = true;
        } else if (c == '\n') {
          return fail(400, "a chunk line ends in LF without CR");
        } else {
          if (line_.size() >= max_trailer_) return fail(400, "chunk line too long");
          line_.push_back(c);
        }
        ++i;
        break;
      case State::data: {
        const std::uint64_t n = std::min<std::uint64_t>(left_, bytes.size() - i);
        left_ -= n;
        i += static_cast<std::size_t>(n);
        if (left_ == 0) state_ = State::data_cr;
        break;
      }
      case State::data_cr:
        if (c != '\r') return fail(400, "chunk data longer than its size");
        state_ = State::data_lf;
        ++i;
        break;
      case State::data_lf:
        if (c != '\n') return fail(400, "chunk data not ended by CRLF");
        state_ = State::size_line;
        ++i;
        break;
      case State::trailer_line:
        if (++trailer_ > max_trailer_) return fail(431, "trailer section too large");
        if (cr_) {
          if (c != '\n') return fail(400, "CR without LF in the trailer section");
          cr_ = false;
          if (trailer_line_ == 0) state_ = State::done;  // the empty line: the body's end
          trailer_line_ = 0;
        } else if (c == '\r') {
          cr_ = true;
        } else if (c == '\n') {
          return fail(400, "a trailer line ends in LF without CR");
        } else {
          ++trailer_line_;
        }
        ++i;
        break;
      case State::done:
        break;
    }
  }
  return i;
}

}  // namespace troupe::http::detail
