// The HTTP/1.1 parsers and serialisers on their own: no sockets.

#include "parser.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace troupe::http::detail {
namespace {

constexpr std::size_t kHeader = 1024;
constexpr std::size_t kBody = 4096;

struct Parsed {
  RequestParser::Status status = RequestParser::Status::need_more;
  Request request;
  std::size_t consumed = 0;
  bool keep_alive = false;
  ParseError error;
};

// Feeds `bytes` to a fresh parser in pieces of `step` bytes (0: all at once).
Parsed parse_request(const std::string& bytes, std::size_t step = 0, std::size_t max_body = kBody) {
  RequestParser p(kHeader, max_body);
  Parsed out;
  std::size_t have = step == 0 ? bytes.size() : 0;
  for (;;) {
    if (step != 0) have = std::min(bytes.size(), have + step);
    out.status = p.parse(std::string_view(bytes).substr(0, have));
    if (out.status != RequestParser::Status::need_more || have == bytes.size()) break;
  }
  if (out.status == RequestParser::Status::complete) {
    out.consumed = p.consumed();
    out.keep_alive = p.keep_alive();
    out.request = p.take();
  } else if (out.status == RequestParser::Status::error) {
    out.error = p.error();
  }
  return out;
}

TEST(HttpRequestParser, ParsesARequestLineHeadersAndABody) {
  const std::string bytes =
      "POST /pay%20ments/a%2Fb?x=1&y=%41 HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\n"
      "X-Spaces:   padded value \t\r\nContent-Length: 5\r\n\r\nhello";
  const Parsed p = parse_request(bytes);
  ASSERT_EQ(p.status, RequestParser::Status::complete) << p.error.reason;
  EXPECT_EQ(p.request.method, "POST");
  EXPECT_EQ(p.request.target, "/pay%20ments/a%2Fb?x=1&y=%41");
  EXPECT_EQ(p.request.path, "/pay ments/a/b");
  EXPECT_EQ(p.request.query, "x=1&y=%41");
  EXPECT_EQ(p.request.body, "hello");
  EXPECT_EQ(p.request.header("content-type"), "text/plain");
  EXPECT_EQ(p.request.header("X-SPACES"), "padded value");
  EXPECT_EQ(p.request.header("missing"), "");
  EXPECT_EQ(p.consumed, bytes.size());
  EXPECT_TRUE(p.keep_alive);
}

TEST(HttpRequestParser, ParsesTheSameRequestWhateverTheBytesAreSplitInto) {
  const std::string bytes =
      "\r\nPUT /a/b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: t\r\n\r\n";
  const Parsed whole = parse_request(bytes);
  ASSERT_EQ(whole.status, RequestParser::Status::complete) << whole.error.reason;
  EXPECT_EQ(whole.request.body, "abc0123456789abcdef");
  for (std::size_t step : {1u, 2u, 3u, 7u, 64u}) {
    const Parsed split = parse_request(bytes, step);
    ASSERT_EQ(split.status, RequestParser::Status::complete) << "step " << step;
    EXPECT_EQ(split.request.body, whole.request.body);
    EXPECT_EQ(split.consumed, bytes.size());
  }
}

TEST(HttpRequestParser, StopsAtTheEndOfTheFirstOfTwoPipelinedRequests) {
  const std::string first = "GET /one HTTP/1.1\r\nHost: h\r\n\r\n";
  const std::string second = "GET /two HTTP/1.1\r\nHost: h\r\n\r\n";
  const Parsed p = parse_request(first + second);
  ASSERT_EQ(p.status, RequestParser::Status::complete);
  EXPECT_EQ(p.request.path, "/one");
  EXPECT_EQ(p.consumed, first.size());
}

TEST(HttpRequestParser, ARequestWithoutContentLengthHasNoBody) {
  const Parsed p = parse_request("POST /x HTTP/1.1\r\nHost: h\r\n\r\nnot a body");
  ASSERT_EQ(p.status, RequestParser::Status::complete);
  EXPECT_EQ(p.request.body, "");
  EXPECT_EQ(p.consumed, std::string("POST /x HTTP/1.1\r\nHost: h\r\n\r\n").size());
}

TEST(HttpRequestParser, KeepsAliveByVersionAndConnectionHeader) {
  EXPECT_TRUE(parse_request("GET / HTTP/1.1\r\nHost: h\r\n\r\n").keep_alive);
  EXPECT_FALSE(parse_request("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").keep_alive);
  EXPECT_FALSE(parse_request("GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, Close\r\n\r\n").keep_alive);
  EXPECT_FALSE(parse_request("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(parse_request("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
}

TEST(HttpRequestParser, AcceptsAnAbsoluteFormTarget) {
  const Parsed p = parse_request("GET http://example.com:8080/a/b?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
  ASSERT_EQ(p.status, RequestParser::Status::complete) << p.error.reason;
  EXPECT_EQ(p.request.path, "/a/b");
  EXPECT_EQ(p.request.query, "q=1");
}

TEST(HttpRequestParser, ReportsExpectContinueOnceTheHeadersAreIn) {
  RequestParser p(kHeader, kBody);
  const std::string head = "POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
  EXPECT_EQ(p.parse(head), RequestParser::Status::need_more);
  EXPECT_TRUE(p.headers_complete());
  EXPECT_TRUE(p.expects_continue());
  EXPECT_EQ(p.parse(head + "abc"), RequestParser::Status::complete);
  EXPECT_EQ(p.take().body, "abc");
}

struct BadCase {
  const char* name;
  std::string bytes;
  int status;
};

// proves: X1
TEST(HttpRequestParser, RefusesEachKindOfMalformedRequestWithItsStatusAndAReason) {
  const std::string big(kHeader + 10, 'a');
  const std::vector<BadCase> cases = {
      {"garbage request line", "HELLO\r\n\r\n", 400},
      {"two spaces in the request line", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"method not a token", "G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"bare LF", "GET / HTTP/1.1\nHost: h\n\n", 400},
      {"bare LF in a header", "GET / HTTP/1.1\r\nHost: h\n\r\n", 400},
      {"header without a colon", "GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n", 400},
      {"space before the colon", "GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400},
      {"obsolete line folding", "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", 400},
      {"control character in a value", std::string("GET / HTTP/1.1\r\nHost: h\r\nX: a\x01z\r\n\r\n"), 400},
      {"NUL in a value", std::string("GET / HTTP/1.1\r\nHost: h\r\nX: a") + std::string(1, '\0') + "\r\n\r\n",
       400},
      {"control character in the target", "GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"target not a path", "GET a/b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"malformed percent-encoding", "GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"encoded NUL in the path", "GET /a%00b HTTP/1.1\r\nHost: h\r\n\r\n", 400},
      {"malformed version", "GET / HTTP/1.x\r\nHost: h\r\n\r\n", 400},
      {"lower-case version", "GET / http/1.1\r\nHost: h\r\n\r\n", 400},
      {"HTTP/2", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
      {"missing Host", "GET / HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"Content-Length not a number", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n", 400},
      {"negative Content-Length", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400},
      {"Content-Length overflow",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400},
      {"Content-Lengths disagree",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"Transfer-Encoding and Content-Length",
       "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"unsupported transfer coding",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"chunked not final", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400},
      {"chunked twice", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400},
      {"Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"chunk size not hexadecimal", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       400},
      {"chunk size overflows",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\n", 400},
      {"chunk data without its CRLF",
       "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n", 400},
      {"chunked body too large", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n",
       413},
      {"body too large", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4097\r\n\r\n", 413},
      {"unknown expectation", "POST / HTTP/1.1\r\nHost: h\r\nExpect: magic\r\nContent-Length: 1\r\n\r\n",
       417},
      {"header block too large", "GET / HTTP/1.1\r\nHost: h\r\nX: " + big + "\r\n\r\n", 431},
      {"header block too large, still arriving", "GET / HTTP/1.1\r\nHost: h\r\nX: " + big, 431},
      {"request line too long", "GET /" + big + " HTTP/1.1\r\nHost: h\r\n\r\n", 414},
      {"request line too long, still arriving", "GET /" + big, 414},
  };
  for (const BadCase& c : cases) {
    for (std::size_t step : {0u, 1u}) {
      const Parsed p = parse_request(c.bytes, step);
      ASSERT_EQ(p.status, RequestParser::Status::error) << c.name << " (step " << step << ")";
      EXPECT_EQ(p.error.status, c.status) << c.name << ": " << p.error.reason;
      EXPECT_FALSE(p.error.reason.empty()) << c.name;
    }
  }
}

// proves: X1
TEST(HttpRequestParser, NeverCrashesOrOverrunsOnRandomBytes) {
  std::mt19937_64 rng(7);
  const std::string alphabet =
      "GET POST / HTTP/1.1\r\n:;Host Content-Length Transfer-Encoding chunked 0123456789abcdef%\x00\xff";
  for (int round = 0; round < 3000; ++round) {
    std::string bytes;
    const std::size_t n = rng() % 600;
    for (std::size_t i = 0; i < n; ++i)
      bytes.push_back(rng() % 4 == 0 ? static_cast<char>(rng()) : alphabet[rng() % alphabet.size()]);
    const Parsed p = parse_request(bytes, 1 + rng() % 16);
    if (p.status == RequestParser::Status::complete) {
      EXPECT_LE(p.consumed, bytes.size());
    }
    if (p.status == RequestParser::Status::error) {
      EXPECT_GE(p.error.status, 400);
    }
  }
}

Response parse_response(const std::string& bytes, bool head = false, bool eof = false,
                        ResponseParser::Status* status = nullptr, bool* keep_alive = nullptr) {
  ResponseParser p(kHeader, kBody);
  p.expect(head);
  ResponseParser::Status st = eof ? p.finish(bytes) : p.parse(bytes);
  if (status) *status = st;
  if (keep_alive) *keep_alive = p.keep_alive();
  return st == ResponseParser::Status::complete ? p.take() : Response{};
}

TEST(HttpResponseParser, FramesBodiesByLengthByChunksAndByTheConnectionsEnd) {
  ResponseParser::Status st;
  bool keep = false;
  Response r = parse_response("HTTP/1.1 201 Created\r\nContent-Type: x/y\r\nContent-Length: 3\r\n\r\nabc",
                              false, false, &st, &keep);
  ASSERT_EQ(st, ResponseParser::Status::complete);
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.content_type, "x/y");
  EXPECT_EQ(r.body, "abc");
  EXPECT_TRUE(keep);

  r = parse_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
                     false, false, &st);
  ASSERT_EQ(st, ResponseParser::Status::complete);
  EXPECT_EQ(r.body, "abc");

  const std::string close_delimited = "HTTP/1.0 200 OK\r\n\r\nuntil the end";
  parse_response(close_delimited, false, false, &st);
  EXPECT_EQ(st, ResponseParser::Status::need_more);
  r = parse_response(close_delimited, false, true, &st, &keep);
  ASSERT_EQ(st, ResponseParser::Status::complete);
  EXPECT_EQ(r.body, "until the end");
  EXPECT_FALSE(keep);
}

TEST(HttpResponseParser, SkipsInterimResponsesAndKnowsHeadAnd204HaveNoBody) {
  ResponseParser::Status st;
  Response r = parse_response("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                              false, false, &st);
  ASSERT_EQ(st, ResponseParser::Status::complete);
  EXPECT_EQ(r.body, "ok");
  r = parse_response("HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", true, false, &st);
  EXPECT_EQ(st, ResponseParser::Status::complete);
  r = parse_response("HTTP/1.1 204 No Content\r\n\r\n", false, false, &st);
  EXPECT_EQ(st, ResponseParser::Status::complete);
}

TEST(HttpResponseParser, RefusesMalformedResponses) {
  for (const std::string bad :
       {"HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/2 200 OK\r\n\r\n", "SMTP ready\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nq\r\n",
        "HTTP/1.1 101 Switching Protocols\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n"}) {
    ResponseParser::Status st;
    parse_response(bad, false, false, &st);
    EXPECT_EQ(st, ResponseParser::Status::error) << bad;
  }
  ResponseParser::Status st;
  parse_response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", false, true, &st);
  EXPECT_EQ(st, ResponseParser::Status::error) << "truncated";
}

TEST(HttpSerialize, WritesStatusLengthDateAndConnectionHeaders) {
  Response r = Response::json(200, "{}");
  r.headers.emplace_back("X-Id", "7");
  std::string out;
  ASSERT_TRUE(serialize_response(r, false, true, false, "Sun, 06 Nov 1994 08:49:37 GMT", out));
  EXPECT_EQ(out,
            "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\nConnection: close\r\nX-Id: 7\r\n\r\n{}");
  out.clear();
  ASSERT_TRUE(serialize_response(r, true, false, true, {}, out));
  EXPECT_EQ(out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            "Connection: keep-alive\r\nX-Id: 7\r\n\r\n");
  out.clear();
  ASSERT_TRUE(serialize_response(Response::json(204, "ignored"), false, false, false, {}, out));
  EXPECT_EQ(out, "HTTP/1.1 204 No Content\r\n\r\n");
  EXPECT_EQ(http_date(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
}

TEST(HttpSerialize, RefusesAHeaderOrStatusThatCouldBreakTheFraming) {
  std::string out;
  Response r = Response::json(200, "{}");
  r.headers.emplace_back("X-Evil", "a\r\nInjected: yes");
  EXPECT_FALSE(serialize_response(r, false, false, false, {}, out));
  r.headers = {{"Bad Name", "v"}};
  EXPECT_FALSE(serialize_response(r, false, false, false, {}, out));
  r.headers = {{"Content-Length", "99"}};
  EXPECT_FALSE(serialize_response(r, false, false, false, {}, out));
  EXPECT_FALSE(serialize_response(Response::json(42, ""), false, false, false, {}, out));
  EXPECT_TRUE(out.empty());

  ClientRequest req;
  req.target = "/a b";
  EXPECT_FALSE(serialize_request(req, "h", out));
  req.target = "/ok";
  req.headers = {{"X", "a\nb"}};
  EXPECT_FALSE(serialize_request(req, "h", out));
  req.headers = {};
  req.method = "POST";
  req.body = "xy";
  req.content_type = "text/plain";
  ASSERT_TRUE(serialize_request(req, "h:1", out));
  EXPECT_EQ(out, "POST /ok HTTP/1.1\r\nHost: h:1\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nxy");
}

TEST(HttpMessage, DecodesQueryParametersAndEscapesErrorBodiesAsJson) {
  Request req;
  req.query = "a=1&name=J%C3%BCrgen+M&flag&bad=%zz&a=2";
  EXPECT_EQ(req.query_param("a"), "1");
  EXPECT_EQ(req.query_param("name"), "J\xC3\xBCrgen M");
  EXPECT_EQ(req.query_param("flag"), "");
  EXPECT_EQ(req.query_param("bad"), "%zz");
  EXPECT_EQ(req.query_param("none"), std::nullopt);

  const Response e = Response::error(400, "bad_request", "quote \" backslash \\ newline \n byte \xff");
  const auto j = nlohmann::json::parse(e.body);
  EXPECT_EQ(j["error"]["code"], "bad_request");
  EXPECT_EQ(j["error"]["message"].get<std::string>().substr(0, 29), "quote \" backslash \\ newline \n");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.content_type, "application/json");
}

}  // namespace
}  // namespace troupe::http::detail
