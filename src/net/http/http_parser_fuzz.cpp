// libFuzzer target for HTTP as troupe reads it: Boost.Beast's request and
// response parsers with the limits, checks and conversions of
// beast_messages.hpp (scripts/fuzz runs it).
//
// The input is a byte stream as a client could send it on one connection
// (and, read the other way, as a server could answer). It is read as a
// sequence of pipelined requests the way the server reads them (a fresh
// parser per request with the server's limits, the header checked once it
// is in, then the body, then the conversion to a troupe Request; a Beast
// error turned into the server's refusal) three times: whole, one byte at a
// time, and in pseudo-random chunks (sizes drawn from a generator seeded
// by the input). Beyond "no crash, no undefined behaviour, no leak" under
// ASan/UBSan, it checks:
//   - the three readings agree: same requests, same refusal, whatever the
//     split of the stream;
//   - a body stays within the limit, and a refusal has a 4xx/5xx status
//     the server knows and a reason;
//   - what was read survives a round trip: the request written again as
//     the client writes it reads back to the same method, target, path and
//     body;
//   - the query and header helpers accept whatever a request carries.
// The same bytes then go through the client's response reading
// (feed_response), whole and byte by byte, with the end of the stream,
// which must agree too.
// The limits come from the last input byte, so both small limits (where
// 413/414/431 are reached) and roomy ones are explored.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "beast_messages.hpp"
#include "syntax.hpp"

namespace {

namespace d = troupe::http::detail;
using troupe::http::ClientRequest;
using troupe::http::ClientSettings;
using troupe::http::Request;
using troupe::http::Response;
using troupe::http::ServerSettings;

void check(bool ok) {
  if (!ok) std::abort();
}

struct RequestOutcome {
  std::vector<std::string> requests;  // each request, flattened
  int refusal = 0;                    // 0: the stream ended cleanly or inside a request's first bytes
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

// Appends the next `n` bytes of the stream to the read buffer, as a socket
// read would.
void receive(d::beast::flat_buffer& in, std::string_view stream, std::size_t& sent, std::size_t n) {
  n = std::min(n, stream.size() - sent);
  auto room = in.prepare(n);
  std::memcpy(room.data(), stream.data() + sent, n);
  in.commit(n);
  sent += n;
}

// Reads the stream as the server's connection does (beast_connection.cpp,
// parse()), receiving `step()` more bytes at a time, and also returns each
// request read (for the round trip).
template <class Step>
RequestOutcome read_requests(std::string_view stream, const ServerSettings& settings, Step step,
                             std::vector<Request>* requests = nullptr) {
  RequestOutcome out;
  d::beast::flat_buffer in;
  std::size_t sent = 0;
  std::optional<d::RequestReading> reading;
  for (;;) {
    if (!reading) {
      reading.emplace();
      d::limit(*reading, settings);
    }
    d::Refusal refusal;
    switch (d::feed_request(*reading, in, settings.max_header_bytes, refusal)) {
      case d::Fed::need_more:
        if (sent == stream.size()) {
          // The end of the stream: between requests a clean end, inside one a 400.
          if (in.size() > 0 || reading->parser.got_some()) out.refusal = 400;
          return out;
        }
        receive(in, stream, sent, step());
        continue;
      case d::Fed::refused:
        check(known_status(refusal.status) && !refusal.reason.empty());
        out.refusal = refusal.status;
        return out;
      case d::Fed::header:
        (void)d::expects_continue(reading->parser.get());
        continue;
      case d::Fed::done: {
        const bool keep = reading->parser.get().keep_alive();
        Request r;
        auto refused = d::to_request(reading->parser.release(), r);
        reading.reset();
        if (refused) {
          check(known_status(refused->status) && !refused->reason.empty());
          out.refusal = refused->status;
          return out;
        }
        check(r.body.size() <= settings.max_body_bytes);
        out.requests.push_back(flatten(r, keep));
        if (requests) requests->push_back(std::move(r));
        if (!keep) return out;  // the server reads no further
        continue;
      }
    }
  }
}

// The request as the client would send it, read back by the server's parser.
void round_trip(const Request& r) {
  ClientRequest c;
  c.method = r.method;
  c.target = r.target;
  c.body = r.body;
  const std::optional<std::string> wire = d::request_wire(c, "fuzz");
  if (!wire) return;
  ServerSettings roomy;
  roomy.max_header_bytes = wire->size() + 64;
  roomy.max_body_bytes = r.body.size();
  std::vector<Request> back;
  const RequestOutcome again = read_requests(*wire, roomy, [&] { return wire->size(); }, &back);
  check(again.refusal == 0 && back.size() == 1);
  check(back[0].method == r.method && back[0].target == r.target && back[0].body == r.body &&
        back[0].path == r.path);
}

struct ResponseOutcome {
  std::string flat;
  int result = 0;  // 1 complete, 2 error, 3 need more
  bool operator==(const ResponseOutcome&) const = default;
};

// Reads one response as the client does, receiving `step()` bytes at a time.
template <class Step>
ResponseOutcome read_response(std::string_view stream, const ClientSettings& settings, bool head, Step step) {
  std::optional<d::ResponseReading> reading;
  reading.emplace();
  d::limit(*reading, settings, head);
  d::beast::flat_buffer in;
  std::size_t sent = 0;
  for (;;) {
    d::beast::error_code ec;
    const d::Fed fed = d::feed_response(reading, in, settings, head, ec);
    if (fed == d::Fed::refused) return {{}, 2};
    if (fed == d::Fed::need_more || fed == d::Fed::header) {
      if (sent < stream.size()) {
        receive(in, stream, sent, step());
        continue;
      }
      // The end of the stream, as the client's on_eof(): a body that runs
      // to it ends here; nothing at all is a lost connection; anything
      // else is a malformed response.
      if (stream.empty()) return {{}, 3};
      if (!reading->parser.is_header_done()) return {{}, 2};
      reading->parser.put_eof(ec);
      if (ec || !reading->parser.is_done()) return {{}, 2};
    }
    const bool keep = reading->parser.get().keep_alive();
    const Response r = d::to_response(reading->parser.release());
    check(r.body.size() <= settings.max_response_body_bytes);
    std::string flat = std::to_string(r.status) + '\n' + r.content_type + '\n' + (keep ? "keep\n" : "close\n");
    for (const auto& [n, v] : r.headers) flat += n + ':' + v + '\n';
    flat += r.body;
    // A close-delimited body takes the whole stream whatever the split;
    // any other framing ends at the same byte either way.
    flat += '\n' + std::to_string(sent - in.size());
    return {flat, 1};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view stream(reinterpret_cast<const char*>(data), size);
  const std::uint8_t knob = size > 0 ? data[size - 1] : 0;
  ServerSettings server;
  server.max_header_bytes = 64 + (knob & 0x0f) * 256u;  // 64 .. 3904
  server.max_body_bytes = (knob >> 4) * 512u;           // 0 .. 7680

  std::vector<Request> requests;
  const RequestOutcome whole = read_requests(stream, server, [&] { return stream.size(); }, &requests);
  const RequestOutcome bytewise = read_requests(stream, server, [] { return std::size_t{1}; });
  check(bytewise == whole);
  std::minstd_rand rng(static_cast<std::uint32_t>(size * 2654435761u) ^ knob);
  const RequestOutcome chunked = read_requests(stream, server, [&] { return std::size_t{1} + rng() % 97; });
  check(chunked == whole);

  for (const Request& r : requests) {
    (void)r.query_param("a");
    (void)r.header("host");
    std::string decoded;
    (void)d::percent_decode(r.query, decoded, true);
    check(d::target_path(r.target).has_value());
    round_trip(r);
  }

  ClientSettings client;
  client.max_response_header_bytes = server.max_header_bytes;
  client.max_response_body_bytes = server.max_body_bytes;
  const bool head = !stream.empty() && (stream.back() & 1);
  const ResponseOutcome rw = read_response(stream, client, head, [&] { return stream.size(); });
  const ResponseOutcome rb = read_response(stream, client, head, [] { return std::size_t{1}; });
  check(rb == rw);
  return 0;
}
