// The HTTP server against raw sockets and the Client: routing, keep-alive,
// pipelining, answers from other threads, timeouts and shutdown.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "http_test_support.hpp"
#include "troupe/core/trace.hpp"

namespace troupe::http {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::get;
using testing::make_client;
using testing::RawConn;
using testing::TestServer;

// Answers with the route and its parameters, as JSON.
Router::Handler echo(std::string name) {
  return [name](Request& req, Responder r) {
    nlohmann::json j = {{"route", name}, {"method", req.method}, {"path", req.path}, {"params", req.params}};
    r.respond(Response::json(200, j.dump()));
  };
}

nlohmann::json body_of(const Result<Response>& r) {
  if (!r.ok()) return {{"failed", r.error().to_string()}};
  return nlohmann::json::parse(r->body, nullptr, false);
}

TEST(HttpRouter, RoutesByMethodAndPatternWithPercentDecodedParameters) {
  Router router;
  router.add("GET", "/entities/{type}/{id}", echo("get-entity"));
  router.add("PUT", "/entities/{kind}/{key}", echo("put-entity"));
  router.add("GET", "/", echo("root"));
  auto server = TestServer::start(std::move(router));
  ASSERT_TRUE(server.server);
  auto client = make_client(server.port());

  auto j = body_of(client->request_sync("GET", "/entities/pay%20ment/a%2Fb%3F?x=1"));
  EXPECT_EQ(j["route"], "get-entity");
  EXPECT_EQ(j["params"]["type"], "pay ment");
  EXPECT_EQ(j["params"]["id"], "a/b?") << "an encoded slash stays inside its segment";
  EXPECT_EQ(j["path"], "/entities/pay ment/a/b?");

  j = body_of(client->request_sync("PUT", "/entities/order/7"));
  EXPECT_EQ(j["route"], "put-entity");
  EXPECT_EQ(j["params"]["kind"], "order");
  EXPECT_EQ(j["params"]["key"], "7");

  EXPECT_EQ(body_of(client->request_sync("GET", "/"))["route"], "root");
}

TEST(HttpRouter, AGuardAnswersInsteadOfTheHandlerWhenItRefuses) {
  Router router;
  std::atomic<int> ran{0};
  router.add("POST", "/act", [&ran](Request&, Responder r) {
    ran.fetch_add(1);
    r.respond(Response::json(200, "{}"));
  });
  router.add("GET", "/open", echo("open"));
  router.guard([](const Request& req) -> std::optional<Response> {
    if (req.path == "/open" || req.header("X-Key") == "yes") return std::nullopt;
    return Response::error(401, "unauthorized", "no");
  });
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  EXPECT_EQ(client->request_sync("POST", "/act")->status, 401);
  EXPECT_EQ(client->request_sync("GET", "/nowhere")->status, 401) << "unknown paths are guarded too";
  EXPECT_EQ(ran.load(), 0) << "a refused request runs no handler";
  EXPECT_EQ(client->request_sync("GET", "/open")->status, 200);
  ClientRequest keyed;
  keyed.method = "POST";
  keyed.target = "/act";
  keyed.headers = {{"X-Key", "yes"}};
  auto ok = client->request_sync(std::move(keyed));
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ran.load(), 1);
}

TEST(HttpRouter, PrefersALiteralSegmentOverAParameter) {
  Router router;
  router.add("GET", "/payments/{id}", echo("by-id"));
  router.add("GET", "/payments/stats", echo("stats"));
  router.add("GET", "/{any}/stats", echo("any-stats"));
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  EXPECT_EQ(body_of(client->request_sync("GET", "/payments/stats"))["route"], "stats");
  EXPECT_EQ(body_of(client->request_sync("GET", "/payments/p-1"))["route"], "by-id");
  EXPECT_EQ(body_of(client->request_sync("GET", "/orders/stats"))["route"], "any-stats");
}

TEST(HttpRouter, AnswersUnknownPaths404AndOtherMethods405WithAllow) {
  Router router;
  router.add("GET", "/items/{id}", echo("get"));
  router.add("DELETE", "/items/{id}", echo("delete"));
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());

  auto r = client->request_sync("GET", "/nothing/here");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(body_of(r)["error"]["code"], "not_found");

  r = client->request_sync("GET", "/items/");  // a parameter never matches an empty segment
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);

  r = client->request_sync("POST", "/items/3", "{}", "application/json");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->header("allow"), "GET, DELETE, HEAD");
  EXPECT_EQ(body_of(r)["error"]["code"], "method_not_allowed");
}

TEST(HttpRouter, ServesHeadFromTheGetRouteWithoutTheBody) {
  Router router;
  router.add("GET", "/doc", [](Request&, Responder r) { r.respond(Response::text(200, "twelve bytes")); });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write("HEAD /doc HTTP/1.1\r\nHost: t\r\n\r\n" + get("/doc")));
  auto head = raw->read_response(5000ms, /*head=*/true);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->header("content-length"), "12");
  EXPECT_EQ(head->body, "");
  auto full = raw->read_response();
  ASSERT_TRUE(full) << "the GET after the HEAD is framed correctly";
  EXPECT_EQ(full->body, "twelve bytes");
}

TEST(HttpRouter, RefusesMalformedPatterns) {
  Router router;
  auto noop = [](Request&, Responder) {};
  EXPECT_THROW(router.add("GET", "no-slash", noop), std::invalid_argument);
  EXPECT_THROW(router.add("GET", "/a/{}", noop), std::invalid_argument);
  EXPECT_THROW(router.add("GET", "/a/{x", noop), std::invalid_argument);
  EXPECT_THROW(router.add("GET", "/a/x{y}", noop), std::invalid_argument);
  EXPECT_THROW(router.add("GET", "/{x}/{x}", noop), std::invalid_argument);
  EXPECT_THROW(router.add("BAD METHOD", "/a", noop), std::invalid_argument);
  router.add("GET", "/a/{x}", noop);
  EXPECT_THROW(router.add("GET", "/a/{y}", noop), std::invalid_argument);
  EXPECT_EQ(router.allowed("/a/1"), (std::vector<std::string>{"GET", "HEAD"}));
  EXPECT_TRUE(router.allowed("/b").empty());
}

TEST(HttpServer, AnswersManyRequestsOnOneKeepAliveConnection) {
  Router router;
  router.add("GET", "/n/{i}",
             [](Request& req, Responder r) { r.respond(Response::text(200, req.params["i"])); });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(raw->write(get("/n/" + std::to_string(i))));
    auto r = raw->read_response();
    ASSERT_TRUE(r) << "request " << i;
    ASSERT_EQ(r->body, std::to_string(i));
    ASSERT_TRUE(raw->last_keep_alive());
  }
  EXPECT_EQ(server->stats().connections_accepted, 1u);
  EXPECT_EQ(server->stats().requests, 2000u);
}

TEST(HttpServer, PipelinedRequestsAnsweredOutOfOrderComeBackInRequestOrder) {
  std::mutex mu;
  std::vector<Responder> held;
  Router router;
  router.add("GET", "/p/{i}", [&](Request&, Responder r) {
    std::lock_guard lk(mu);
    held.push_back(std::move(r));
  });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  constexpr int kCount = 20;
  std::string batch;
  for (int i = 0; i < kCount; ++i) batch += get("/p/" + std::to_string(i));
  ASSERT_TRUE(raw->write(batch));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return held.size() == kCount;
  }));
  // Answered last to first, from another thread.
  std::thread answerer([&] {
    std::lock_guard lk(mu);
    for (int i = kCount - 1; i >= 0; --i)
      held[static_cast<std::size_t>(i)].respond(Response::text(200, "answer " + std::to_string(i)));
  });
  answerer.join();
  for (int i = 0; i < kCount; ++i) {
    auto r = raw->read_response();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body, "answer " + std::to_string(i));
  }
}

TEST(HttpServer, StopsReadingAConnectionWithMaxPipelinedRequestsOpenUntilAnswersGoOut) {
  std::mutex mu;
  std::vector<Responder> held;
  Router router;
  router.add("GET", "/p", [&](Request&, Responder r) {
    std::lock_guard lk(mu);
    held.push_back(std::move(r));
  });
  ServerSettings settings;
  settings.max_pipelined = 3;
  auto server = TestServer::start(std::move(router), settings);
  auto raw = RawConn::connect(server.port());
  std::string batch;
  for (int i = 0; i < 5; ++i) batch += get("/p");
  ASSERT_TRUE(raw->write(batch));
  auto count = [&] {
    std::lock_guard lk(mu);
    return held.size();
  };
  ASSERT_TRUE(eventually([&] { return count() == 3; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(count(), 3u) << "requests past max_pipelined wait";
  {
    std::lock_guard lk(mu);
    held[0].respond(Response::text(200, "0"));
  }
  ASSERT_TRUE(eventually([&] { return count() == 4; }));
  std::lock_guard lk(mu);
  for (std::size_t i = 1; i < held.size(); ++i) held[i].respond(Response::text(200, std::to_string(i)));
}

TEST(HttpServer, AResponderAnswersFromAnotherThreadAfterTheHandlerReturned) {
  std::vector<std::thread> workers;
  std::mutex mu;
  Router router;
  router.add("POST", "/later", [&](Request& req, Responder r) {
    std::lock_guard lk(mu);
    workers.emplace_back([body = std::move(req.body), r = std::move(r)]() mutable {
      std::this_thread::sleep_for(20ms);
      r.respond(Response::text(202, "later: " + body));
    });
  });
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  auto r = client->request_sync("POST", "/later", "payload", "text/plain");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->status, 202);
  EXPECT_EQ(r->body, "later: payload");
  std::lock_guard lk(mu);
  for (auto& w : workers) w.join();
}

TEST(HttpServer, OnlyTheFirstRespondCounts) {
  Router router;
  router.add("GET", "/twice", [](Request&, Responder r) {
    Responder moved = std::move(r);
    moved.respond(Response::text(200, "first"));
    EXPECT_FALSE(moved.pending());
    moved.respond(Response::text(500, "second"));
    r.respond(Response::text(500, "moved-from"));
  });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write(get("/twice") + get("/twice")));
  for (int i = 0; i < 2; ++i) {
    auto r = raw->read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "first");
  }
}

TEST(HttpServer, ADroppedResponderAnswers500WithAReason) {
  Router router;
  router.add("GET", "/drop", [](Request&, Responder) {});
  std::thread dropper;
  router.add("GET", "/drop-elsewhere", [&](Request&, Responder r) {
    dropper = std::thread([r = std::move(r)]() mutable { Responder gone = std::move(r); });
  });
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  auto r = client->request_sync("GET", "/drop");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(body_of(r)["error"]["code"], "no_reply");
  r = client->request_sync("GET", "/drop-elsewhere");
  dropper.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(server->stats().responders_dropped, 2u);
}

TEST(HttpServer, AHandlerThatThrowsAnswers500AndTheConnectionGoesOn) {
  Router router;
  router.add("GET", "/throw", [](Request&, Responder) { throw std::runtime_error("boom"); });
  router.add("GET", "/ok", [](Request&, Responder r) { r.respond(Response::text(200, "ok")); });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write(get("/throw") + get("/ok")));
  auto r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  const auto j = nlohmann::json::parse(r->body);
  EXPECT_EQ(j["error"]["code"], "handler_failed");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("boom"), std::string::npos);
  r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "ok");
  EXPECT_EQ(server->stats().handler_exceptions, 1u);
  EXPECT_EQ(server->stats().responders_dropped, 0u);
  EXPECT_TRUE(server.log->contains("boom"));
}

TEST(HttpServer, AResponseWithAnInterimStatusOrAHeaderThatWouldBreakTheFramingBecomes500) {
  Router router;
  router.add("GET", "/evil", [](Request&, Responder r) {
    Response resp = Response::text(200, "x");
    resp.headers.emplace_back("X-Evil", "a\r\nSet-Cookie: stolen");
    r.respond(std::move(resp));
  });
  router.add("GET", "/interim", [](Request&, Responder r) { r.respond(Response::text(100, "")); });
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  auto r = client->request_sync("GET", "/evil");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->header("set-cookie"), "");
  r = client->request_sync("GET", "/interim");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 500) << "a 1xx cannot answer a request";
}

TEST(HttpServer, HonoursConnectionCloseAndHttp10) {
  Router router;
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  auto server = TestServer::start(std::move(router));

  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write(get("/x", "Connection: close\r\n") + get("/x")));
  auto r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("connection"), "close");
  EXPECT_TRUE(raw->wait_closed()) << "closed after the response; the request after it is not answered";
  EXPECT_TRUE(raw->received().empty());

  raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write("GET /x HTTP/1.0\r\n\r\n"));
  r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_TRUE(raw->wait_closed()) << "HTTP/1.0 closes by default";

  raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write("GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("connection"), "keep-alive");
  ASSERT_TRUE(raw->write("GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  EXPECT_TRUE(raw->read_response()) << "the HTTP/1.0 keep-alive connection stays open";
}

TEST(HttpServer, AnswersAClientThatHalfClosedAfterItsRequests) {
  Router router;
  // The second answer comes well after the first has gone out: the
  // connection stays open for it.
  auto calls = std::make_shared<std::atomic<int>>(0);
  router.add("GET", "/x", [calls](Request&, Responder r) {
    const auto delay = calls->fetch_add(1) == 0 ? 20ms : 150ms;
    std::thread([r = std::move(r), delay]() mutable {
      std::this_thread::sleep_for(delay);
      r.respond(Response::text(200, "late"));
    }).detach();
  });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write(get("/x") + get("/x")));
  raw->shutdown_send();
  for (int i = 0; i < 2; ++i) {
    auto r = raw->read_response();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body, "late");
  }
  EXPECT_TRUE(raw->wait_closed());
}

TEST(HttpServer, SendsAnInterim100ToARequestThatExpectsIt) {
  Router router;
  router.add("POST", "/upload", [](Request& req, Responder r) { r.respond(Response::text(200, req.body)); });
  auto server = TestServer::start(std::move(router));
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(
      raw->write("POST /upload HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"));
  ASSERT_TRUE(eventually([&] {
    pollfd p{raw->fd(), POLLIN, 0};
    return ::poll(&p, 1, 10) > 0;
  }));
  char buf[64] = {};
  const ssize_t n = ::recv(raw->fd(), buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<std::size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(raw->write("data"));
  auto r = raw->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "data");
}

TEST(HttpServer, ClosesAConnectionIdleForTheIdleTimeout) {
  Router router;
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  ServerSettings settings;
  settings.idle_timeout = 200ms;
  auto server = TestServer::start(std::move(router), settings);
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write(get("/x")));
  ASSERT_TRUE(raw->read_response());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(raw->wait_closed(5000ms));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 150ms);
  EXPECT_TRUE(raw->received().empty()) << "an idle connection is closed without a response";
  EXPECT_TRUE(
      eventually([&] { return server->stats().timeouts == 1 && server->stats().connections_open == 0; }));
}

TEST(HttpServer, ASlowClientStuckInsideItsHeadersGets408) {
  Router router;
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  ServerSettings settings;
  settings.idle_timeout = 200ms;
  auto server = TestServer::start(std::move(router), settings);
  auto raw = RawConn::connect(server.port());
  ASSERT_TRUE(raw->write("GET /x HTTP/1.1\r\nHo"));
  auto r = raw->read_response(5000ms);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_TRUE(raw->wait_closed());
}

TEST(HttpServer, ARequestTricklingInSlowerThanTheReadTimeoutGets408) {
  Router router;
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  ServerSettings settings;
  settings.idle_timeout = 5s;
  settings.request_read_timeout = 300ms;
  auto server = TestServer::start(std::move(router), settings);
  auto raw = RawConn::connect(server.port());
  std::optional<Response> r;
  const std::string line = "GET /x HTTP/1.1\r\nX-Slow: ";
  ASSERT_TRUE(raw->write(line));
  // One byte every 50 ms: never idle, never done.
  for (int i = 0; i < 200 && !r; ++i) {
    if (!raw->write("a")) break;
    r = raw->read_response(50ms);
  }
  if (!r) r = raw->read_response(2000ms);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
}

TEST(HttpServer, RefusesConnectionsOverTheLimitWith503) {
  Router router;
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  ServerSettings settings;
  settings.max_connections = 2;
  auto server = TestServer::start(std::move(router), settings);
  auto a = RawConn::connect(server.port());
  auto b = RawConn::connect(server.port());
  ASSERT_TRUE(a->write(get("/x")) && b->write(get("/x")));
  ASSERT_TRUE(a->read_response() && b->read_response());
  auto c = RawConn::connect(server.port());
  auto r = c->read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(server->stats().connections_refused, 1u);
  ASSERT_TRUE(a->write(get("/x")));
  EXPECT_TRUE(a->read_response()) << "the connections within the limit are served on";
}

TEST(HttpServer, RefusesConnectionsOverThePerAddressLimitAndServesOtherAddresses) {
  Router router;
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  ServerSettings settings;
  settings.max_connections_per_address = 2;
  auto server = TestServer::start(std::move(router), settings);
  auto a = RawConn::connect(server.port(), "127.0.0.2");
  auto b = RawConn::connect(server.port(), "127.0.0.2");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->write(get("/x")) && b->write(get("/x")));
  ASSERT_TRUE(a->read_response() && b->read_response());
  auto c = RawConn::connect(server.port(), "127.0.0.2");
  auto refused = c->read_response();
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_TRUE(c->wait_closed()) << "closed at once";
  EXPECT_EQ(server->stats().connections_refused_per_address, 1u);
  EXPECT_EQ(server->stats().connections_refused, 0u);

  auto other = RawConn::connect(server.port(), "127.0.0.1");
  ASSERT_TRUE(other->write(get("/x")));
  auto served = other->read_response();
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200) << "another address is not limited by the first one's connections";

  a.reset();  // one closes: its address may connect again
  ASSERT_TRUE(eventually([&] { return server->stats().connections_open == 2; }));
  auto d = RawConn::connect(server.port(), "127.0.0.2");
  ASSERT_TRUE(d->write(get("/x")));
  auto again = d->read_response();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
}

TEST(HttpServer, RefusesAPortInUseNamingHostAndPort) {
  auto first = TestServer::start(Router{});
  ASSERT_TRUE(first.server);
  ServerSettings settings;
  settings.port = first.port();
  auto second = Server::start(settings, Router{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(second.error().message().find("127.0.0.1:" + std::to_string(first.port())), std::string::npos)
      << second.error().message();
}

TEST(HttpServer, RefusesUnusableSettings) {
  ServerSettings s;
  s.io_threads = 0;
  EXPECT_EQ(Server::start(s, Router{}).error().code(), ErrorCode::invalid_argument);
  s = {};
  s.idle_timeout = Duration::zero();
  EXPECT_EQ(Server::start(s, Router{}).error().code(), ErrorCode::invalid_argument);
  s = {};
  s.host = "no.such.host.invalid";
  EXPECT_EQ(Server::start(s, Router{}).error().code(), ErrorCode::invalid_argument);
}

TEST(HttpServer, StopAnswersWhatIsOutstandingThenCloses) {
  std::mutex mu;
  std::vector<Responder> held;
  Router router;
  router.add("GET", "/slow", [&](Request&, Responder r) {
    std::lock_guard lk(mu);
    held.push_back(std::move(r));
  });
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  auto server = TestServer::start(std::move(router));
  auto idle = RawConn::connect(server.port());
  ASSERT_TRUE(idle->write(get("/x")));
  ASSERT_TRUE(idle->read_response());
  auto busy = RawConn::connect(server.port());
  ASSERT_TRUE(busy->write(get("/slow")));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return held.size() == 1;
  }));
  std::thread answer([&] {
    std::this_thread::sleep_for(100ms);
    std::lock_guard lk(mu);
    held[0].respond(Response::text(200, "done"));
  });
  server->stop();
  answer.join();
  EXPECT_TRUE(idle->wait_closed(1000ms));
  auto r = busy->read_response();
  ASSERT_TRUE(r) << "the outstanding request got its answer during the drain";
  EXPECT_EQ(r->body, "done");
  EXPECT_EQ(r->header("connection"), "close");
  EXPECT_TRUE(busy->wait_closed(1000ms));
  server->stop();  // idempotent
  EXPECT_EQ(RawConn::connect(server.port()), nullptr) << "the listener is closed";
}

TEST(HttpServer, AResponderThatOutlivesItsServerDoesNothing) {
  Responder kept;
  Responder dropped;
  {
    Router router;
    router.add("GET", "/keep", [&](Request&, Responder r) { kept = std::move(r); });
    router.add("GET", "/drop", [&](Request&, Responder r) { dropped = std::move(r); });
    ServerSettings settings;
    settings.drain_timeout = 50ms;
    auto server = TestServer::start(std::move(router), settings);
    auto client = make_client(server.port());
    client->request("GET", "/keep", "", "", [](Result<Response>) {});
    client->request("GET", "/drop", "", "", [](Result<Response>) {});
    ASSERT_TRUE(eventually([&] { return server->stats().requests == 2; }));
  }
  EXPECT_TRUE(kept.pending());
  kept.respond(Response::text(200, "too late"));  // harmless
  EXPECT_FALSE(kept.pending());
  // `dropped` goes out of scope here, as harmlessly.
}

TEST(HttpServer, SpreadsConnectionsOverSeveralIoThreads) {
  std::mutex mu;
  std::set<std::thread::id> threads;
  Router router;
  router.add("GET", "/t", [&](Request&, Responder r) {
    {
      std::lock_guard lk(mu);
      threads.insert(std::this_thread::get_id());
    }
    r.respond(Response::text(200, "t"));
  });
  ServerSettings settings;
  settings.io_threads = 3;
  auto server = TestServer::start(std::move(router), settings);
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 6; ++i) {
    conns.push_back(RawConn::connect(server.port()));
    ASSERT_TRUE(conns.back()->write(get("/t")));
    ASSERT_TRUE(conns.back()->read_response());
  }
  std::lock_guard lk(mu);
  EXPECT_EQ(threads.size(), 3u);
}

}  // namespace
}  // namespace troupe::http

namespace troupe::http {
namespace {

// proves: X4
TEST(HttpTrace, EachRequestRunsUnderItsTraceparentOrANewTraceAndTheResponseCarriesItBack) {
  Router router;
  router.add("GET", "/trace", [](Request&, Responder r) {
    r.respond(Response::json(200, nlohmann::json{{"trace", current_trace_id()}}.dump()));
  });
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  const std::string id = "4bf92f3577b34da6a3ce929d0e0e4736";
  auto send = [&](std::string header) {
    ClientRequest req;
    req.target = "/trace";
    if (!header.empty()) req.headers = {{"traceparent", header}};
    return client->request_sync(std::move(req));
  };

  auto kept = send("00-" + id + "-00f067aa0ba902b7-01");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(body_of(kept)["trace"], id) << "the handler runs under the caller's trace";
  auto echoed = TraceContext::parse(kept->header("traceparent"));
  ASSERT_TRUE(echoed) << kept->header("traceparent");
  EXPECT_EQ(echoed->trace_id.hex(), id);
  EXPECT_NE(echoed->span_id.hex(), "00f067aa0ba902b7") << "this server's own span";

  for (std::string bad : {std::string(), std::string("00-zzz-01"), "ff-" + id + "-00f067aa0ba902b7-01",
                          std::string("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
                          "00-" + std::string(32, '0') + "-00f067aa0ba902b7-01"}) {
    auto fresh = send(bad);
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ(fresh->status, 200) << "a malformed traceparent is never an error: '" << bad << "'";
    auto t = TraceContext::parse(fresh->header("traceparent"));
    ASSERT_TRUE(t) << fresh->header("traceparent");
    EXPECT_NE(t->trace_id.hex(), id);
    EXPECT_EQ(body_of(fresh)["trace"], t->trace_id.hex()) << "'" << bad << "'";
  }
}

// proves: X4
TEST(HttpTrace, TheClientSendsTheCurrentTraceAndAnswersUnderIt) {
  Router router;
  router.add("GET", "/trace", [](Request&, Responder r) {
    r.respond(Response::json(200, nlohmann::json{{"trace", current_trace_id()}}.dump()));
  });
  auto server = TestServer::start(std::move(router));
  auto client = make_client(server.port());
  auto ctx = TraceContext::generate();
  std::promise<std::pair<std::string, std::string>> got;
  {
    TraceScope scope(ctx);
    client->request("GET", "/trace", "", "", [&](Result<Response> r) {
      got.set_value({body_of(r)["trace"].get<std::string>(), current_trace_id()});
    });
  }
  auto [served_under, answered_under] = got.get_future().get();
  EXPECT_EQ(served_under, ctx.trace_id.hex()) << "sent as traceparent";
  EXPECT_EQ(answered_under, ctx.trace_id.hex()) << "done runs under the caller's trace";
}

}  // namespace
}  // namespace troupe::http
