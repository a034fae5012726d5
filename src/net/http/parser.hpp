#pragma once
// HTTP/1.1 message parsing and serialisation (RFC 9110, 9112), free of
// sockets and threads, so that the fuzz target (http_parser_fuzz.cpp) runs
// exactly the code the server and client run.
//
// The parsers are incremental over a buffer that only grows: the caller
// keeps the bytes of the message being parsed from its first byte on, hands
// the whole of them to parse() each time more arrive, and drops them only
// once the message is complete (consumed() bytes) or refused. Work done on
// earlier calls is not repeated: the header scan and the chunked decoder
// resume where they stopped, so a message costs O(its size) however it is
// split.
//
// Strictness (each refusal has a reason for the error response): lines end
// in CRLF (a bare LF is refused); no whitespace before a field's colon; no
// line folding; no control characters but HTAB in field values; a
// Content-Length is digits only and, repeated, must agree; a message with
// both Content-Length and Transfer-Encoding is refused (request smuggling);
// only the "chunked" transfer coding is understood.
//
// Thread safety: none; one parser per connection.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/net/http.hpp"

namespace troupe::http::detail {

using Fields = std::vector<std::pair<std::string, std::string>>;

inline constexpr std::size_t kMaxFields = 100;
// A chunk-size line (size and extensions) longer than this is refused.
inline constexpr std::size_t kMaxChunkLine = 4096;
// A chunked body may take at most 2 * max_body + this many bytes on the
// wire: the bound on what a connection buffers for one message, whatever
// the chunk sizes and extensions.
inline constexpr std::size_t kChunkedSlack = 64u << 10;

// ASCII case-insensitive equality.
bool iequals(std::string_view a, std::string_view b) noexcept;
// RFC 9110 token characters (method, field name, transfer coding).
bool is_token(std::string_view s) noexcept;
// The first field of that name, or empty.
std::string_view find_field(const Fields& fields, std::string_view name) noexcept;
// Whether a comma-separated field value lists `token` (case-insensitive),
// e.g. Connection: keep-alive, close.
bool has_token(std::string_view list, std::string_view token) noexcept;

// Percent-decodes `in` into `out`. False (out unspecified) for a '%' not
// followed by two hex digits, or one that decodes to NUL when !allow_nul.
bool percent_decode(std::string_view in, std::string& out, bool plus_is_space, bool allow_nul = false);
// The path of a request target: origin-form "/p?q" gives "/p"; absolute-form
// "http://host:port/p?q" gives "/p" ("/" when it has no path); anything else
// gives nullopt.
std::optional<std::string_view> target_path(std::string_view target) noexcept;

// A refusal: the status the server answers (the client reports the reason
// as a protocol_error) and why.
struct ParseError {
  int status = 400;
  std::string reason;
};

// De-chunks a chunked body (RFC 9112 7.1), resuming where it stopped.
// Chunk extensions and trailer fields are checked and dropped.
class ChunkedDecoder {
 public:
  enum class Status { need_more, done, error };

  // Decodes from data[pos] on, appending chunk data to `body` and advancing
  // `pos` past what it used. A body that would pass max_body, or chunks
  // that take the stream past `wire_end`, is a 413.
  Status decode(std::string_view data, std::size_t& pos, std::string& body, std::size_t max_body,
                std::size_t max_trailer, std::size_t wire_end, ParseError& error);
  void reset() noexcept { *this = ChunkedDecoder(); }

 private:
  enum class State { size_line, data, data_crlf, trailer, done };
  State state_ = State::size_line;
  std::uint64_t remaining_ = 0;  // of the current chunk
  std::size_t trailer_bytes_ = 0;
  std::size_t trailer_fields_ = 0;
};

// Parses requests, one at a time. See the top of the file for the calling
// convention.
class RequestParser {
 public:
  enum class Status { need_more, complete, error };

  RequestParser(std::size_t max_header_bytes, std::size_t max_body_bytes)
      : max_header_(max_header_bytes), max_body_(max_body_bytes) {}

  // `data`: this request's bytes from its first byte on, as received so far.
  Status parse(std::string_view data);

  // After need_more: the header block is in (the body is not).
  bool headers_complete() const noexcept { return phase_ > Phase::headers; }
  // The request asked for "100 Continue" before sending its body.
  bool expects_continue() const noexcept { return expect_continue_; }
  // Whether a request has begun (any byte of it seen, blank lines aside).
  bool started(std::string_view data) const noexcept;

  // After complete: the bytes the request took, whether the connection
  // stays open after its response, and the request itself (which resets
  // the parser for the next one).
  std::size_t consumed() const noexcept { return consumed_; }
  bool keep_alive() const noexcept { return keep_alive_; }
  // An HTTP/1.0 request (its keep-alive must be confirmed in the response).
  bool http10() const noexcept { return http10_; }
  Request take();

  // After error.
  const ParseError& error() const noexcept { return error_; }

  void reset();

 private:
  enum class Phase { headers, length_body, chunked_body, done, failed };
  Status fail(int status, std::string reason);
  Status on_header_block(std::string_view data);

  std::size_t max_header_;
  std::size_t max_body_;
  Phase phase_ = Phase::headers;
  std::size_t scan_ = 0;        // next byte the header scan looks at
  std::size_t line_start_ = 0;  // start of the line being scanned
  std::size_t skip_ = 0;        // blank lines before the request line (RFC 9112 2.2)
  std::size_t body_start_ = 0;
  std::uint64_t content_length_ = 0;
  std::size_t pos_ = 0;  // chunked: next byte to decode
  std::size_t consumed_ = 0;
  bool keep_alive_ = true;
  bool http10_ = false;
  bool expect_continue_ = false;
  Request request_;
  ChunkedDecoder chunked_;
  ParseError error_;
};

// Parses responses, one at a time. See the top of the file for the calling
// convention; an interim 1xx response is skipped (its bytes count in
// consumed()).
class ResponseParser {
 public:
  enum class Status { need_more, complete, error };

  ResponseParser(std::size_t max_header_bytes, std::size_t max_body_bytes)
      : max_header_(max_header_bytes), max_body_(max_body_bytes) {}

  // `head`: the request was a HEAD, so the response has no body whatever it
  // says.
  void expect(bool head) { head_ = head; }
  Status parse(std::string_view data);
  // The stream ended: a close-delimited body is complete; anything else is
  // an error (truncated). Call with everything received.
  Status finish(std::string_view data);

  // Some bytes of a response (a 1xx aside) have arrived.
  bool started() const noexcept { return scan_ > 0 || interim_ > 0; }
  std::size_t consumed() const noexcept { return consumed_; }
  bool keep_alive() const noexcept { return keep_alive_; }
  Response take();
  const ParseError& error() const noexcept { return error_; }
  void reset();

 private:
  enum class Phase { headers, length_body, chunked_body, close_body, done, failed };
  Status fail(std::string reason);
  Status on_header_block(std::string_view data);

  std::size_t max_header_;
  std::size_t max_body_;
  bool head_ = false;
  Phase phase_ = Phase::headers;
  std::size_t interim_ = 0;  // bytes of 1xx responses skipped
  std::size_t scan_ = 0;
  std::size_t line_start_ = 0;
  std::size_t body_start_ = 0;
  std::uint64_t content_length_ = 0;
  std::size_t pos_ = 0;
  std::size_t consumed_ = 0;
  bool keep_alive_ = true;
  Response response_;
  ChunkedDecoder chunked_;
  ParseError error_;
};

// Appends the status line, headers and (unless `head`) body of `r`. Content-Length
// (not for 1xx, 204, 304), Date (when non-empty) and "Connection: close" or
// "Connection: keep-alive" (for an HTTP/1.0 client that asked) are written
// here. False (nothing appended) if a header of `r` could break the framing.
bool serialize_response(const Response& r, bool head, bool close, bool keep_alive_header,
                        std::string_view date, std::string& out);

// Appends a request. Host is `host`; Content-Length is written when there is
// a body or the method usually carries one. False for a method that is not
// a token, a target with spaces or controls, or a header that could break
// the framing.
bool serialize_request(const ClientRequest& r, std::string_view host, std::string& out);

// An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") for a Date header.
std::string http_date(std::int64_t unix_seconds);

}  // namespace troupe::http::detail
