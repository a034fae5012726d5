// Bad input to the HTTP server (SPEC X1): a raw socket sends something that
// is not a valid request. It gets a 4xx/5xx with a JSON reason, then that
// connection, and only that one, is closed; a well-behaved keep-alive
// client goes on being served over the connection it already had, and
// requests pipelined before the bad one are answered first.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "http_test_support.hpp"

namespace troupe::http {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::get;
using testing::RawConn;
using testing::TestServer;

class HttpBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    Router router;
    router.add("GET", "/ok", [](Request&, Responder r) { r.respond(Response::text(200, "ok")); });
    router.add("POST", "/echo", [](Request& req, Responder r) { r.respond(Response::text(200, req.body)); });
    ServerSettings settings;
    settings.max_header_bytes = 1024;
    settings.max_body_bytes = 4096;
    server_ = TestServer::start(std::move(router), settings);
    ASSERT_TRUE(server_.server);
    good_ = RawConn::connect(server_.port());
    expect_good_connection_still_served();
  }

  // Sends `bytes` on a fresh connection and expects `status` with a JSON
  // reason, then the close; then checks nothing else was disturbed.
  void expect_refused(const std::string& bytes, int status, std::string_view code) {
    auto raw = RawConn::connect(server_.port());
    ASSERT_TRUE(raw);
    raw->write(bytes);  // may fail part-way once the server closes
    auto r = raw->read_response();
    ASSERT_TRUE(r) << "no response; log:\n" << server_.log->all();
    EXPECT_EQ(r->status, status) << r->body;
    EXPECT_EQ(r->header("connection"), "close");
    const auto j = nlohmann::json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    EXPECT_EQ(j["error"]["code"], code) << r->body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(raw->wait_closed()) << "the server kept the connection open";
    EXPECT_TRUE(server_.log->contains(std::to_string(status))) << server_.log->all();
    expect_good_connection_still_served();
  }

  void expect_good_connection_still_served() {
    ASSERT_TRUE(good_->write(get("/ok")));
    auto r = good_->read_response();
    ASSERT_TRUE(r) << "the well-behaved connection was disturbed";
    EXPECT_EQ(r->body, "ok");
  }

  TestServer server_;
  std::unique_ptr<RawConn> good_;
};

// proves: X1
TEST_F(HttpBadInput, AGarbageRequestLineGets400) {
  expect_refused("\x16\x03\x01 hello\r\n\r\n", 400, "bad_request");
}

// proves: X1
TEST_F(HttpBadInput, ABareLineFeedGets400) {
  expect_refused("GET /ok HTTP/1.1\nHost: t\n\n", 400, "bad_request");
}

// proves: X1
TEST_F(HttpBadInput, AMalformedHeaderLineGets400) {
  expect_refused("GET /ok HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n", 400, "bad_request");
  expect_refused("GET /ok HTTP/1.1\r\nHost : t\r\n\r\n", 400, "bad_request");
}

// proves: X1
TEST_F(HttpBadInput, AMissingHostGets400) { expect_refused("GET /ok HTTP/1.1\r\n\r\n", 400, "bad_request"); }

// proves: X1
TEST_F(HttpBadInput, MalformedPercentEncodingInThePathGets400) {
  expect_refused(get("/o%4k"), 400, "bad_request");
}

// proves: X1
TEST_F(HttpBadInput, AHeaderBlockOverTheLimitGets431) {
  expect_refused(get("/ok", "X-Big: " + std::string(2000, 'b') + "\r\n"), 431, "header_too_large");
}

// proves: X1
TEST_F(HttpBadInput, AnEndlessHeaderGets431WithoutWaitingForItsEnd) {
  expect_refused("GET /ok HTTP/1.1\r\nHost: t\r\nX-Endless: " + std::string(1500, 'e'), 431,
                 "header_too_large");
}

// proves: X1
TEST_F(HttpBadInput, ARequestLineOverTheLimitGets414) {
  expect_refused(get("/" + std::string(2000, 'u')), 414, "uri_too_long");
}

// proves: X1
TEST_F(HttpBadInput, ABodyOverTheLimitGets413FromItsContentLengthBeforeItIsSent) {
  expect_refused("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", 413, "payload_too_large");
}

// proves: X1
TEST_F(HttpBadInput, ABodyOverTheLimitThatIsSentAnywayStillGetsIts413) {
  expect_refused(
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n" + std::string(200000, 'x'), 413,
      "payload_too_large");
}

// proves: X1
TEST_F(HttpBadInput, AChunkedBodyOverTheLimitGets413) {
  std::string chunks;
  for (int i = 0; i < 5; ++i) chunks += "400\r\n" + std::string(1024, 'c') + "\r\n";
  expect_refused(
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + "0\r\n\r\n", 413,
      "payload_too_large");
}

// proves: X1
TEST_F(HttpBadInput, AMalformedChunkGets400) {
  expect_refused("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nnothex\r\n", 400,
                 "bad_request");
}

// proves: X1
TEST_F(HttpBadInput, AnUnsupportedTransferCodingGets501) {
  expect_refused("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501,
                 "not_implemented");
}

// proves: X1
TEST_F(HttpBadInput, TransferEncodingWithContentLengthGets400) {
  expect_refused("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                 400, "bad_request");
}

// proves: X1
TEST_F(HttpBadInput, AnUnsupportedHttpVersionGets505) {
  expect_refused("GET /ok HTTP/2.0\r\nHost: t\r\n\r\n", 505, "version_not_supported");
}

// proves: X1
TEST_F(HttpBadInput, AnUnknownExpectationGets417) {
  expect_refused("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417,
                 "expectation_failed");
}

// proves: X1
TEST_F(HttpBadInput, AnOversizedBodyThatExpectsContinueIsRefusedWithoutTheContinue) {
  auto raw = RawConn::connect(server_.port());
  ASSERT_TRUE(
      raw->write("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 9999\r\n\r\n"));
  auto r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(raw->wait_closed());
  expect_good_connection_still_served();
}

// proves: X1
TEST_F(HttpBadInput, RequestsPipelinedBeforeABadOneAreAnsweredFirst) {
  auto raw = RawConn::connect(server_.port());
  ASSERT_TRUE(raw->write(get("/ok") + get("/ok") + "BROKEN\r\n\r\n" + get("/ok")));
  for (int i = 0; i < 2; ++i) {
    auto r = raw->read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  auto r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(raw->wait_closed());
  EXPECT_TRUE(raw->received().empty()) << "nothing after the bad request is answered";
}

// proves: X1
TEST_F(HttpBadInput, AConnectionThatEndsInsideARequestGets400AndNothingElseIsDisturbed) {
  auto raw = RawConn::connect(server_.port());
  ASSERT_TRUE(raw->write("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"));
  raw->shutdown_send();
  auto r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  expect_good_connection_still_served();
}

// proves: X1
TEST_F(HttpBadInput, RandomBytesNeverTakeTheServerDown) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    auto raw = RawConn::connect(server_.port());
    ASSERT_TRUE(raw);
    std::string bytes = round % 2 == 0 ? get("/ok").substr(0, rng() % 20) : std::string();
    const std::size_t n = rng() % 3000;
    for (std::size_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(rng()));
    raw->write(bytes);
    raw->shutdown_send();
    EXPECT_TRUE(raw->wait_closed(5000ms)) << "round " << round;
  }
  expect_good_connection_still_served();
  EXPECT_TRUE(eventually([&] { return server_->stats().connections_open == 1; }));
}

}  // namespace
}  // namespace troupe::http
