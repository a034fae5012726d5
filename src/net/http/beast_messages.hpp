#pragma once
// What troupe makes of the messages Boost.Beast parses, and what it gives
// Beast to write: the server's checks of a request (each refusal a status
// and a reason), the conversions to and from troupe's Request and Response
// values, and the client's request bytes. Free of sockets and threads, so
// that the fuzz target (http_parser_fuzz.cpp) runs exactly what the server
// and the client run. Internal to src/net/http/.
// Thread safety: pure functions over values; any thread.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "beast_headers.hpp"
#include "chunk_framing.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http::detail {

// A request the server will not hand to a handler: the status it answers
// (then it closes the connection) and why.
struct Refusal {
  int status = 400;
  std::string reason;
};

// --- server side ---------------------------------------------------------------------

// One message being read: Beast's parser, and how far troupe has looked
// for the end of its header block. Beast is handed a header block only once
// it is whole: given part of one, Beast keeps state that makes what it
// reports depend on how the bytes arrived (a malformed request line is
// refused at once when it arrives in one piece, only at the end of the
// header when it trickles in; its own size limit counts the request line
// and the fields apart, and lets a block over it through or not depending
// on the split), so one request would be served or refused depending on
// how TCP split it. troupe looks for the block's end itself, within its
// limit, and refuses a block that does not end within it; a bare LF, and a
// request method that is not a token, are refused as they arrive.
// A chunked body's framing is followed ahead of Beast for the same reason
// (chunk_framing.hpp).
template <class Parser>
struct Reading {
  Parser parser;
  std::size_t scanned = 0;    // bytes of the header block searched for its end so far
  bool method_done = false;  // a request line's method has been read whole
  std::uint64_t max_body = 0;  // set by limit()
  std::optional<ChunkFraming> chunks;  // once the header says chunked
  std::size_t looked = 0;              // bytes at the front of the read buffer `chunks` has seen
};
using RequestReading = Reading<BeastRequestParser>;
using ResponseReading = Reading<BeastResponseParser>;

// Gives a fresh request's reading the server's limits.
void limit(RequestReading& reading, const ServerSettings& settings);

// The refusal for an error Beast reported while reading a request.
// `unparsed`: the bytes left in the read buffer (from the line Beast
// stopped in).
Refusal refusal_for(const beast::error_code& ec, std::string_view unparsed);

// Feeds what `in` holds to the request's parser as the server does,
// consuming what the parser takes: the header first (within
// max_header_bytes: 414 when the request line alone does not fit, else
// 431), then check_header(), then the body. `header`: the header has just
// passed (call again for the body); `done`: the request is complete (what
// is left in `in` is the next one's); need_more: read more; refused:
// `refusal` says why.
enum class Fed { need_more, header, done, refused };
Fed feed_request(RequestReading& reading, beast::flat_buffer& in, std::size_t max_header_bytes, Refusal& refusal);

// Checks a request whose header is in: its version, Host, field count and
// framing (Transfer-Encoding with Content-Length, codings other than
// chunked) and its Expect. nullopt: read its body and serve it.
std::optional<Refusal> check_header(const BeastRequest& request);

// The request waits for "100 Continue" before it sends its body.
bool expects_continue(const BeastRequest& request);

// The complete request as handlers see it (target path percent-decoded),
// or the refusal of its target.
std::optional<Refusal> to_request(BeastRequest&& in, Request& out);

// The Beast response for `r` to a request of HTTP/1.`version - 10`, with
// Content-Length, Connection and Date (when not empty) written; for a HEAD
// the body goes, its length stays. nullptr when r's status is not a
// three-digit one or a header could break the framing.
std::shared_ptr<BeastResponse> to_beast(Response&& r, unsigned version, bool head, bool close, std::string_view date);

// The bytes of one message: for a response written outside a connection's
// stream (the 503 to a connection over the limit) and for the client's
// requests.
std::string to_wire(const BeastResponse& response);

// --- client side ---------------------------------------------------------------------

// Gives a fresh response's reading the client's limits; `head`: the
// request was a HEAD, so the response has no body whatever it says.
void limit(ResponseReading& reading, const ClientSettings& settings, bool head);

// The bytes of a request: Host is `host`; Content-Length is written when
// there is a body or the method usually carries one. nullopt for a method
// that is not a token, a target with spaces or controls, or a header that
// could break the framing.
std::optional<std::string> request_wire(const ClientRequest& request, std::string_view host);

// Feeds what `in` holds to `parser` as the client does, consuming what the
// parser takes; an interim (1xx) response is skipped (the parser renewed,
// with the same limits). `done`: a final response is complete (what is
// left in `in` is not its); need_more: read more; refused: `ec` says why.
Fed feed_response(std::optional<ResponseReading>& reading, beast::flat_buffer& in, const ClientSettings& settings,
                  bool head, beast::error_code& ec);

// The response as the client hands it to `done`.
Response to_response(BeastResponse&& in);

}  // namespace troupe::http::detail
