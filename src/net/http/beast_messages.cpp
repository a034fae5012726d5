// What troupe makes of Beast's messages; see beast_messages.hpp.

#include "beast_messages.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <sstream>
#include <vector>

#include "syntax.hpp"

namespace troupe::http::detail {

namespace {

beast::string_view bsv(std::string_view s) noexcept { return {s.data(), s.size()}; }
std::string_view sv(beast::string_view s) noexcept { return {s.data(), s.size()}; }

// A request line "METHOD target HTTP/d.d" whose version Beast refused as
// other than 1.x (a malformed line is a 400, this a 505).
bool well_formed_other_version(std::string_view data) {
  const std::size_t eol = data.find("\r\n");
  if (eol == std::string_view::npos || eol < 8) return false;
  const std::string_view v = data.substr(eol - 8, 8);
  return v.substr(0, 5) == "HTTP/" && v[5] >= '0' && v[5] <= '9' && v[6] == '.' && v[7] >= '0' && v[7] <= '9' &&
         v[5] != '1';
}

// A request target's octets: visible ASCII.
bool target_ok(std::string_view target) noexcept {
  return !target.empty() &&
         std::all_of(target.begin(), target.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

std::string_view unparsed(const beast::flat_buffer& in) noexcept {
  return {static_cast<const char*>(in.data().data()), in.data().size()};
}

// What troupe refuses in a header block before its end has arrived, byte
// by byte in order, so that the first offending byte decides however the
// bytes arrive: a bare LF (lines end in CRLF), and for a request a method
// that is not a token (binary input, TLS spoken to a plain port).
// `method_done`: the request line's first space has been seen.
beast::error_code early_error(std::string_view window, std::size_t from, bool request, bool& method_done) {
  for (std::size_t i = from; i < window.size(); ++i) {
    const char c = window[i];
    if (c == '\n' && (i == 0 || window[i - 1] != '\r')) return bhttp::error::bad_line_ending;
    if (request && !method_done) {
      if (c == ' ' && i > 0) {
        method_done = true;
      } else if (!is_token(std::string_view(&c, 1))) {
        return bhttp::error::bad_method;
      }
    }
  }
  return {};
}

// What put_header() made of what has arrived.
enum class HeaderStep {
  decided,    // troupe refused a byte as it arrived, or Beast had the whole block: `ec` says which and what
  need_more,  // the block's end has not arrived yet
  too_long,   // the block does not end within `max` bytes
  malformed,  // Beast wanted bytes past the block's end: its lines are malformed
};

// Hands Beast the header block once its end is within the first `max`
// bytes of `in` (see Reading), with whatever follows it in that window.
template <class Parser>
HeaderStep put_header(Reading<Parser>& r, beast::flat_buffer& in, std::size_t max, bool request,
                      beast::error_code& ec) {
  const std::string_view window = unparsed(in).substr(0, max);
  const std::size_t eom = window.find("\r\n\r\n", r.scanned > 3 ? r.scanned - 3 : 0);
  const std::string_view block = eom == std::string_view::npos ? window : window.substr(0, eom + 4);
  ec = early_error(block, r.scanned, request, r.method_done);
  r.scanned = block.size();
  if (ec) return HeaderStep::decided;
  if (eom == std::string_view::npos) return window.size() >= max ? HeaderStep::too_long : HeaderStep::need_more;
  in.consume(r.parser.put(asio::const_buffer(window.data(), window.size()), ec));
  // A well-formed block never needs a byte past its end: given more in one
  // piece, Beast would have refused it outright.
  if (ec == bhttp::error::need_more && !r.parser.is_header_done()) return HeaderStep::malformed;
  return HeaderStep::decided;
}

// A response whose header is in and whose Content-Length passes the
// limit. Beast 1.74 does not check a response's Content-Length against its
// body limit, so the client checks it here, before Beast reserves room.
bool body_over_limit(const BeastResponseParser& parser, std::size_t max, bool head) {
  if (head || !parser.is_header_done()) return false;
  const unsigned status = parser.get().result_int();
  if (status / 100 == 1 || status == 204 || status == 304) return false;
  const auto length = parser.content_length();
  return length && *length > max;
}

// The read buffer holds a chunked body's last chunk ("0\r\n") and less
// than the five bytes that end the body at the least ("0\r\n\r\n").
// Boost 1.74's chunk parser, handed the last chunk line alone and then
// four bytes, fails an assertion in debug builds (corrected upstream in
// 2024, boostorg/beast pull request 2861); it is handed the bytes once
// the fifth is in.
template <class Parser>
bool short_last_chunk(const Parser& parser, const beast::flat_buffer& in) noexcept {
  const std::string_view data = unparsed(in);
  return parser.chunked() && data.size() < 5 && data.substr(0, 3) == "0\r\n";
}

// Lets the chunked body's framing see what has arrived since it last
// looked, before Beast does.
template <class Parser>
std::optional<ChunkFraming::Bad> look_ahead(Reading<Parser>& r, const beast::flat_buffer& in) {
  std::optional<ChunkFraming::Bad> bad;
  if (r.chunks && !r.chunks->done()) r.looked += r.chunks->look(unparsed(in).substr(r.looked), bad);
  return bad;
}

// Beast took `used` bytes from the front of the read buffer.
template <class Parser>
void taken(Reading<Parser>& r, std::size_t used) noexcept {
  r.looked -= std::min(used, r.looked);
}

// Beast's own header limit, above troupe's, which always binds first.
std::uint32_t beast_header_limit(std::size_t max) noexcept {
  return static_cast<std::uint32_t>(std::min<std::size_t>(max * 2 + 64, UINT32_MAX));
}

}  // namespace

// --- server side ---------------------------------------------------------------------

void limit(RequestReading& reading, const ServerSettings& settings) {
  reading.max_body = settings.max_body_bytes;
  reading.parser.header_limit(beast_header_limit(settings.max_header_bytes));
  reading.parser.body_limit(settings.max_body_bytes);
  reading.parser.eager(false);  // stop after the header: check_header() comes before the body
}

Fed feed_request(RequestReading& r, beast::flat_buffer& in, std::size_t max_header_bytes, Refusal& refusal) {
  for (;;) {
    if (r.parser.is_done()) return Fed::done;
    if (in.size() == 0) return Fed::need_more;
    beast::error_code ec;
    if (!r.parser.is_header_done()) {
      switch (put_header(r, in, max_header_bytes, true, ec)) {
        case HeaderStep::need_more:
          return Fed::need_more;
        case HeaderStep::too_long:  // (nothing of `in` taken)
          if (unparsed(in).substr(0, max_header_bytes).find("\r\n") == std::string_view::npos)
            refusal = {414, "request line longer than " + std::to_string(max_header_bytes) + " bytes"};
          else
            refusal = {431, "header block longer than " + std::to_string(max_header_bytes) + " bytes"};
          return Fed::refused;
        case HeaderStep::malformed:
          refusal = {400, "malformed request line or header field"};
          return Fed::refused;
        case HeaderStep::decided:
          break;
      }
      if (ec == bhttp::error::need_more) {
        if (!r.parser.is_header_done()) return Fed::need_more;
        ec = {};  // the window ended just after the header
      }
      if (ec) {
        refusal = refusal_for(ec, unparsed(in));
        return Fed::refused;
      }
      if (auto bad = check_header(r.parser.get())) {
        refusal = std::move(*bad);
        return Fed::refused;
      }
      r.parser.eager(true);
      if (r.parser.chunked()) r.chunks.emplace(r.max_body, max_header_bytes);
      return Fed::header;
    }
    if (auto bad = look_ahead(r, in)) {
      refusal = {bad->status, std::move(bad->reason)};
      return Fed::refused;
    }
    if (short_last_chunk(r.parser, in)) return Fed::need_more;
    const std::size_t used = r.parser.put(in.data(), ec);
    in.consume(used);
    taken(r, used);
    if (ec == bhttp::error::need_more) return Fed::need_more;
    if (ec) {
      refusal = refusal_for(ec, unparsed(in));
      return Fed::refused;
    }
    if (used == 0 && !r.parser.is_done()) return Fed::need_more;
  }
}

Refusal refusal_for(const beast::error_code& ec, std::string_view unparsed) {
  const std::string what = ec.message();
  // (Not reached while troupe's limit, below Beast's, binds first.)
  if (ec == bhttp::error::header_limit) return {431, "header block too large (" + what + ")"};
  if (ec == bhttp::error::body_limit) return {413, "body too large (" + what + ")"};
  // Beast reads any HTTP/d.d (a major other than 1 is answered 505 once the
  // header is in): bad_version is a malformed line, a bare LF included.
  if (ec == bhttp::error::bad_version) {
    if (well_formed_other_version(unparsed)) return {505, "HTTP version is not supported (HTTP/1.1 is)"};
    return {400, "malformed HTTP version or line end (" + what + ")"};
  }
  // Beast says bad_transfer_encoding of a Transfer-Encoding after
  // Content-Length or after one that ends in chunked: framing two ways, not
  // a coding it lacks (those pass to check_header(), which answers 501).
  if (ec == bhttp::error::bad_transfer_encoding)
    return {400, "Transfer-Encoding with Content-Length, or twice (" + what + ")"};
  if (ec == bhttp::error::partial_message) return {400, "the connection ended inside a request"};
  return {400, what};
}

std::optional<Refusal> check_header(const BeastRequest& req) {
  if (req.version() != 10 && req.version() != 11) return Refusal{505, "HTTP version not supported"};
  if (req.version() == 11 && req.count(bhttp::field::host) == 0)
    return Refusal{400, "an HTTP/1.1 request without a Host header"};
  if (req.count(bhttp::field::host) > 1) return Refusal{400, "more than one Host header"};
  if (static_cast<std::size_t>(std::distance(req.begin(), req.end())) > kMaxFields)
    return Refusal{431, "more than " + std::to_string(kMaxFields) + " header fields"};
  if (req.count(bhttp::field::transfer_encoding) > 0 && req.count(bhttp::field::content_length) > 0)
    return Refusal{400, "both Transfer-Encoding and Content-Length"};
  if (req.count(bhttp::field::transfer_encoding) > 0) {
    // Beast decodes chunked and hands any other coding through as it is.
    const std::vector<std::string_view> codings = split_list(sv(req[bhttp::field::transfer_encoding]));
    for (std::string_view coding : codings)
      if (!iequals(coding, "chunked"))
        return Refusal{501,
                       "transfer coding '" + std::string(coding.substr(0, 32)) + "' is not supported (only chunked is)"};
    // Beast frames "chunked, chunked" (or an empty list) as no body at
    // all, and an HTTP/1.0 peer may not know chunked (RFC 9112 6.1): either
    // way whoever sent the request on may have framed it otherwise.
    if (codings.size() != 1) return Refusal{400, "Transfer-Encoding must name chunked, once"};
    if (req.version() == 10) return Refusal{400, "Transfer-Encoding in an HTTP/1.0 request"};
  }
  if (req.version() == 11 && req.count(bhttp::field::expect) > 0 &&
      !iequals(sv(req[bhttp::field::expect]), "100-continue"))
    return Refusal{417, "Expect is not supported (only 100-continue is)"};
  return std::nullopt;
}

bool expects_continue(const BeastRequest& req) {
  return req.version() == 11 && req.count(bhttp::field::expect) > 0 &&
         iequals(sv(req[bhttp::field::expect]), "100-continue");
}

std::optional<Refusal> to_request(BeastRequest&& in, Request& out) {
  out.method.assign(sv(in.method_string()));
  out.target.assign(sv(in.target()));
  const std::optional<std::string_view> raw_path = target_path(out.target);
  if (!raw_path) return Refusal{400, "the request target must be a path ('/...') or an absolute http URL"};
  if (!percent_decode(*raw_path, out.path, false))
    return Refusal{400, "malformed percent-encoding in the path (or an encoded NUL)"};
  if (const std::size_t q = out.target.find('?'); q != std::string::npos) out.query = out.target.substr(q + 1);
  for (const auto& f : in) out.headers.emplace_back(std::string(sv(f.name_string())), std::string(sv(f.value())));
  out.body = std::move(in.body());
  return std::nullopt;
}

std::shared_ptr<BeastResponse> to_beast(Response&& r, unsigned version, bool head, bool close, std::string_view date) {
  if (r.status < 200 || r.status > 999) return nullptr;
  auto res = std::make_shared<BeastResponse>();
  res->version(version);
  res->result(static_cast<unsigned>(r.status));
  res->reason(bsv(reason_phrase(r.status)));
  for (const auto& [name, value] : r.headers) {
    if (!field_ok(name, value)) return nullptr;
    res->insert(bsv(name), bsv(value));
  }
  if (!r.content_type.empty()) {
    if (!field_ok("Content-Type", r.content_type)) return nullptr;
    res->set(bhttp::field::content_type, r.content_type);
  }
  if (!date.empty()) res->set(bhttp::field::date, bsv(date));
  res->keep_alive(!close);
  // A 204 or 304 has no body and no length to write (RFC 9110 8.6, 15.3.5);
  // Beast's prepare_payload() would throw for a body there.
  if (r.status == 204 || r.status == 304) return res;
  res->body() = std::move(r.body);
  res->prepare_payload();
  if (head) res->body().clear();  // Content-Length stays that of the GET
  return res;
}

std::string to_wire(const BeastResponse& response) {
  std::ostringstream out;
  out << response;
  return std::move(out).str();
}

// --- client side ---------------------------------------------------------------------

void limit(ResponseReading& reading, const ClientSettings& settings, bool head) {
  reading.max_body = settings.max_response_body_bytes;
  reading.parser.header_limit(beast_header_limit(settings.max_response_header_bytes));
  reading.parser.body_limit(settings.max_response_body_bytes);
  // Stop after the header: Beast would reserve the body's announced length
  // before the body limit is checked (body_over_limit).
  reading.parser.eager(false);
  reading.parser.skip(head);
}

std::optional<std::string> request_wire(const ClientRequest& r, std::string_view host) {
  if (!is_token(r.method) || !target_ok(r.target)) return std::nullopt;
  if (!r.content_type.empty() && !field_ok("Content-Type", r.content_type)) return std::nullopt;
  for (const auto& [name, value] : r.headers) {
    // Host and the framing are the client's to write.
    if (!field_ok(name, value) || iequals(name, "Host") || iequals(name, "Content-Length") ||
        iequals(name, "Transfer-Encoding"))
      return std::nullopt;
  }
  // What was checked above cannot break the framing, so the request line
  // and fields are written as they are: one string, one write, no message
  // object per request (the client's hot path).
  std::string out;
  out.reserve(64 + r.method.size() + r.target.size() + host.size() + r.content_type.size() + r.body.size());
  out.append(r.method).append(" ").append(r.target).append(" HTTP/1.1\r\nHost: ").append(host).append("\r\n");
  for (const auto& [name, value] : r.headers) out.append(name).append(": ").append(value).append("\r\n");
  if (!r.content_type.empty()) out.append("Content-Type: ").append(r.content_type).append("\r\n");
  if (!r.body.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH")
    out.append("Content-Length: ").append(std::to_string(r.body.size())).append("\r\n");
  out.append("\r\n").append(r.body);
  return out;
}

Fed feed_response(std::optional<ResponseReading>& r, beast::flat_buffer& in, const ClientSettings& settings,
                  bool head, beast::error_code& ec) {
  while (in.size() > 0) {
    ec = {};
    if (!r->parser.is_header_done()) {
      switch (put_header(*r, in, settings.max_response_header_bytes, false, ec)) {
        case HeaderStep::need_more:
          return Fed::need_more;
        case HeaderStep::too_long:
          ec = bhttp::error::header_limit;
          return Fed::refused;
        case HeaderStep::malformed:
          ec = bhttp::error::bad_version;  // the status line or a field is malformed
          return Fed::refused;
        case HeaderStep::decided:
          break;
      }
      if (ec) return Fed::refused;
      if (body_over_limit(r->parser, settings.max_response_body_bytes, head)) {
        ec = bhttp::error::body_limit;
        return Fed::refused;
      }
      r->parser.eager(true);  // the body, now that its length is known to fit
      if (r->parser.chunked() && !r->parser.is_done())
        r->chunks.emplace(r->max_body, settings.max_response_header_bytes);
    } else {
      if (auto bad = look_ahead(*r, in)) {
        ec = bad->status == 413 ? bhttp::error::body_limit
             : bad->status == 431 ? bhttp::error::header_limit
                                  : bhttp::error::bad_chunk;
        return Fed::refused;
      }
      if (short_last_chunk(r->parser, in)) break;
      const std::size_t used = r->parser.put(in.data(), ec);
      in.consume(used);
      taken(*r, used);
    }
    if (ec == bhttp::error::need_more) break;
    if (ec) return Fed::refused;
    if (!r->parser.is_done()) continue;
    if (r->parser.get().result_int() / 100 != 1) return Fed::done;
    r.emplace();  // interim: the answer follows
    limit(*r, settings, head);
  }
  ec = {};
  return Fed::need_more;
}

Response to_response(BeastResponse&& in) {
  Response r;
  r.status = static_cast<int>(in.result_int());
  r.content_type.assign(sv(in[bhttp::field::content_type]));
  for (const auto& f : in) r.headers.emplace_back(std::string(sv(f.name_string())), std::string(sv(f.value())));
  r.body = std::move(in.body());
  return r;
}

}  // namespace troupe::http::detail
