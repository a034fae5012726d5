// Requests read and responses written as the server does, and requests
// written and responses read as the client does, through Boost.Beast's
// parsers and beast_messages.hpp, with no socket: the bytes are handed over
// whole, one at a time, or split where a test says.

#include "beast_messages.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "syntax.hpp"

namespace troupe::http::detail {
namespace {

using namespace std::string_literals;

constexpr std::size_t kHeader = 1024;
constexpr std::size_t kBody = 4096;

ServerSettings server_limits() {
  ServerSettings s;
  s.max_header_bytes = kHeader;
  s.max_body_bytes = kBody;
  return s;
}

// One request as the server hands it on, with what the server decided
// about it from its header.
struct Received {
  Request request;
  bool keep_alive = false;
  bool expects_continue = false;
};

// What the server reads from one connection's bytes.
struct RequestsRead {
  std::vector<Received> requests;
  std::optional<Refusal> refusal;
  bool ended_inside = false;  // the bytes ran out inside a request
};

// Appends the next `n` bytes of the stream to the read buffer, as a socket read would.
void receive(beast::flat_buffer& in, std::string_view stream, std::size_t& sent, std::size_t n) {
  n = std::min(n, stream.size() - sent);
  auto room = in.prepare(n);
  std::memcpy(room.data(), stream.data() + sent, n);
  in.commit(n);
  sent += n;
}

// Reads of `first` bytes, then of all the rest.
std::function<std::size_t()> first_then_rest(std::size_t first) {
  return [first, once = false]() mutable {
    const std::size_t n = once ? std::numeric_limits<std::size_t>::max() : first;
    once = true;
    return n;
  };
}

// Reads that each end one byte past the next line end of `stream`.
std::function<std::size_t()> a_line_and_a_byte(std::string_view stream) {
  return [stream, at = std::size_t{0}]() mutable {
    const std::size_t eol = stream.find("\r\n", at + 1);
    const std::size_t end = eol == std::string_view::npos ? stream.size() : eol + 3;
    const std::size_t n = end - at;
    at = end;
    return n;
  };
}

// Reads `stream` as the server's connection does (beast_connection.cpp,
// parse()): a fresh parser per request; `next()` bytes arrive at a time;
// the reading stops at a refusal and after a request that closes the
// connection.
RequestsRead read_split(std::string_view stream, const ServerSettings& settings,
                   const std::function<std::size_t()>& next) {
  RequestsRead out;
  beast::flat_buffer in;
  std::size_t sent = 0;
  std::optional<RequestReading> reading;
  bool continues = false;
  for (;;) {
    if (!reading) {
      reading.emplace();
      limit(*reading, settings);
      continues = false;
    }
    Refusal refusal;
    switch (feed_request(*reading, in, settings.max_header_bytes, refusal)) {
      case Fed::need_more:
        if (sent == stream.size()) {
          out.ended_inside = in.size() > 0 || reading->parser.got_some();
          return out;
        }
        receive(in, stream, sent, next());
        continue;
      case Fed::refused:
        out.refusal = std::move(refusal);
        return out;
      case Fed::header:
        continues = expects_continue(reading->parser.get());
        continue;
      case Fed::done: {
        Received r;
        r.keep_alive = reading->parser.get().keep_alive();
        r.expects_continue = continues;
        auto refused = to_request(reading->parser.release(), r.request);
        reading.reset();
        if (refused) {
          out.refusal = std::move(refused);
          return out;
        }
        out.requests.push_back(std::move(r));
        if (!out.requests.back().keep_alive) return out;
        continue;
      }
    }
  }
}

// Everything a reading holds, to compare two.
std::string describe(const RequestsRead& r) {
  std::string out;
  for (const Received& got : r.requests) {
    const Request& q = got.request;
    out += q.method + ' ' + q.target + " path=" + q.path + " query=" + q.query + '\n';
    for (const auto& [n, v] : q.headers) out += n + ": " + v + '\n';
    out += got.keep_alive ? "keep-alive" : "close";
    out += got.expects_continue ? " continue" : "";
    out += "\nbody=" + q.body + '\n';
  }
  if (r.refusal) out += "refused " + std::to_string(r.refusal->status) + ": " + r.refusal->reason + '\n';
  if (r.ended_inside) out += "ended inside a request\n";
  return out;
}

// Reads `stream` whole and one byte at a time; the two readings must agree.
RequestsRead read(std::string_view stream) {
  const ServerSettings settings = server_limits();
  RequestsRead whole = read_split(stream, settings, [&] { return stream.size(); });
  const RequestsRead bytewise = read_split(stream, settings, [] { return std::size_t{1}; });
  EXPECT_EQ(describe(bytewise), describe(whole)) << "read byte by byte, then whole: " << stream;
  return whole;
}

// The one request `stream` holds, read whole and byte by byte.
Request read_one(std::string_view stream) {
  RequestsRead r = read(stream);
  EXPECT_EQ(r.requests.size(), 1u) << describe(r);
  EXPECT_FALSE(r.refusal) << describe(r);
  EXPECT_FALSE(r.ended_inside) << describe(r);
  return r.requests.empty() ? Request{} : std::move(r.requests.front().request);
}

// A request whose header block (through its empty line) is `size` bytes.
std::string request_of_header_size(std::size_t size) {
  const std::string head = "GET / HTTP/1.1\r\nHost: h\r\nX-Pad: ";
  const std::string end = "\r\n\r\n";
  return head + std::string(size - head.size() - end.size(), 'p') + end;
}

// --- requests, as the server reads them ----------------------------------------------

TEST(HttpRequestReading, ReadsARequestLineHeadersAndABody) {
  const Request r = read_one(
      "POST /pay%20ments/a%2Fb?x=1&y=%41 HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\n"
      "X-Spaces:   padded value \t\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.target, "/pay%20ments/a%2Fb?x=1&y=%41");
  EXPECT_EQ(r.path, "/pay ments/a/b");
  EXPECT_EQ(r.query, "x=1&y=%41");
  EXPECT_EQ(r.body, "hello");
  EXPECT_EQ(r.header("content-type"), "text/plain");
  EXPECT_EQ(r.header("X-SPACES"), "padded value");
  EXPECT_EQ(r.header("missing"), "");
}

TEST(HttpRequestReading, TakesThePathOfAnAbsoluteFormTarget) {
  const Request r = read_one("GET http://example.com:8080/a/b?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
  EXPECT_EQ(r.target, "http://example.com:8080/a/b?q=1");
  EXPECT_EQ(r.path, "/a/b");
  EXPECT_EQ(r.query, "q=1");
}

TEST(HttpRequestReading, ReadsPipelinedRequestsOneAfterAnotherEachWithItsOwnBody) {
  const std::string stream =
      "POST /one HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nfirst"
      "PUT /two HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3;ext=1;name=\"v\"\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: t\r\n\r\n"
      "POST /three HTTP/1.1\r\nHost: h\r\n\r\n"
      "GET /four HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
  const RequestsRead r = read(stream);
  ASSERT_EQ(r.requests.size(), 4u) << describe(r);
  EXPECT_FALSE(r.refusal) << describe(r);
  EXPECT_FALSE(r.ended_inside);
  EXPECT_EQ(r.requests[0].request.path, "/one");
  EXPECT_EQ(r.requests[0].request.body, "first");
  EXPECT_EQ(r.requests[1].request.path, "/two");
  EXPECT_EQ(r.requests[1].request.body, "abc0123456789abcdef");
  EXPECT_EQ(r.requests[2].request.path, "/three");
  EXPECT_EQ(r.requests[2].request.body, "") << "no Content-Length, no body";
  EXPECT_EQ(r.requests[3].request.path, "/four");
  EXPECT_EQ(r.requests[3].request.body, "");
}

TEST(HttpRequestReading, ReadsTheSameRequestsWhereverTheBytesAreSplit) {
  const std::string stream =
      "PUT /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3;ext=1\r\nabc\r\n0\r\nTrailer: t\r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nxy";
  const std::string whole = describe(read(stream));
  for (std::size_t step : {2u, 3u, 7u, 64u}) {
    const RequestsRead split = read_split(stream, server_limits(), [&] { return step; });
    EXPECT_EQ(describe(split), whole) << "step " << step;
  }
  // The first read ends just past a line of the header, or a byte further.
  for (std::size_t first : {17u, 18u, 26u, 27u}) {
    const RequestsRead split = read_split(stream, server_limits(), first_then_rest(first));
    EXPECT_EQ(describe(split), whole) << "first read " << first << " bytes";
  }
}

TEST(HttpRequestReading, ReadsAnEmptyChunkedBodyWithOrWithoutTrailers) {
  Request r = read_one("POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  EXPECT_EQ(r.path, "/a");
  EXPECT_EQ(r.body, "");
  r = read_one(
      "POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0;x\r\nX-Trailer: t\r\n\r\n");
  EXPECT_EQ(r.path, "/b");
  EXPECT_EQ(r.body, "");
}

TEST(HttpRequestReading, ReadsALineFeedInTheBodyAsAnyOtherByte) {
  EXPECT_EQ(read_one("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\na\nb").body, "a\nb");
}

TEST(HttpRequestReading, KeepsAliveByVersionAndConnectionHeader) {
  const auto keeps = [](const std::string& head) {
    const RequestsRead r = read(head + "\r\n");
    EXPECT_EQ(r.requests.size(), 1u) << head << describe(r);
    return !r.requests.empty() && r.requests.front().keep_alive;
  };
  EXPECT_TRUE(keeps("GET / HTTP/1.1\r\nHost: h\r\n"));
  EXPECT_TRUE(keeps("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\n"));
  EXPECT_FALSE(keeps("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"));
  EXPECT_FALSE(keeps("GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, Close\r\n"));
  EXPECT_FALSE(keeps("GET / HTTP/1.0\r\n"));
  EXPECT_TRUE(keeps("GET / HTTP/1.0\r\nConnection: keep-alive\r\n"));
}

TEST(HttpRequestReading, ReadsNothingAfterARequestThatClosesTheConnection) {
  const RequestsRead r = read(
      "GET /one HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
      "GET /two HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(r.requests.size(), 1u) << describe(r);
  EXPECT_EQ(r.requests[0].request.path, "/one");
  EXPECT_FALSE(r.refusal);
}

TEST(HttpRequestReading, StopsAfterTheHeaderSoThatAContinueCanGoOutBeforeTheBody) {
  ServerSettings settings = server_limits();
  RequestReading reading;
  limit(reading, settings);
  beast::flat_buffer in;
  std::size_t sent = 0;
  const std::string head = "POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
  receive(in, head, sent, head.size());
  Refusal refusal;
  ASSERT_EQ(feed_request(reading, in, settings.max_header_bytes, refusal), Fed::header);
  EXPECT_TRUE(expects_continue(reading.parser.get()));
  EXPECT_EQ(feed_request(reading, in, settings.max_header_bytes, refusal), Fed::need_more);
  sent = 0;
  receive(in, "abc", sent, 3);
  ASSERT_EQ(feed_request(reading, in, settings.max_header_bytes, refusal), Fed::done);
  EXPECT_EQ(reading.parser.get().body(), "abc");
  EXPECT_EQ(in.size(), 0u);
}

TEST(HttpRequestReading, ExpectsAContinueOnlyForAnHttp11RequestThatAsksForOne) {
  const auto continues = [](const std::string& head) {
    const RequestsRead r = read(head + "Content-Length: 1\r\n\r\nx");
    EXPECT_EQ(r.requests.size(), 1u) << head << describe(r);
    return !r.requests.empty() && r.requests.front().expects_continue;
  };
  EXPECT_TRUE(continues("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"));
  EXPECT_TRUE(continues("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\n"));
  EXPECT_FALSE(continues("POST / HTTP/1.1\r\nHost: h\r\n"));
  EXPECT_FALSE(continues("POST / HTTP/1.0\r\nExpect: 100-continue\r\n")) << "HTTP/1.0 has no 100 Continue";
  EXPECT_FALSE(continues("POST / HTTP/1.0\r\nExpect: magic\r\n")) << "nor any other expectation to refuse";
}

struct BadCase {
  const char* name;
  std::string bytes;
  int status;
};

TEST(HttpRequestReading, RefusesEachKindOfMalformedRequestWithItsStatusAndAReason) {
  const std::string big(kHeader + 10, 'a');
  std::string many_fields = "GET / HTTP/1.1\r\nHost: h\r\n";
  for (int i = 0; i < 100; ++i) many_fields += "X: " + std::to_string(i) + "\r\n";
  many_fields += "\r\n";
  const std::vector<BadCase> cases = {
      {"garbage request line", "HELLO\r\n\r\n", 400},
      {"two spaces in the request line", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"method not a token", "G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"bare LF", "GET / HTTP/1.1\nHost: h\n\n", 400},
      {"bare LF in a header", "GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n", 400},
      {"bare LF ending the header", "GET / HTTP/1.1\r\nHost: h\r\n\n", 400},
      {"header without a colon", "GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n", 400},
      {"space before the colon", "GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400},
      {"control character in a value", "GET / HTTP/1.1\r\nHost: h\r\nX: a\x01z\r\n\r\n", 400},
      {"NUL in a value", "GET / HTTP/1.1\r\nHost: h\r\nX: a\0z\r\n\r\n"s, 400},
      {"control character in the target", "GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"target not a path", "GET a/b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"absolute-form target without a host", "GET http:///a HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"absolute-form target of a scheme alone", "GET http:// HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"malformed percent-encoding", "GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"truncated percent-encoding", "GET /a%4 HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"encoded NUL in the path", "GET /a%00b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"malformed version", "GET / HTTP/1.x\r\nHost: h\r\n\r\n", 400},
      {"lower-case version", "GET / http/1.1\r\nHost: h\r\n\r\n", 400},
      {"HTTP/2", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
      {"HTTP/0.9", "GET / HTTP/0.9\r\nHost: h\r\n\r\n", 505},
      {"missing Host", "GET / HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"two Hosts in HTTP/1.0", "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"Content-Length not a number", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n", 400},
      {"negative Content-Length", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400},
      {"Content-Length overflow",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400},
      {"Content-Lengths disagree",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"Content-Length, then Transfer-Encoding",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 400},
      {"Transfer-Encoding, then Content-Length",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", 400},
      {"Transfer-Encoding twice",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
       "chunked\r\n\r\n0\r\n\r\n",
       400},
      {"chunked twice in one field",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400},
      {"empty Transfer-Encoding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ,\r\n\r\n0\r\n\r\n", 400},
      {"Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"unsupported transfer coding",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"chunked not final", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 501},
      {"only an unknown coding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"chunk size not hexadecimal", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       400},
      {"chunk size overflows",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\n", 400},
      {"chunk data without its CRLF",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n1\r\nz\r\n0\r\n\r\n",
       400},
      {"chunked body too large", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n",
       413},
      {"chunked body too large over two chunks",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + std::string(0x800, 'b') +
           "\r\n801\r\n",
       413},
      {"body too large", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4097\r\n\r\n", 413},
      {"unknown expectation", "POST / HTTP/1.1\r\nHost: h\r\nExpect: magic\r\nContent-Length: 1\r\n\r\nx",
       417},
      {"more than 100 fields", many_fields, 431},
      {"header block too large", "GET / HTTP/1.1\r\nHost: h\r\nX: " + big + "\r\n\r\n", 431},
      {"header block too large, still arriving", "GET / HTTP/1.1\r\nHost: h\r\nX: " + big, 431},
      {"request line too long", "GET /" + big + " HTTP/1.1\r\nHost: h\r\n\r\n", 414},
      {"request line too long, still arriving", "GET /" + big, 414},
  };
  for (const BadCase& c : cases) {
    const RequestsRead r = read(c.bytes);
    ASSERT_TRUE(r.refusal) << c.name << ": " << describe(r);
    EXPECT_EQ(r.refusal->status, c.status) << c.name << ": " << r.refusal->reason;
    EXPECT_FALSE(r.refusal->reason.empty()) << c.name;
    EXPECT_TRUE(r.requests.empty()) << c.name;
  }
}

TEST(HttpRequestReading, ServesTheRequestsPipelinedBeforeARefusedOne) {
  const RequestsRead r = read(
      "GET /one HTTP/1.1\r\nHost: h\r\n\r\n"
      "GET /two HTTP/1.1\r\n\r\n"
      "GET /three HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(r.requests.size(), 1u) << describe(r);
  EXPECT_EQ(r.requests[0].request.path, "/one");
  ASSERT_TRUE(r.refusal);
  EXPECT_EQ(r.refusal->status, 400);
}

TEST(HttpRequestReading, TellsARequestCutShortFromTheEndBetweenRequests) {
  EXPECT_TRUE(read("GET / HTTP/1.1\r\nHo").ended_inside);
  EXPECT_TRUE(read("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nab").ended_inside);
  EXPECT_TRUE(
      read("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n").ended_inside);
  const RequestsRead between = read("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
  EXPECT_FALSE(between.ended_inside);
  EXPECT_EQ(between.requests.size(), 1u);
  EXPECT_FALSE(read("").ended_inside);
}

// --- the header block's limit ----------------------------------------------------------

TEST(HttpRequestReading, AcceptsAHeaderBlockOfExactlyTheLimitAndRefusesOneByteMore) {
  const std::string at_limit = request_of_header_size(kHeader);
  ASSERT_EQ(at_limit.size(), kHeader);
  EXPECT_EQ(read_one(at_limit).path, "/");

  const RequestsRead over = read(request_of_header_size(kHeader + 1));
  ASSERT_TRUE(over.refusal) << describe(over);
  EXPECT_EQ(over.refusal->status, 431) << over.refusal->reason;
}

TEST(HttpRequestReading, CountsTheHeaderBlockOnlyNotTheBodyNorTheNextRequest) {
  std::string stream = request_of_header_size(kHeader);
  stream.insert(stream.find("\r\n\r\n"), "\r\nContent-Length: 3");
  stream.erase(stream.find("X-Pad: ") + 7, 19);
  ASSERT_EQ(stream.size(), kHeader);
  stream += "abc" + request_of_header_size(kHeader);
  const RequestsRead r = read(stream);
  ASSERT_EQ(r.requests.size(), 2u) << describe(r);
  EXPECT_EQ(r.requests[0].request.body, "abc");
  EXPECT_FALSE(r.refusal);
}

TEST(HttpRequestReading, RefusesALongRequestLine414AndALongHeaderBlock431) {
  // The request line's CRLF ends at the limit: the line fits, the block does not.
  const std::string tail = " HTTP/1.1\r\n";
  const std::string line_at_limit = "GET /" + std::string(kHeader - 5 - tail.size(), 'a') + tail;
  ASSERT_EQ(line_at_limit.size(), kHeader);
  RequestsRead r = read(line_at_limit + "Host: h\r\n\r\n");
  ASSERT_TRUE(r.refusal) << describe(r);
  EXPECT_EQ(r.refusal->status, 431) << r.refusal->reason;

  const std::string line_over = "GET /" + std::string(kHeader - 4 - tail.size(), 'a') + tail;
  r = read(line_over + "Host: h\r\n\r\n");
  ASSERT_TRUE(r.refusal) << describe(r);
  EXPECT_EQ(r.refusal->status, 414) << r.refusal->reason;
}

TEST(HttpRequestReading, RefusesAHeaderBlockOverTheLimitWhateverLinesArriveFirst) {
  const std::string stream = request_of_header_size(kHeader + 1);
  // The request line alone, then the rest.
  RequestsRead r = read_split(stream, server_limits(), first_then_rest(stream.find("\r\n") + 2));
  EXPECT_EQ(r.refusal ? r.refusal->status : 0, 431) << describe(r);

  // Each read a line and the first byte of the next (fewer fields than the
  // count limit, and no end to the header).
  std::string lines = "GET / HTTP/1.1\r\nHost: h\r\n";
  while (lines.size() < 4 * kHeader) lines += "X-Line: " + std::string(200, 'v') + "\r\n";
  r = read_split(lines, server_limits(), a_line_and_a_byte(lines));
  EXPECT_EQ(r.refusal ? r.refusal->status : 0, 431) << (r.ended_inside ? "read to the end" : "");
}

// --- the checks of a header on their own ---------------------------------------------

BeastRequest request_header(unsigned version) {
  BeastRequest req;
  req.version(version);
  req.method(bhttp::verb::post);
  req.target("/");
  if (version == 11) req.set(bhttp::field::host, "h");
  return req;
}

TEST(HttpHeaderCheck, PassesAPlainRequestOfEitherVersion) {
  EXPECT_EQ(check_header(request_header(11)), std::nullopt);
  EXPECT_EQ(check_header(request_header(10)), std::nullopt);
  BeastRequest chunked = request_header(11);
  chunked.set(bhttp::field::transfer_encoding, "Chunked");
  EXPECT_EQ(check_header(chunked), std::nullopt);
}

TEST(HttpHeaderCheck, RefusesAVersionOtherThanHttp1) {
  const auto refused = check_header(request_header(20));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 505);
}

TEST(HttpHeaderCheck, AcceptsExactlyAHundredFields) {
  BeastRequest req = request_header(11);
  for (int i = 1; i < 100; ++i) req.insert("X-" + std::to_string(i), "v");
  EXPECT_EQ(check_header(req), std::nullopt);
  req.insert("X-100", "v");
  const auto refused = check_header(req);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 431);
}

TEST(HttpHeaderCheck, RefusesAnExpectationOtherThanContinueOnlyInHttp11) {
  BeastRequest req = request_header(11);
  req.set(bhttp::field::expect, "100-continue, magic");
  const auto refused = check_header(req);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 417);
  EXPECT_FALSE(expects_continue(req));

  BeastRequest old = request_header(10);
  old.set(bhttp::field::expect, "magic");
  EXPECT_EQ(check_header(old), std::nullopt);
  EXPECT_FALSE(expects_continue(old));
}

TEST(HttpRefusals, GiveEachBeastErrorTheServersStatus) {
  EXPECT_EQ(refusal_for(bhttp::error::body_limit, "").status, 413);
  EXPECT_EQ(refusal_for(bhttp::error::header_limit, "").status, 431);
  EXPECT_EQ(refusal_for(bhttp::error::bad_transfer_encoding, "").status, 400) << "framing two ways";
  EXPECT_EQ(refusal_for(bhttp::error::partial_message, "").status, 400);
  EXPECT_EQ(refusal_for(bhttp::error::bad_method, "").status, 400);
  EXPECT_EQ(refusal_for(bhttp::error::bad_version, "GET / HTTP/3.0\r\n").status, 505);
  EXPECT_EQ(refusal_for(bhttp::error::bad_version, "GET / HTTP/3.0").status, 400)
      << "no line end yet";
  EXPECT_EQ(refusal_for(bhttp::error::bad_version, "GET / HTTP/1.1\nHost: h\n\n").status, 400);
  for (const auto e : {bhttp::error::body_limit, bhttp::error::bad_method, bhttp::error::bad_version})
    EXPECT_FALSE(refusal_for(e, "").reason.empty());
}

TEST(HttpRefusals, GiveTheHeaderLimitsStatusFromTheBytesAloneWhateverHasArrived) {
  const auto status = [](std::string_view data, std::size_t max) {
    RequestReading reading;
    ServerSettings settings = server_limits();
    settings.max_header_bytes = max;
    limit(reading, settings);
    beast::flat_buffer in;
    std::size_t sent = 0;
    receive(in, data, sent, data.size());
    Refusal r;
    if (feed_request(reading, in, max, r) != Fed::refused) return 0;
    EXPECT_FALSE(r.reason.empty());
    return r.status;
  };
  EXPECT_EQ(status("GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27), 0);
  EXPECT_EQ(status("GET / HTTP/1.1\r\nHost: h\r\n\r\nbody after it", 27), 0);
  EXPECT_EQ(status("GET / HTTP/1.1\r\nHost: h\r\n", 27), 0) << "it may yet end within";
  EXPECT_EQ(status("GET / HTTP/1.1\r\nHost: h\r\n\r\n", 26), 431);
  EXPECT_EQ(status("GET / HTTP/1.1\r\nHost: h\r\nX", 26), 431);
  EXPECT_EQ(status("GET / HTTP/1.1\r\n", 16), 431);
  EXPECT_EQ(status("GET / HTTP/1.1\r\n", 15), 414);
  EXPECT_EQ(status("GET /aaaaaaaaaaaa", 16), 414);
  EXPECT_EQ(status("GET /aaaaaaaaaa", 16), 0);
}

// --- requests, as handlers see them ----------------------------------------------------

TEST(HttpRequestConversion, KeepsTheHeadersInOrderWithTheirNamesAsSent) {
  BeastRequest in = request_header(11);
  in.target("/a%2Fb?x=%41");
  in.insert("x-lower", "1");
  in.insert("X-Twice", "a");
  in.insert("X-Twice", "b");
  in.body() = "payload";
  Request out;
  ASSERT_EQ(to_request(std::move(in), out), std::nullopt);
  EXPECT_EQ(out.method, "POST");
  EXPECT_EQ(out.path, "/a/b");
  EXPECT_EQ(out.query, "x=%41");
  EXPECT_EQ(out.body, "payload");
  const Fields expected = {{"Host", "h"}, {"x-lower", "1"}, {"X-Twice", "a"}, {"X-Twice", "b"}};
  EXPECT_EQ(out.headers, expected);
}

TEST(HttpRequestConversion, RefusesATargetThatIsNotAPathOrIsBadlyEncoded) {
  for (const char* target : {"*", "a/b", "http:///x", "/a%zz", "/a%00"}) {
    BeastRequest in = request_header(11);
    in.target(target);
    Request out;
    const auto refused = to_request(std::move(in), out);
    ASSERT_TRUE(refused) << target;
    EXPECT_EQ(refused->status, 400) << target;
    EXPECT_FALSE(refused->reason.empty());
  }
}

// --- responses, as the server writes them ----------------------------------------------

constexpr std::string_view kDate = "Sun, 06 Nov 1994 08:49:37 GMT";

TEST(HttpResponseWriting, WritesStatusLengthDateAndConnection) {
  Response r = Response::json(200, "{}");
  r.headers.emplace_back("X-Id", "7");
  auto res = to_beast(Response(r), 11, false, true, kDate);
  ASSERT_TRUE(res);
  std::string wire = to_wire(*res);
  EXPECT_EQ(wire.substr(0, 17), "HTTP/1.1 200 OK\r\n");
  EXPECT_NE(wire.find("\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"), std::string::npos) << wire;
  EXPECT_NE(wire.find("\r\nContent-Type: application/json\r\n"), std::string::npos) << wire;
  EXPECT_NE(wire.find("\r\nContent-Length: 2\r\n"), std::string::npos) << wire;
  EXPECT_NE(wire.find("\r\nConnection: close\r\n"), std::string::npos) << wire;
  EXPECT_NE(wire.find("\r\nX-Id: 7\r\n"), std::string::npos) << wire;
  EXPECT_EQ(wire.substr(wire.size() - 6), "\r\n\r\n{}");

  res = to_beast(Response(r), 11, false, false, {});
  ASSERT_TRUE(res);
  wire = to_wire(*res);
  EXPECT_EQ(wire.find("Date:"), std::string::npos) << wire;
  EXPECT_EQ(wire.find("Connection:"), std::string::npos) << "keep-alive is HTTP/1.1's default: " << wire;

  res = to_beast(Response(r), 10, false, false, {});
  ASSERT_TRUE(res);
  wire = to_wire(*res);
  EXPECT_EQ(wire.substr(0, 17), "HTTP/1.0 200 OK\r\n");
  EXPECT_NE(wire.find("\r\nConnection: keep-alive\r\n"), std::string::npos) << wire;
}

TEST(HttpResponseWriting, KeepsTheLengthButNotTheBodyOfAnAnswerToHead) {
  auto res = to_beast(Response::text(200, "twelve bytes"), 11, true, false, {});
  ASSERT_TRUE(res);
  const std::string wire = to_wire(*res);
  EXPECT_NE(wire.find("\r\nContent-Length: 12\r\n"), std::string::npos) << wire;
  EXPECT_EQ(wire.substr(wire.size() - 4), "\r\n\r\n") << wire;
}

TEST(HttpResponseWriting, FramesTheBodyItselfWhateverFramingAHandlerWrote) {
  const Fields framings[] = {{{"Content-Length", "99"}}, {{"Transfer-Encoding", "chunked"}}};
  for (const Fields& framing : framings) {
    Response r = Response::text(200, "abc");
    r.headers = framing;
    auto res = to_beast(std::move(r), 11, false, false, {});
    ASSERT_TRUE(res);
    const std::string wire = to_wire(*res);
    EXPECT_NE(wire.find("\r\nContent-Length: 3\r\n"), std::string::npos) << wire;
    EXPECT_EQ(wire.find("99"), std::string::npos) << wire;
    EXPECT_EQ(wire.find("chunked"), std::string::npos) << wire;
  }
}

TEST(HttpResponseWriting, WritesNeitherBodyNorLengthFor204Or304) {
  for (int status : {204, 304}) {
    for (const char* body : {"", "ignored"}) {
      auto res = to_beast(Response::json(status, body), 11, false, false, {});
      ASSERT_TRUE(res) << status;
      const std::string wire = to_wire(*res);
      EXPECT_EQ(wire.find("Content-Length"), std::string::npos) << wire;
      EXPECT_EQ(wire.find("Transfer-Encoding"), std::string::npos) << wire;
      EXPECT_EQ(wire.substr(wire.size() - 4), "\r\n\r\n") << wire;
    }
  }
}

TEST(HttpResponseWriting, RefusesAHeaderOrStatusThatCouldBreakTheFraming) {
  Response r = Response::json(200, "{}");
  r.headers = {{"X-Evil", "a\r\nInjected: yes"}};
  EXPECT_EQ(to_beast(Response(r), 11, false, false, {}), nullptr);
  r.headers = {{"X-Evil", "a\nb"}};
  EXPECT_EQ(to_beast(Response(r), 11, false, false, {}), nullptr);
  r.headers = {{"Bad Name", "v"}};
  EXPECT_EQ(to_beast(Response(r), 11, false, false, {}), nullptr);
  r.headers = {};
  r.content_type = "text/plain\r\nX: y";
  EXPECT_EQ(to_beast(Response(r), 11, false, false, {}), nullptr);
  for (int status : {42, 199, 1000, -200}) {
    EXPECT_EQ(to_beast(Response::json(status, ""), 11, false, false, {}), nullptr) << status;
  }
  EXPECT_NE(to_beast(Response::json(200, ""), 11, false, false, {}), nullptr);
  EXPECT_NE(to_beast(Response::json(999, ""), 11, false, false, {}), nullptr);
}

// --- requests, as the client writes them -----------------------------------------------

TEST(HttpClientRequestWriting, WritesHostTypeAndLengthThenTheBody) {
  ClientRequest req;
  req.method = "POST";
  req.target = "/ok?x=1";
  req.body = "xy";
  req.content_type = "text/plain";
  req.headers = {{"X-Id", "7"}};
  const auto wire = request_wire(req, "h:1");
  ASSERT_TRUE(wire);
  EXPECT_EQ(*wire,
            "POST /ok?x=1 HTTP/1.1\r\nHost: h:1\r\nX-Id: 7\r\nContent-Type: text/plain\r\n"
            "Content-Length: 2\r\n\r\nxy");
}

TEST(HttpClientRequestWriting, WritesContentLengthForABodyOrAMethodThatCarriesOne) {
  const auto length_of = [](const std::string& method, const std::string& body) -> std::string {
    ClientRequest req;
    req.method = method;
    req.body = body;
    const auto wire = request_wire(req, "h");
    if (!wire) return "refused";
    const std::size_t at = wire->find("Content-Length: ");
    if (at == std::string::npos) return "none";
    return wire->substr(at + 16, wire->find("\r\n", at) - at - 16);
  };
  EXPECT_EQ(length_of("GET", ""), "none");
  EXPECT_EQ(length_of("DELETE", ""), "none");
  EXPECT_EQ(length_of("HEAD", ""), "none");
  EXPECT_EQ(length_of("POST", ""), "0");
  EXPECT_EQ(length_of("PUT", ""), "0");
  EXPECT_EQ(length_of("PATCH", ""), "0");
  EXPECT_EQ(length_of("GET", "abc"), "3");
  EXPECT_EQ(length_of("DELETE", "x"), "1");
  EXPECT_EQ(length_of("POST", "hello"), "5");
}

TEST(HttpClientRequestWriting, RefusesAMethodTargetOrHeaderThatIsNotValidHttp) {
  const auto refused = [](const std::function<void(ClientRequest&)>& change) {
    ClientRequest req;
    change(req);
    return !request_wire(req, "h").has_value();
  };
  EXPECT_FALSE(refused([](ClientRequest&) {}));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.method = "G T"; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.method = ""; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.target = "/a b"; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.target = "/a\r\nX: y"; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.target = "/a\x7f"; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.target = ""; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.headers = {{"X", "a\nb"}}; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.headers = {{"Bad Name", "v"}}; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.headers = {{"host", "other"}}; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.headers = {{"Content-Length", "9"}}; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.headers = {{"transfer-encoding", "chunked"}}; }));
  EXPECT_TRUE(refused([](ClientRequest& r) { r.content_type = "a\r\nb"; }));
}

TEST(HttpClientRequestWriting, WritesARequestTheServerReadsBackTheSame) {
  ClientRequest req;
  req.method = "PATCH";
  req.target = "/a%20b/c?q=%41";
  req.body = "body\r\n\r\nGET / HTTP/1.1";
  req.headers = {{"X-Id", "7"}};
  const auto wire = request_wire(req, "h");
  ASSERT_TRUE(wire);
  const Request back = read_one(*wire);
  EXPECT_EQ(back.method, req.method);
  EXPECT_EQ(back.target, req.target);
  EXPECT_EQ(back.path, "/a b/c");
  EXPECT_EQ(back.body, req.body);
  EXPECT_EQ(back.header("x-id"), "7");
}

// --- responses, as the client reads them -----------------------------------------------

ClientSettings client_limits() {
  ClientSettings s;
  s.max_response_header_bytes = kHeader;
  s.max_response_body_bytes = kBody;
  return s;
}

// What the client reads of one response.
struct ResponseRead {
  std::optional<Response> response;
  beast::error_code error;    // set when refused
  std::size_t left_over = 0;  // bytes after the response
};

// Reads one response as the client does (client_connection.cpp), `next()`
// bytes arriving at a time; `eof`: the server closes the connection after
// the bytes.
ResponseRead read_response_split(std::string_view stream, bool head, bool eof,
                                    const std::function<std::size_t()>& next) {
  const ClientSettings settings = client_limits();
  ResponseRead out;
  std::optional<detail::ResponseReading> reading;
  reading.emplace();
  limit(*reading, settings, head);
  beast::flat_buffer in;
  std::size_t sent = 0;
  for (;;) {
    beast::error_code ec;
    const Fed fed = feed_response(reading, in, settings, head, ec);
    if (fed == Fed::refused) {
      out.error = ec;
      return out;
    }
    if (fed != Fed::done) {
      if (sent < stream.size()) {
        receive(in, stream, sent, next());
        continue;
      }
      if (!eof || !reading->parser.got_some()) return out;
      reading->parser.put_eof(ec);
      if (ec) {
        out.error = ec;
        return out;
      }
      if (!reading->parser.is_done()) return out;
    }
    out.response = to_response(reading->parser.release());
    out.left_over = stream.size() - sent + in.size();
    return out;
  }
}

// Reads one response whole and byte by byte; the two readings must agree.
ResponseRead read_response(std::string_view stream, bool head = false, bool eof = false) {
  ResponseRead whole = read_response_split(stream, head, eof, [&] { return stream.size(); });
  const ResponseRead bytewise = read_response_split(stream, head, eof, [] { return std::size_t{1}; });
  EXPECT_EQ(bytewise.response.has_value(), whole.response.has_value()) << stream;
  EXPECT_EQ(bytewise.error, whole.error) << stream;
  EXPECT_EQ(bytewise.left_over, whole.left_over) << stream;
  if (whole.response && bytewise.response) {
    EXPECT_EQ(bytewise.response->status, whole.response->status);
    EXPECT_EQ(bytewise.response->headers, whole.response->headers);
    EXPECT_EQ(bytewise.response->body, whole.response->body);
  }
  return whole;
}

TEST(HttpResponseReading, ReadsALengthDelimitedResponseAndStopsAtItsEnd) {
  const ResponseRead r =
      read_response("HTTP/1.1 201 Created\r\nContent-Type: x/y\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1");
  ASSERT_TRUE(r.response) << r.error.message();
  EXPECT_EQ(r.response->status, 201);
  EXPECT_EQ(r.response->content_type, "x/y");
  EXPECT_EQ(r.response->header("content-length"), "3");
  EXPECT_EQ(r.response->body, "abc");
  EXPECT_EQ(r.left_over, 8u);
}

TEST(HttpResponseReading, ReadsAChunkedResponseWithExtensionsAndTrailers) {
  const ResponseRead r = read_response(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nab\r\n1\r\nc\r\n0\r\nX-Trailer: "
      "t\r\n\r\n");
  ASSERT_TRUE(r.response) << r.error.message();
  EXPECT_EQ(r.response->body, "abc");
  EXPECT_EQ(r.response->content_type, "");
  EXPECT_EQ(r.left_over, 0u);
}

TEST(HttpResponseReading, ReadsAnEmptyChunkedBody) {
  const ResponseRead r = read_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  ASSERT_TRUE(r.response) << r.error.message();
  EXPECT_EQ(r.response->body, "");
  EXPECT_EQ(r.left_over, 0u);
}

TEST(HttpResponseReading, SkipsA100ContinueBeforeTheRealResponse) {
  const ResponseRead r = read_response(
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  ASSERT_TRUE(r.response) << r.error.message();
  EXPECT_EQ(r.response->status, 200);
  EXPECT_EQ(r.response->body, "ok");
}

TEST(HttpResponseReading, ReadsNoBodyAfterAHeadRequestWhateverTheLengthSays) {
  const ResponseRead r =
      read_response("HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", true);
  ASSERT_TRUE(r.response) << r.error.message();
  EXPECT_EQ(r.response->status, 200);
  EXPECT_EQ(r.response->header("Content-Length"), "20");
  EXPECT_EQ(r.response->body, "");
  EXPECT_EQ(r.left_over, 27u) << "the next response is not this one's body";

  const ResponseRead no_content = read_response("HTTP/1.1 204 No Content\r\n\r\n");
  ASSERT_TRUE(no_content.response);
  EXPECT_EQ(no_content.response->status, 204);
}

TEST(HttpResponseReading, ReadsABodyDelimitedByTheConnectionsEndOnlyOnceItEnds) {
  const std::string stream = "HTTP/1.0 200 OK\r\n\r\nuntil the end";
  const ResponseRead open = read_response(stream);
  EXPECT_FALSE(open.response);
  EXPECT_FALSE(open.error);
  const ResponseRead closed = read_response(stream, false, true);
  ASSERT_TRUE(closed.response) << closed.error.message();
  EXPECT_EQ(closed.response->body, "until the end");
}

TEST(HttpResponseReading, RefusesAResponseCutShortByTheConnectionsEnd) {
  const ResponseRead r = read_response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", false, true);
  EXPECT_FALSE(r.response);
  EXPECT_EQ(r.error, beast::error_code(bhttp::error::partial_message));
}

TEST(HttpResponseReading, RefusesAHeaderOverTheClientsLimitHoweverItArrives) {
  std::string stream = "HTTP/1.1 204 No Content\r\nX-Pad: ";
  stream += std::string(kHeader - stream.size() - 4, 'p') + "\r\n\r\n";
  ASSERT_EQ(stream.size(), kHeader);
  const ResponseRead at_limit = read_response(stream);
  ASSERT_TRUE(at_limit.response) << at_limit.error.message();

  stream.insert(40, "p");
  const ResponseRead over = read_response(stream);
  EXPECT_FALSE(over.response);
  EXPECT_EQ(over.error, beast::error_code(bhttp::error::header_limit));
  const ResponseRead still_arriving = read_response(stream.substr(0, kHeader + 1));
  EXPECT_EQ(still_arriving.error, beast::error_code(bhttp::error::header_limit));

  // Each read a line and the first byte of the next.
  std::string lines = "HTTP/1.1 200 OK\r\n";
  while (lines.size() < 4 * kHeader) lines += "X-Line: " + std::string(200, 'v') + "\r\n";
  const ResponseRead line_by_line = read_response_split(lines, false, false, a_line_and_a_byte(lines));
  EXPECT_EQ(line_by_line.error, beast::error_code(bhttp::error::header_limit));
}

TEST(HttpResponseReading, RefusesMalformedResponsesAndOnesTooLarge) {
  for (const std::string bad :
       {"HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/2.0 200 OK\r\n\r\n", "SMTP ready\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nq\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 4097\r\n\r\n", "HTTP/1.1 200 OK\nContent-Length: 0\n\n"}) {
    const ResponseRead r = read_response(bad);
    EXPECT_FALSE(r.response) << bad;
    EXPECT_TRUE(r.error) << bad;
  }
}

TEST(HttpResponseReading, HandsOverEveryHeaderAsReceived) {
  BeastResponse in;
  in.result(200);
  in.set(bhttp::field::content_type, "text/plain");
  in.insert("X-Twice", "a");
  in.insert("X-Twice", "b");
  in.body() = "text";
  const Response r = to_response(std::move(in));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain");
  EXPECT_EQ(r.body, "text");
  const Fields expected = {{"Content-Type", "text/plain"}, {"X-Twice", "a"}, {"X-Twice", "b"}};
  EXPECT_EQ(r.headers, expected);
}

}  // namespace
}  // namespace troupe::http::detail
