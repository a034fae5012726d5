// HTTP/1.1 parsing and serialisation; see parser.hpp for the contract.

#include "parser.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <limits>

namespace troupe::http::detail {

namespace {

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_tchar(unsigned char c) noexcept {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool is_ows(char c) noexcept { return c == ' ' || c == '\t'; }

// A field value's octets: HTAB, SP, visible ASCII, obs-text.
bool is_field_value_char(unsigned char c) noexcept { return c == '\t' || (c >= 0x20 && c != 0x7f); }

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

// A request target's octets: visible ASCII.
bool is_target_char(unsigned char c) noexcept { return c > 0x20 && c < 0x7f; }

enum class Scan { need_more, done, bare_lf };

// Looks for the empty line that ends a header block, resuming at `scan`;
// `line_start` is where the line being scanned began.
Scan scan_header_end(std::string_view data, std::size_t& scan, std::size_t& line_start) noexcept {
  for (;;) {
    const std::size_t nl = data.find('\n', scan);
    if (nl == std::string_view::npos) {
      scan = data.size();
      return Scan::need_more;
    }
    if (nl == line_start || data[nl - 1] != '\r') return Scan::bare_lf;
    scan = nl + 1;
    if (nl - 1 == line_start) return Scan::done;
    line_start = nl + 1;
  }
}

// Splits a header block (lines ending in CRLF, without the empty line that
// ends it) into fields. Returns the status of a refusal, or 0.
int parse_fields(std::string_view block, Fields& out, std::string& why) {
  while (!block.empty()) {
    const std::size_t eol = block.find("\r\n");
    const std::string_view line = block.substr(0, eol);
    block.remove_prefix(eol == std::string_view::npos ? block.size() : eol + 2);
    if (line.empty()) {
      why = "an empty header line";
      return 400;
    }
    if (is_ows(line.front())) {
      why = "obsolete line folding (a header line starting with whitespace)";
      return 400;
    }
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      why = "a header line without a colon";
      return 400;
    }
    const std::string_view name = line.substr(0, colon);
    if (!is_token(name)) {
      why = "invalid header name (whitespace before the colon or a character outside token)";
      return 400;
    }
    const std::string_view value = trim_ows(line.substr(colon + 1));
    for (unsigned char c : value) {
      if (!is_field_value_char(c)) {
        why = "a control character in the value of header '" + std::string(name) + "'";
        return 400;
      }
    }
    if (out.size() >= kMaxFields) {
      why = "more than " + std::to_string(kMaxFields) + " header fields";
      return 431;
    }
    out.emplace_back(std::string(name), std::string(value));
  }
  return 0;
}

// Every Content-Length, each possibly a list ("5, 5"): digits only, all equal.
// nullopt and `why` when malformed; a `present` false when there is none.
std::optional<std::uint64_t> content_length(const Fields& fields, bool& present, std::string& why) {
  present = false;
  std::optional<std::uint64_t> value;
  for (const auto& [name, v] : fields) {
    if (!iequals(name, "content-length")) continue;
    present = true;
    std::string_view list = v;
    for (;;) {
      const std::size_t comma = list.find(',');
      const std::string_view item = trim_ows(list.substr(0, comma));
      std::uint64_t n = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size() || item.front() == '+' ||
          item.front() == '-') {
        why = ec == std::errc::result_out_of_range ? "Content-Length overflows"
                                                   : "Content-Length is not a decimal number";
        return std::nullopt;
      }
      if (value && *value != n) {
        why = "Content-Length values disagree";
        return std::nullopt;
      }
      value = n;
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
  }
  if (!present) return std::uint64_t{0};
  return value;
}

// The transfer codings of every Transfer-Encoding field, in order.
std::vector<std::string_view> transfer_codings(const Fields& fields, bool& present) {
  present = false;
  std::vector<std::string_view> codings;
  for (const auto& [name, v] : fields) {
    if (!iequals(name, "transfer-encoding")) continue;
    present = true;
    std::string_view list = v;
    for (;;) {
      const std::size_t comma = list.find(',');
      std::string_view item = trim_ows(list.substr(0, comma));
      // Parameters (";q=...") do not change which coding it is.
      item = trim_ows(item.substr(0, item.find(';')));
      codings.push_back(item);
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
  }
  return codings;
}

bool connection_has(const Fields& fields, std::string_view token) noexcept {
  for (const auto& [name, v] : fields)
    if (iequals(name, "connection") && has_token(v, token)) return true;
  return false;
}

// "HTTP/" DIGIT "." DIGIT. False if it is not that shape.
bool parse_version(std::string_view v, int& major, int& minor) noexcept {
  if (v.size() != 8 || v.substr(0, 5) != "HTTP/" || v[6] != '.') return false;
  if (v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9') return false;
  major = v[5] - '0';
  minor = v[7] - '0';
  return true;
}

// A header we write ourselves, or one that changes the framing: refused in
// a handler's or a caller's extra headers.
bool reserved_field(std::string_view name) noexcept {
  return iequals(name, "content-length") || iequals(name, "transfer-encoding") || iequals(name, "connection");
}

bool valid_field(std::string_view name, std::string_view value) noexcept {
  if (!is_token(name)) return false;
  return std::all_of(value.begin(), value.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u != '\r' && u != '\n' && u != 0;
  });
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

bool status_has_body(int status) noexcept { return status >= 200 && status != 204 && status != 304; }

}  // namespace

// --- small helpers ------------------------------------------------------------------

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

std::string_view find_field(const Fields& fields, std::string_view name) noexcept {
  for (const auto& [n, v] : fields)
    if (iequals(n, name)) return v;
  return {};
}

bool has_token(std::string_view list, std::string_view token) noexcept {
  for (;;) {
    const std::size_t comma = list.find(',');
    if (iequals(trim_ows(list.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) return false;
    list.remove_prefix(comma + 1);
  }
}

bool percent_decode(std::string_view in, std::string& out, bool plus_is_space, bool allow_nul) {
  out.clear();
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (in.size() - i < 3) return false;
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      const int v = hi * 16 + lo;
      if (v == 0 && !allow_nul) return false;
      out.push_back(static_cast<char>(v));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return true;
}

std::optional<std::string_view> target_path(std::string_view target) noexcept {
  if (!target.empty() && target.front() == '/') return target.substr(0, target.find('?'));
  std::size_t authority = 0;
  if (target.size() >= 7 && iequals(target.substr(0, 7), "http://"))
    authority = 7;
  else if (target.size() >= 8 && iequals(target.substr(0, 8), "https://"))
    authority = 8;
  if (authority == 0) return std::nullopt;
  const std::size_t end = target.find_first_of("/?", authority);
  if (end == authority) return std::nullopt;  // no host
  if (end == std::string_view::npos || target[end] == '?') return std::string_view("/");
  return target.substr(end, target.find('?', end) - end);
}

std::string http_date(std::int64_t unix_seconds) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday % 7], tm.tm_mday,
                kMonths[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

// --- chunked ----------------------------------------------------------------------

ChunkedDecoder::Status ChunkedDecoder::decode(std::string_view data, std::size_t& pos, std::string& body,
                                              std::size_t max_body, std::size_t max_trailer,
                                              std::size_t wire_end, ParseError& error) {
  auto fail = [&](int status, std::string why) {
    error = ParseError{status, std::move(why)};
    return Status::error;
  };
  // The wire bound is checked after every step and before every wait, so
  // the answer does not depend on how the stream is split.
  auto past_wire_end = [&] { return pos > wire_end && state_ != State::done; };
  auto too_long = [&] {
    return fail(413, "chunked body takes too many bytes on the wire (over twice the body limit plus 64 KiB)");
  };
  auto more = [&] { return past_wire_end() ? too_long() : Status::need_more; };
  for (;;) {
    if (past_wire_end()) return too_long();
    switch (state_) {
      case State::size_line: {
        const std::size_t nl = data.find('\n', pos);
        if (nl == std::string_view::npos) {
          if (data.size() - pos > kMaxChunkLine) return fail(400, "chunk size line too long");
          return more();
        }
        if (nl - pos > kMaxChunkLine) return fail(400, "chunk size line too long");
        if (nl == pos || data[nl - 1] != '\r') return fail(400, "chunk size line does not end in CRLF");
        const std::string_view line = data.substr(pos, nl - 1 - pos);
        std::uint64_t size = 0;
        std::size_t i = 0;
        for (; i < line.size(); ++i) {
          const int v = hex_value(line[i]);
          if (v < 0) break;
          if (size > (std::numeric_limits<std::uint64_t>::max() >> 4))
            return fail(400, "chunk size overflows");
          size = size * 16 + static_cast<std::uint64_t>(v);
        }
        if (i == 0) return fail(400, "chunk size is not hexadecimal");
        std::string_view ext = line.substr(i);
        while (!ext.empty() && is_ows(ext.front())) ext.remove_prefix(1);
        if (!ext.empty()) {
          if (ext.front() != ';') return fail(400, "malformed chunk size line");
          for (unsigned char c : ext)
            if (!is_field_value_char(c)) return fail(400, "a control character in a chunk extension");
        }
        pos = nl + 1;
        if (size == 0) {
          state_ = State::trailer;
        } else {
          if (body.size() > max_body || size > max_body - body.size())
            return fail(413, "chunked body larger than " + std::to_string(max_body) + " bytes");
          remaining_ = size;
          state_ = State::data;
        }
        break;
      }
      case State::data: {
        const std::size_t avail = data.size() - pos;
        if (avail == 0) return more();
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(avail, remaining_));
        body.append(data.substr(pos, take));
        pos += take;
        remaining_ -= take;
        if (remaining_ != 0) return more();
        state_ = State::data_crlf;
        break;
      }
      case State::data_crlf:
        if (data.size() - pos < 2) {
          if (data.size() > pos && data[pos] != '\r') return fail(400, "chunk data not followed by CRLF");
          return more();
        }
        if (data[pos] != '\r' || data[pos + 1] != '\n') return fail(400, "chunk data not followed by CRLF");
        pos += 2;
        state_ = State::size_line;
        break;
      case State::trailer: {
        const std::size_t nl = data.find('\n', pos);
        if (nl == std::string_view::npos) {
          if (trailer_bytes_ + (data.size() - pos) > max_trailer)
            return fail(431, "trailer section too large");
          return more();
        }
        // In the order a stream arriving byte by byte would meet them.
        if (trailer_bytes_ + (nl - pos) > max_trailer) return fail(431, "trailer section too large");
        if (nl == pos || data[nl - 1] != '\r') return fail(400, "trailer line does not end in CRLF");
        trailer_bytes_ += nl + 1 - pos;
        if (trailer_bytes_ > max_trailer) return fail(431, "trailer section too large");
        const std::string_view line = data.substr(pos, nl - 1 - pos);
        pos = nl + 1;
        if (line.empty()) {
          state_ = State::done;
          return Status::done;
        }
        Fields ignored;
        std::string why;
        const std::string block = std::string(line) + "\r\n";
        if (const int st = parse_fields(block, ignored, why); st != 0) return fail(st, "trailer: " + why);
        if (++trailer_fields_ > kMaxFields)
          return fail(431, "more than " + std::to_string(kMaxFields) + " trailer fields");
        break;
      }
      case State::done:
        return Status::done;
    }
  }
}

// --- requests ---------------------------------------------------------------------

RequestParser::Status RequestParser::fail(int status, std::string reason) {
  phase_ = Phase::failed;
  error_ = ParseError{status, std::move(reason)};
  return Status::error;
}

bool RequestParser::started(std::string_view data) const noexcept {
  return phase_ != Phase::headers || data.size() > skip_;
}

void RequestParser::reset() {
  phase_ = Phase::headers;
  scan_ = line_start_ = skip_ = body_start_ = pos_ = consumed_ = 0;
  content_length_ = 0;
  keep_alive_ = true;
  http10_ = false;
  expect_continue_ = false;
  request_ = Request{};
  chunked_.reset();
  error_ = ParseError{};
}

Request RequestParser::take() {
  Request r = std::move(request_);
  reset();
  return r;
}

RequestParser::Status RequestParser::parse(std::string_view data) {
  switch (phase_) {
    case Phase::failed:
      return Status::error;
    case Phase::done:
      return Status::complete;
    case Phase::headers: {
      if (scan_ == 0) {
        // Blank lines before a request line are skipped (RFC 9112 2.2), as
        // far as the header limit.
        while (data.size() - skip_ >= 2 && data[skip_] == '\r' && data[skip_ + 1] == '\n') {
          skip_ += 2;
          if (skip_ > max_header_) return fail(400, "too many blank lines before the request line");
        }
        if (data.size() == skip_ || (data.size() - skip_ == 1 && data[skip_] == '\r'))
          return Status::need_more;
        if (data[skip_] == '\n') return fail(400, "a line ends in a bare LF (CRLF required)");
        scan_ = line_start_ = skip_;
      }
      // The block must end within max_header_ bytes: the scan looks no
      // further, so a stream gets the same answer however it is split.
      const std::size_t limit = skip_ + max_header_;
      switch (scan_header_end(data.substr(0, std::min(data.size(), limit)), scan_, line_start_)) {
        case Scan::bare_lf:
          return fail(400, "a line ends in a bare LF (CRLF required)");
        case Scan::need_more:
          if (data.size() > limit) {
            if (line_start_ == skip_)
              return fail(414, "request line longer than " + std::to_string(max_header_) + " bytes");
            return fail(431, "header block larger than " + std::to_string(max_header_) + " bytes");
          }
          return Status::need_more;
        case Scan::done:
          break;
      }
      if (const Status st = on_header_block(data); st != Status::need_more) return st;
      [[fallthrough]];
    }
    case Phase::length_body:
    case Phase::chunked_body:
      break;
  }
  if (phase_ == Phase::length_body) {
    if (data.size() - body_start_ < content_length_) return Status::need_more;
    request_.body.assign(data.substr(body_start_, static_cast<std::size_t>(content_length_)));
    consumed_ = body_start_ + static_cast<std::size_t>(content_length_);
    phase_ = Phase::done;
    return Status::complete;
  }
  // chunked
  const ChunkedDecoder::Status chunk = chunked_.decode(data, pos_, request_.body, max_body_, max_header_,
                                                       body_start_ + 2 * max_body_ + kChunkedSlack, error_);
  if (chunk == ChunkedDecoder::Status::error) {
    phase_ = Phase::failed;
    return Status::error;
  }
  if (chunk == ChunkedDecoder::Status::need_more) return Status::need_more;
  consumed_ = pos_;
  phase_ = Phase::done;
  return Status::complete;
}

// The header block data[skip_, scan_) is in: the request line, the fields
// and what they mean for the body.
RequestParser::Status RequestParser::on_header_block(std::string_view data) {
  const std::string_view block = data.substr(skip_, scan_ - skip_ - 2);  // without the final CRLF
  const std::size_t eol = block.find("\r\n");
  const std::string_view line = block.substr(0, eol);

  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line (expected 'METHOD target HTTP/1.1')");
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) return fail(400, "malformed request line: the method is not a token");
  if (target.empty()) return fail(400, "malformed request line: empty request target");
  for (unsigned char c : target)
    if (!is_target_char(c))
      return fail(400, "the request target holds a character that must be percent-encoded");
  int major = 0;
  int minor = 0;
  if (!parse_version(version, major, minor))
    return fail(400, "malformed HTTP version '" + std::string(version.substr(0, 16)) + "'");
  if (major != 1)
    return fail(505, "HTTP version " + std::string(version) + " is not supported (HTTP/1.1 is)");
  const std::optional<std::string_view> raw_path = target_path(target);
  if (!raw_path) return fail(400, "the request target must be a path ('/...') or an absolute http URL");

  request_.method.assign(method);
  request_.target.assign(target);
  if (!percent_decode(*raw_path, request_.path, false))
    return fail(400, "malformed percent-encoding in the path (or an encoded NUL)");
  const std::size_t q = target.find('?');
  if (q != std::string_view::npos) request_.query.assign(target.substr(q + 1));

  std::string why;
  if (eol != std::string_view::npos) {
    if (const int st = parse_fields(block.substr(eol + 2), request_.headers, why); st != 0)
      return fail(st, why);
  }
  const Fields& fields = request_.headers;

  std::size_t hosts = 0;
  for (const auto& [n, v] : fields) hosts += iequals(n, "host") ? 1 : 0;
  if (hosts > 1) return fail(400, "more than one Host header");
  if (minor >= 1 && hosts == 0) return fail(400, "an HTTP/1.1 request without a Host header");

  http10_ = minor == 0;
  keep_alive_ = minor >= 1 ? !connection_has(fields, "close")
                           : connection_has(fields, "keep-alive") && !connection_has(fields, "close");

  bool has_te = false;
  const std::vector<std::string_view> codings = transfer_codings(fields, has_te);
  bool has_cl = false;
  const std::optional<std::uint64_t> cl = content_length(fields, has_cl, why);
  if (has_te) {
    if (has_cl) return fail(400, "both Transfer-Encoding and Content-Length");
    if (minor == 0) return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (codings.empty() || !iequals(codings.back(), "chunked"))
      return fail(400, "Transfer-Encoding whose final coding is not chunked");
    if (codings.size() > 1) {
      // Chunked applied twice is malformed; any other coding is one we do
      // not implement.
      for (std::size_t i = 0; i + 1 < codings.size(); ++i)
        if (iequals(codings[i], "chunked")) return fail(400, "chunked applied more than once");
      return fail(501, "transfer coding '" + std::string(codings.front().substr(0, 32)) +
                           "' is not supported (only chunked is)");
    }
  } else if (!cl) {
    return fail(400, why);
  }

  const bool has_expect =
      std::any_of(fields.begin(), fields.end(), [](const auto& f) { return iequals(f.first, "expect"); });
  // An HTTP/1.0 client cannot expect anything (RFC 9110 10.1.1).
  if (has_expect && minor >= 1) {
    const std::string_view expect = find_field(fields, "expect");
    if (!iequals(expect, "100-continue"))
      return fail(
          417, "Expect '" + std::string(expect.substr(0, 32)) + "' is not supported (only 100-continue is)");
    expect_continue_ = true;
  }

  body_start_ = scan_;
  if (has_te) {
    pos_ = body_start_;
    phase_ = Phase::chunked_body;
    return Status::need_more;
  }
  if (*cl > max_body_)
    return fail(413, "body of " + std::to_string(*cl) + " bytes is larger than " + std::to_string(max_body_));
  content_length_ = *cl;
  if (content_length_ == 0) {
    // No body: nothing to continue for.
    expect_continue_ = false;
    consumed_ = body_start_;
    phase_ = Phase::done;
    return Status::complete;
  }
  phase_ = Phase::length_body;
  return Status::need_more;
}

// --- responses --------------------------------------------------------------------

ResponseParser::Status ResponseParser::fail(std::string reason) {
  phase_ = Phase::failed;
  error_ = ParseError{502, std::move(reason)};
  return Status::error;
}

void ResponseParser::reset() {
  head_ = false;
  phase_ = Phase::headers;
  interim_ = scan_ = line_start_ = body_start_ = pos_ = consumed_ = 0;
  content_length_ = 0;
  keep_alive_ = true;
  response_ = Response{};
  chunked_.reset();
  error_ = ParseError{};
}

Response ResponseParser::take() {
  Response r = std::move(response_);
  reset();
  return r;
}

ResponseParser::Status ResponseParser::parse(std::string_view data) {
  for (;;) {
    switch (phase_) {
      case Phase::failed:
        return Status::error;
      case Phase::done:
        return Status::complete;
      case Phase::close_body:
        if (data.size() - body_start_ > max_body_)
          return fail("response body larger than " + std::to_string(max_body_) + " bytes");
        return Status::need_more;
      case Phase::length_body:
        if (data.size() - body_start_ < content_length_) return Status::need_more;
        response_.body.assign(data.substr(body_start_, static_cast<std::size_t>(content_length_)));
        consumed_ = body_start_ + static_cast<std::size_t>(content_length_);
        phase_ = Phase::done;
        return Status::complete;
      case Phase::chunked_body: {
        const ChunkedDecoder::Status chunk =
            chunked_.decode(data, pos_, response_.body, max_body_, max_header_,
                            body_start_ + 2 * max_body_ + kChunkedSlack, error_);
        if (chunk == ChunkedDecoder::Status::error) return fail("malformed chunked body: " + error_.reason);
        if (chunk == ChunkedDecoder::Status::need_more) return Status::need_more;
      }
        consumed_ = pos_;
        phase_ = Phase::done;
        return Status::complete;
      case Phase::headers:
        if (scan_ == 0) scan_ = line_start_ = interim_;
        {
          const std::size_t limit = interim_ + max_header_;
          switch (scan_header_end(data.substr(0, std::min(data.size(), limit)), scan_, line_start_)) {
            case Scan::bare_lf:
              return fail("a line ends in a bare LF");
            case Scan::need_more:
              if (data.size() > limit)
                return fail("response header block larger than " + std::to_string(max_header_) + " bytes");
              return Status::need_more;
            case Scan::done:
              break;
          }
        }
        if (const Status st = on_header_block(data); st == Status::error) return st;
        break;  // body phase, or headers again after a 1xx
    }
  }
}

ResponseParser::Status ResponseParser::on_header_block(std::string_view data) {
  const std::string_view block = data.substr(interim_, scan_ - interim_ - 2);
  const std::size_t eol = block.find("\r\n");
  const std::string_view line = block.substr(0, eol);
  // HTTP-version SP status-code SP [reason-phrase]; the second SP is
  // optional here, as some servers leave it out with an empty reason.
  int major = 0;
  int minor = 0;
  if (line.size() < 12 || !parse_version(line.substr(0, 8), major, minor) || major != 1 || line[8] != ' ')
    return fail("malformed status line");
  int status = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return fail("malformed status code");
    status = status * 10 + (line[i] - '0');
  }
  if (status < 100 || (line.size() > 12 && line[12] != ' ')) return fail("malformed status line");
  for (unsigned char c : line.substr(12))
    if (!is_field_value_char(c)) return fail("a control character in the reason phrase");

  Fields fields;
  std::string why;
  if (eol != std::string_view::npos) {
    if (parse_fields(block.substr(eol + 2), fields, why) != 0) return fail(why);
  }
  if (status < 200) {
    if (status == 101) return fail("101 Switching Protocols: no upgrade was asked for");
    interim_ = scan_;  // an interim response: the real one follows
    scan_ = 0;
    return Status::need_more;
  }
  response_.status = status;
  response_.content_type = std::string(find_field(fields, "content-type"));
  keep_alive_ = minor >= 1 ? !connection_has(fields, "close")
                           : connection_has(fields, "keep-alive") && !connection_has(fields, "close");
  bool has_te = false;
  const std::vector<std::string_view> codings = transfer_codings(fields, has_te);
  bool has_cl = false;
  const std::optional<std::uint64_t> cl = content_length(fields, has_cl, why);
  response_.headers = std::move(fields);
  body_start_ = scan_;
  if (head_ || !status_has_body(status)) {
    consumed_ = body_start_;
    phase_ = Phase::done;
    return Status::complete;
  }
  if (has_te) {
    // Transfer-Encoding overrides Content-Length (RFC 9112 6.3); a final
    // coding other than chunked runs to the connection's end.
    if (!codings.empty() && iequals(codings.back(), "chunked")) {
      if (codings.size() > 1)
        return fail("transfer coding '" + std::string(codings.front()) + "' is not supported");
      pos_ = body_start_;
      phase_ = Phase::chunked_body;
    } else {
      keep_alive_ = false;
      phase_ = Phase::close_body;
    }
    return Status::need_more;
  }
  if (has_cl) {
    if (!cl) return fail(why);
    if (*cl > max_body_)
      return fail("response body of " + std::to_string(*cl) + " bytes is larger than " +
                  std::to_string(max_body_));
    content_length_ = *cl;
    phase_ = Phase::length_body;
    return Status::need_more;
  }
  keep_alive_ = false;
  phase_ = Phase::close_body;
  return Status::need_more;
}

ResponseParser::Status ResponseParser::finish(std::string_view data) {
  if (const Status st = parse(data); st != Status::need_more) return st;
  if (phase_ == Phase::close_body) {
    response_.body.assign(data.substr(body_start_));
    consumed_ = data.size();
    keep_alive_ = false;
    phase_ = Phase::done;
    return Status::complete;
  }
  if (data.size() == 0 && interim_ == 0) return fail("the connection closed before a response");
  return fail("the connection closed inside a response");
}

// --- serialisation ----------------------------------------------------------------

bool serialize_response(const Response& r, bool head, bool close, bool keep_alive_header,
                        std::string_view date, std::string& out) {
  if (r.status < 100 || r.status > 999) return false;
  if (!r.content_type.empty() && !valid_field("Content-Type", r.content_type)) return false;
  for (const auto& [n, v] : r.headers)
    if (!valid_field(n, v) || reserved_field(n)) return false;
  const bool body = status_has_body(r.status);
  const std::string_view reason = reason_phrase(r.status);
  out.reserve(out.size() + 160 + reason.size() + r.content_type.size() + (body && !head ? r.body.size() : 0));
  out.append("HTTP/1.1 ");
  append_uint(out, static_cast<std::uint64_t>(r.status));
  out.push_back(' ');
  out.append(reason);
  out.append("\r\n");
  if (!date.empty()) {
    out.append("Date: ");
    out.append(date);
    out.append("\r\n");
  }
  if (!r.content_type.empty() && body) {
    out.append("Content-Type: ");
    out.append(r.content_type);
    out.append("\r\n");
  }
  if (body) {
    out.append("Content-Length: ");
    append_uint(out, r.body.size());
    out.append("\r\n");
  }
  if (close)
    out.append("Connection: close\r\n");
  else if (keep_alive_header)
    out.append("Connection: keep-alive\r\n");
  for (const auto& [n, v] : r.headers) {
    out.append(n);
    out.append(": ");
    out.append(v);
    out.append("\r\n");
  }
  out.append("\r\n");
  if (body && !head) out.append(r.body);
  return true;
}

bool serialize_request(const ClientRequest& r, std::string_view host, std::string& out) {
  if (!is_token(r.method) || r.target.empty()) return false;
  for (unsigned char c : r.target)
    if (!is_target_char(c)) return false;
  if (!r.content_type.empty() && !valid_field("Content-Type", r.content_type)) return false;
  for (const auto& [n, v] : r.headers)
    if (!valid_field(n, v) || iequals(n, "host") || iequals(n, "content-length") ||
        iequals(n, "transfer-encoding"))
      return false;
  out.reserve(out.size() + 96 + r.method.size() + r.target.size() + host.size() + r.body.size());
  out.append(r.method);
  out.push_back(' ');
  out.append(r.target);
  out.append(" HTTP/1.1\r\nHost: ");
  out.append(host);
  out.append("\r\n");
  if (!r.content_type.empty()) {
    out.append("Content-Type: ");
    out.append(r.content_type);
    out.append("\r\n");
  }
  if (!r.body.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH") {
    out.append("Content-Length: ");
    append_uint(out, r.body.size());
    out.append("\r\n");
  }
  for (const auto& [n, v] : r.headers) {
    out.append(n);
    out.append(": ");
    out.append(v);
    out.append("\r\n");
  }
  out.append("\r\n");
  out.append(r.body);
  return true;
}

}  // namespace troupe::http::detail
