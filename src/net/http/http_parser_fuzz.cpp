// libFuzzer target for the HTTP parsers (scripts/fuzz runs it).
//
// The input is a byte stream as a client could send it on one connection
// (and, read the other way, as a server could answer). It is parsed as a
// sequence of pipelined requests three times: whole, one byte at a time,
// and in pseudo-random chunks (sizes drawn from a generator seeded by the
// input), exactly as the server's connection feeds its parser: the bytes
// of the request being parsed from its first byte on, growing. Beyond "no
// crash, no undefined behaviour, no leak" under ASan/UBSan, it checks:
//   - the three parsings agree: same requests, same refusal, whatever the
//     split of the stream;
//   - a request never claims more bytes than it was given, its body stays
//     within the limit, and a refusal has a 4xx/5xx status the server
//     knows and a reason;
//   - what was parsed survives a round trip: the request serialised again
//     (as the client would) parses back to the same method, target and body;
//   - the query and path helpers accept whatever a request carries.
// The same bytes then go through the response parser, whole and split,
// with the end of the stream, which must agree too.
// The limits come from the last input byte, so both small limits (where
// 413/414/431 are reached) and roomy ones are explored.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "parser.hpp"

namespace {

using troupe::http::ClientRequest;
using troupe::http::Request;
using troupe::http::Response;
using troupe::http::detail::RequestParser;
using troupe::http::detail::ResponseParser;

void check(bool ok) {
  if (!ok) std::abort();
}

struct Limits {
  std::size_t header = 0;
  std::size_t body = 0;
};

struct RequestOutcome {
  std::vector<std::string> requests;  // each request, flattened
  int error_status = 0;               // 0: the stream ended in need_more (or cleanly)
  bool operator==(const RequestOutcome&) const = default;
};

std::string flatten(const Request& r, bool keep_alive) {
  std::string out = r.method + '\n' + r.target + '\n' + r.path + '\n' + r.query + '\n';
  for (const auto& [n, v] : r.headers) out += n + ':' + v + '\n';
  out += keep_alive ? "keep\n" : "close\n";
  out += r.body;
  return out;
}

bool known_status(int s) {
  switch (s) {
    case 400:
    case 408:
    case 413:
    case 414:
    case 417:
    case 431:
    case 501:
    case 505:
      return true;
    default:
      return false;
  }
}

// Parses the stream as the server does, handing the parser `step(rng)`
// more bytes at a time (all of them when step is null).
template <class Step>
RequestOutcome parse_requests(std::string_view stream, Limits lim, Step step) {
  RequestOutcome out;
  RequestParser parser(lim.header, lim.body);
  std::size_t start = 0;  // first byte of the request being parsed
  std::size_t have = 0;   // bytes received
  for (;;) {
    have = std::min(stream.size(), have + step());
    for (;;) {
      const std::string_view data = stream.substr(start, have - start);
      if (data.empty()) break;
      const RequestParser::Status st = parser.parse(data);
      if (st == RequestParser::Status::need_more) break;
      if (st == RequestParser::Status::error) {
        check(known_status(parser.error().status));
        check(!parser.error().reason.empty());
        out.error_status = parser.error().status;
        return out;
      }
      check(parser.consumed() > 0 && parser.consumed() <= data.size());
      start += parser.consumed();
      const bool keep = parser.keep_alive();
      Request r = parser.take();
      check(r.body.size() <= lim.body);
      out.requests.push_back(flatten(r, keep));
    }
    if (have == stream.size()) return out;
  }
}

// The request as the client would send it, parsed back.
void round_trip(const Request& r, Limits lim) {
  ClientRequest c;
  c.method = r.method;
  c.target = r.target;
  c.body = r.body;
  std::string wire;
  if (!troupe::http::detail::serialize_request(c, "fuzz", wire)) return;
  RequestParser again(wire.size() + 64, r.body.size());
  check(again.parse(wire) == RequestParser::Status::complete);
  check(again.consumed() == wire.size());
  const Request back = again.take();
  check(back.method == r.method && back.target == r.target && back.body == r.body && back.path == r.path);
  (void)lim;
}

struct ResponseOutcome {
  std::string flat;
  int result = 0;  // 1 complete, 2 error, 3 need more
  bool operator==(const ResponseOutcome&) const = default;
};

template <class Step>
ResponseOutcome parse_response(std::string_view stream, Limits lim, Step step) {
  ResponseParser parser(lim.header, lim.body);
  parser.expect(!stream.empty() && (stream.back() & 1));
  std::size_t have = 0;
  for (;;) {
    have = std::min(stream.size(), have + step());
    const bool end = have == stream.size();
    const std::string_view data = stream.substr(0, have);
    ResponseParser::Status st = parser.parse(data);
    if (st == ResponseParser::Status::need_more && end) st = parser.finish(data);
    if (st == ResponseParser::Status::error) {
      check(!parser.error().reason.empty());
      return {{}, 2};
    }
    if (st == ResponseParser::Status::complete) {
      check(parser.consumed() <= have);
      const bool keep = parser.keep_alive();
      const std::size_t consumed = parser.consumed();
      Response r = parser.take();
      check(r.body.size() <= lim.body);
      std::string flat =
          std::to_string(r.status) + '\n' + r.content_type + '\n' + (keep ? "keep\n" : "close\n");
      for (const auto& [n, v] : r.headers) flat += n + ':' + v + '\n';
      flat += r.body;
      // A close-delimited body takes the whole stream whatever the split;
      // any other framing ends at the same byte either way.
      flat += '\n' + std::to_string(consumed);
      return {flat, 1};
    }
    if (end) return {{}, 3};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view stream(reinterpret_cast<const char*>(data), size);
  Limits lim;
  const std::uint8_t knob = size > 0 ? data[size - 1] : 0;
  lim.header = 64 + (knob & 0x0f) * 256u;  // 64 .. 3904
  lim.body = (knob >> 4) * 512u;           // 0 .. 7680

  const RequestOutcome whole = parse_requests(stream, lim, [&] { return stream.size(); });
  const RequestOutcome bytewise = parse_requests(stream, lim, [] { return std::size_t{1}; });
  check(bytewise == whole);
  std::minstd_rand rng(static_cast<std::uint32_t>(size * 2654435761u) ^ knob);
  const RequestOutcome chunked = parse_requests(stream, lim, [&] { return std::size_t{1} + rng() % 97; });
  check(chunked == whole);

  // The parsed requests once more, for the helpers and the round trip.
  {
    RequestParser parser(lim.header, lim.body);
    std::size_t start = 0;
    while (start < stream.size() && parser.parse(stream.substr(start)) == RequestParser::Status::complete) {
      start += parser.consumed();
      const Request r = parser.take();
      (void)r.query_param("a");
      (void)r.header("host");
      std::string decoded;
      (void)troupe::http::detail::percent_decode(r.query, decoded, true);
      const auto path = troupe::http::detail::target_path(r.target);
      check(path.has_value());
      round_trip(r, lim);
    }
  }

  const ResponseOutcome rw = parse_response(stream, lim, [&] { return stream.size(); });
  const ResponseOutcome rb = parse_response(stream, lim, [] { return std::size_t{1}; });
  check(rb == rw);
  return 0;
}
