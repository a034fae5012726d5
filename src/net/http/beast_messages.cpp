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

// The header block starting at data[0] (through its empty line) is longer
// than `max`, or cannot end within it.
bool header_too_long(std::string_view data, std::size_t max) noexcept {
  return data.size() >= max && data.substr(0, max).find("\r\n\r\n") == std::string_view::npos;
}

// A line end without its CR in `block`, the part of a header block that
// has arrived.
bool bare_lf(std::string_view block) noexcept {
  for (std::size_t i = block.find('\n'); i != std::string_view::npos; i = block.find('\n', i + 1))
    if (i == 0 || block[i - 1] != '\r') return true;
  return false;
}

// The header block at the start of `data`, as far as it has arrived:
// `whole` once its empty line is in; `bare_lf` when a line within `max`
// ends in a LF alone; `too_long` when it is longer than `max` or cannot
// end within it.
//
// Beast is handed a header block only whole (server and client alike):
// handed a part, it parses and drops each complete line, and the lines
// dropped would count neither against troupe's limit nor against Beast's
// own (which counts each call's bytes). A bare LF, which Beast refuses as
// soon as it sees one, is looked for here meanwhile, within the limit, so
// that whether it or the limit binds first does not depend on the split.
enum class Block { partial, whole, too_long, bare_lf };
Block header_block(std::string_view data, std::size_t max) noexcept {
  const std::size_t end = data.find("\r\n\r\n");
  const std::size_t arrived = end == std::string_view::npos ? data.size() : end + 4;
  if (bare_lf(data.substr(0, std::min(arrived, max)))) return Block::bare_lf;
  if (header_too_long(data, max)) return Block::too_long;
  return end == std::string_view::npos ? Block::partial : Block::whole;
}

// The read buffer holds a chunked body's last chunk ("0\r\n") and less
// than the five bytes that end the body at the least ("0\r\n\r\n").
// Boost 1.74's chunk parser, handed the last chunk line alone and then
// four bytes, fails an assertion in debug builds; it is handed the bytes
// once the fifth is in.
bool short_last_chunk(const beast::flat_buffer& in) noexcept {
  const std::string_view data = unparsed(in);
  return data.size() < 5 && data.substr(0, 3) == "0\r\n";
}

// Beast's own header limit, above troupe's, which always binds first.
std::uint32_t beast_header_limit(std::size_t max) noexcept {
  return static_cast<std::uint32_t>(std::min<std::size_t>(max * 2 + 64, UINT32_MAX));
}

}  // namespace

// --- server side ---------------------------------------------------------------------

void limit(BeastRequestParser& parser, const ServerSettings& settings) {
  parser.header_limit(beast_header_limit(settings.max_header_bytes));
  parser.body_limit(settings.max_body_bytes);
  parser.eager(false);  // stop after the header: check_header() comes before the body
}

std::optional<Refusal> header_refusal(std::string_view data, std::size_t max_header_bytes) {
  if (!header_too_long(data, max_header_bytes)) return std::nullopt;
  if (data.substr(0, max_header_bytes).find("\r\n") == std::string_view::npos)
    return Refusal{414, "request line longer than " + std::to_string(max_header_bytes) + " bytes"};
  return Refusal{431, "header block longer than " + std::to_string(max_header_bytes) + " bytes"};
}

Fed feed_request(BeastRequestParser& parser, beast::flat_buffer& in, std::size_t max_header_bytes, Refusal& refusal) {
  for (;;) {
    const bool in_header = !parser.is_header_done();
    if (in_header) {
      const std::string_view data = unparsed(in);
      switch (header_block(data, max_header_bytes)) {
        case Block::partial:
          return Fed::need_more;
        case Block::bare_lf:
          refusal = Refusal{400, "a line of the header ends in LF without CR"};
          return Fed::refused;
        case Block::too_long:
          refusal = *header_refusal(data, max_header_bytes);
          return Fed::refused;
        case Block::whole:
          break;
      }
    }
    if (parser.is_done()) return Fed::done;
    if (in.size() == 0) return Fed::need_more;
    if (!in_header && parser.chunked() && short_last_chunk(in)) return Fed::need_more;
    beast::error_code ec;
    const std::size_t used = parser.put(in.data(), ec);
    in.consume(used);
    if (ec == bhttp::error::need_more) return Fed::need_more;
    if (ec) {
      refusal = refusal_for(ec, unparsed(in), max_header_bytes);
      return Fed::refused;
    }
    if (in_header && parser.is_header_done()) {
      if (auto r = check_header(parser.get())) {
        refusal = std::move(*r);
        return Fed::refused;
      }
      parser.eager(true);
      return Fed::header;
    }
    if (used == 0 && !parser.is_done()) return Fed::need_more;
  }
}

Refusal refusal_for(const beast::error_code& ec, std::string_view unparsed, std::size_t max_header_bytes) {
  const std::string what = ec.message();
  // (Not reached while header_refusal() binds first; kept for Beast's own limit.)
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
  (void)max_header_bytes;
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

void limit(BeastResponseParser& parser, const ClientSettings& settings, bool head) {
  parser.header_limit(beast_header_limit(settings.max_response_header_bytes));
  parser.body_limit(settings.max_response_body_bytes);
  parser.eager(true);
  parser.skip(head);
}

std::optional<std::string> request_wire(const ClientRequest& r, std::string_view host) {
  if (!is_token(r.method) || !target_ok(r.target)) return std::nullopt;
  BeastRequest req;
  req.version(11);
  req.method_string(bsv(r.method));
  req.target(bsv(r.target));
  req.set(bhttp::field::host, bsv(host));
  for (const auto& [name, value] : r.headers) {
    // Host and the framing are the client's to write.
    if (!field_ok(name, value) || iequals(name, "Host") || iequals(name, "Content-Length") ||
        iequals(name, "Transfer-Encoding"))
      return std::nullopt;
    req.insert(bsv(name), bsv(value));
  }
  if (!r.content_type.empty()) {
    if (!field_ok("Content-Type", r.content_type)) return std::nullopt;
    req.set(bhttp::field::content_type, bsv(r.content_type));
  }
  if (!r.body.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH")
    req.content_length(r.body.size());
  req.body() = r.body;
  std::ostringstream out;
  out << req;
  return std::move(out).str();
}

Fed feed_response(std::optional<BeastResponseParser>& parser, beast::flat_buffer& in, const ClientSettings& settings,
                  bool head, beast::error_code& ec) {
  while (in.size() > 0) {
    if (!parser->is_header_done()) {
      const Block block = header_block(unparsed(in), settings.max_response_header_bytes);
      if (block == Block::partial) break;
      if (block != Block::whole) {
        ec = block == Block::bare_lf ? bhttp::error::bad_line_ending : bhttp::error::header_limit;
        return Fed::refused;
      }
    } else if (parser->chunked() && short_last_chunk(in)) {
      break;
    }
    ec = {};
    in.consume(parser->put(in.data(), ec));
    if (ec == bhttp::error::need_more) break;
    if (ec) return Fed::refused;
    if (!parser->is_done()) continue;
    if (parser->get().result_int() / 100 != 1) return Fed::done;
    parser.emplace();  // interim: the answer follows
    limit(*parser, settings, head);
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
