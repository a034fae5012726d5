// The HTTP client: pooling, timeouts, refused connections, bounded queue,
// response framing and shutdown, against the troupe server and against
// scripted raw servers that misbehave on purpose.

#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http_test_support.hpp"

namespace troupe::http {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::make_client;
using testing::ScriptedServer;
using testing::TestServer;

Router echo_router() {
  Router router;
  router.add("POST", "/echo", [](Request& req, Responder r) {
    Response resp = Response::text(200, req.body);
    resp.content_type = std::string(req.header("content-type"));
    r.respond(std::move(resp));
  });
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  return router;
}

// A free port with nothing listening on it.
std::uint16_t closed_port() {
  auto s = TestServer::start(Router{});
  const std::uint16_t port = s.port();
  s.server->stop();
  return port;
}

TEST(HttpClient, RequestSyncReturnsTheResponseWithItsHeaders) {
  auto server = TestServer::start(echo_router());
  auto client = make_client(server.port());
  ASSERT_TRUE(client);
  auto r = client->request_sync("POST", "/echo", "hello", "text/x-test");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
  EXPECT_EQ(r->content_type, "text/x-test");
  EXPECT_EQ(r->header("content-length"), "5");
}

TEST(HttpClient, ReusesItsPooledConnections) {
  auto server = TestServer::start(echo_router());
  ClientSettings settings;
  settings.max_connections = 4;
  auto client = make_client(server.port(), settings);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(client->request_sync("GET", "/x").ok());
  EXPECT_EQ(server->stats().connections_accepted, 1u) << "sequential requests share one connection";

  std::atomic<int> ok{0};
  std::promise<void> all;
  constexpr int kCount = 400;
  std::atomic<int> left{kCount};
  for (int i = 0; i < kCount; ++i) {
    client->request("POST", "/echo", std::to_string(i), "text/plain", [&, i](Result<Response> r) {
      if (r.ok() && r->body == std::to_string(i)) ok.fetch_add(1);
      if (left.fetch_sub(1) == 1) all.set_value();
    });
  }
  ASSERT_EQ(all.get_future().wait_for(20s), std::future_status::ready);
  EXPECT_EQ(ok.load(), kCount);
  EXPECT_LE(server->stats().connections_accepted, 4u) << "never more than max_connections";
  EXPECT_EQ(client->stats().connections_opened, server->stats().connections_accepted);
}

TEST(HttpClient, ATimedOutRequestFailsWithTimeoutAndItsConnectionIsNotReused) {
  Router router;
  std::mutex mu;
  std::vector<Responder> never;
  router.add("GET", "/hang", [&](Request&, Responder r) {
    std::lock_guard lk(mu);
    never.push_back(std::move(r));
  });
  router.add("GET", "/x", [](Request&, Responder r) { r.respond(Response::text(200, "x")); });
  auto server = TestServer::start(std::move(router));
  ClientSettings settings;
  settings.max_connections = 1;
  auto client = make_client(server.port(), settings);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = client->request_sync("GET", "/hang", "", "", 200ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::timeout) << r.error().to_string();
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 3s);
  auto next = client->request_sync("GET", "/x");
  ASSERT_TRUE(next.ok()) << next.error().to_string();
  EXPECT_EQ(next->body, "x");
  EXPECT_EQ(server->stats().connections_accepted, 2u)
      << "the timed-out connection was closed, a new one made";
  EXPECT_EQ(client->stats().timeouts, 1u);
  std::lock_guard lk(mu);
  never.clear();
}

TEST(HttpClient, AServerThatNeverAnswersTimesOutEveryRequest) {
  ScriptedServer silent([](int fd, int) {
    char buf[1024];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
  });
  ClientSettings settings;
  settings.request_timeout = 150ms;
  settings.max_connections = 2;
  auto client = make_client(silent.port(), settings);
  std::vector<std::future<Result<Response>>> results;
  for (int i = 0; i < 5; ++i) {
    auto p = std::make_shared<std::promise<Result<Response>>>();
    results.push_back(p->get_future());
    client->request("GET", "/", "", "", [p](Result<Response> r) { p->set_value(std::move(r)); });
  }
  for (auto& f : results) {
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    auto r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::timeout) << r.error().to_string();
  }
}

TEST(HttpClient, AClosedPortIsUnreachable) {
  auto client = make_client(closed_port());
  auto r = client->request_sync("GET", "/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::unreachable);
  EXPECT_NE(r.error().message().find("127.0.0.1:"), std::string::npos) << r.error().message();
  // Many at once: each fails, none waits for a timeout.
  std::vector<std::future<Result<Response>>> results;
  for (int i = 0; i < 200; ++i) {
    auto p = std::make_shared<std::promise<Result<Response>>>();
    results.push_back(p->get_future());
    client->request("GET", "/", "", "", [p](Result<Response> res) { p->set_value(std::move(res)); });
  }
  for (auto& f : results) {
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(f.get().error().code(), ErrorCode::unreachable);
  }
}

TEST(HttpClient, RequestsBeyondThePoolAndTheQueueAreRefusedAtOnce) {
  Router router;
  std::mutex mu;
  std::vector<Responder> held;
  router.add("GET", "/hold", [&](Request&, Responder r) {
    std::lock_guard lk(mu);
    held.push_back(std::move(r));
  });
  auto server = TestServer::start(std::move(router));
  ClientSettings settings;
  settings.max_connections = 1;
  settings.max_queued = 2;
  auto client = make_client(server.port(), settings);
  std::vector<std::future<Result<Response>>> results;
  for (int i = 0; i < 4; ++i) {
    auto p = std::make_shared<std::promise<Result<Response>>>();
    results.push_back(p->get_future());
    client->request("GET", "/hold", "", "", [p](Result<Response> r) { p->set_value(std::move(r)); });
  }
  ASSERT_EQ(results[3].wait_for(2s), std::future_status::ready) << "refused at once";
  auto refused = results[3].get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::buffer_overflow);
  auto count = [&] {
    std::lock_guard lk(mu);
    return held.size();
  };
  for (std::size_t answered = 0; answered < 3; ++answered) {
    ASSERT_TRUE(eventually([&] { return count() == answered + 1; }));
    std::lock_guard lk(mu);
    held[answered].respond(Response::text(200, "ok"));
  }
  for (int i = 0; i < 3; ++i) {
    auto r = results[static_cast<std::size_t>(i)].get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
}

TEST(HttpClient, CloseFailsQueuedAndInFlightRequestsWithShuttingDown) {
  Router router;
  std::mutex mu;
  std::vector<Responder> held;
  router.add("GET", "/hold", [&](Request&, Responder r) {
    std::lock_guard lk(mu);
    held.push_back(std::move(r));
  });
  auto server = TestServer::start(std::move(router));
  ClientSettings settings;
  settings.max_connections = 1;
  auto client = make_client(server.port(), settings);
  std::vector<std::future<Result<Response>>> results;
  for (int i = 0; i < 3; ++i) {
    auto p = std::make_shared<std::promise<Result<Response>>>();
    results.push_back(p->get_future());
    client->request("GET", "/hold", "", "", [p](Result<Response> r) { p->set_value(std::move(r)); });
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return held.size() == 1;
  }));
  client->close();
  for (auto& f : results) {
    ASSERT_EQ(f.wait_for(1s), std::future_status::ready);
    EXPECT_EQ(f.get().error().code(), ErrorCode::shutting_down);
  }
  auto after = client->request_sync("GET", "/hold");
  EXPECT_EQ(after.error().code(), ErrorCode::shutting_down);
  client->close();  // idempotent
  std::lock_guard lk(mu);
  held.clear();  // answers no one: the client is gone
}

TEST(HttpClient, ReadsChunkedAndCloseDelimitedResponses) {
  ScriptedServer scripted([](int fd, int index) {
    if (index == 0) {
      while (ScriptedServer::read_request(fd)) {
        ScriptedServer::write_all(fd,
                                  "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  "5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n");
      }
    } else {
      ScriptedServer::read_request(fd);
      ScriptedServer::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close");
    }
  });
  ClientSettings settings;
  settings.max_connections = 1;
  auto client = make_client(scripted.port(), settings);
  for (int i = 0; i < 2; ++i) {
    auto r = client->request_sync("GET", "/chunked");
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->body, "hello, world");
  }
  EXPECT_EQ(scripted.accepted(), 1) << "a chunked response keeps the connection";
  // The scripted server's first connection never closes; open a second
  // client so the close-delimited script runs on the next connection.
  auto other = make_client(scripted.port(), settings);
  auto r = other->request_sync("GET", "/close");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->body, "until close");
  EXPECT_EQ(r->content_type, "text/plain");
}

TEST(HttpClient, AMalformedResponseIsAProtocolError) {
  ScriptedServer scripted([](int fd, int) {
    ScriptedServer::read_request(fd);
    ScriptedServer::write_all(fd, "HTTP/1.1 OK 200\r\n\r\n");
  });
  auto client = make_client(scripted.port());
  auto r = client->request_sync("GET", "/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::protocol_error) << r.error().to_string();
}

TEST(HttpClient, ATruncatedResponseIsAProtocolError) {
  ScriptedServer scripted([](int fd, int) {
    ScriptedServer::read_request(fd);
    ScriptedServer::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
  });
  auto client = make_client(scripted.port());
  auto r = client->request_sync("GET", "/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::protocol_error) << r.error().to_string();
}

TEST(HttpClient, AGetOnAKeepAliveConnectionTheServerDroppedIsRetriedOnce) {
  // Answers one request per connection, claiming keep-alive, then closes
  // as soon as the next request arrives.
  ScriptedServer scripted([](int fd, int) {
    if (!ScriptedServer::read_request(fd)) return;
    ScriptedServer::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    ScriptedServer::read_request(fd);
  });
  ClientSettings settings;
  settings.max_connections = 1;
  auto client = make_client(scripted.port(), settings);
  ASSERT_TRUE(client->request_sync("GET", "/").ok());
  auto r = client->request_sync("GET", "/");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->body, "ok");
  EXPECT_EQ(client->stats().retries, 1u);
  EXPECT_EQ(scripted.accepted(), 2);
  // A POST is not retried: it may have been carried out.
  auto post = client->request_sync("POST", "/", "{}", "application/json");
  ASSERT_FALSE(post.ok());
  EXPECT_EQ(post.error().code(), ErrorCode::unreachable) << post.error().to_string();
}

TEST(HttpClient, RequestSyncOnItsOwnIoThreadIsRefused) {
  auto server = TestServer::start(echo_router());
  auto client = make_client(server.port());
  std::promise<ErrorCode> code;
  client->request("GET", "/x", "", "", [&](Result<Response>) {
    code.set_value(client->request_sync("GET", "/x").error().code());
  });
  auto f = code.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(f.get(), ErrorCode::invalid_argument);
}

TEST(HttpClient, ARequestMadeFromDoneIsServed) {
  auto server = TestServer::start(echo_router());
  auto client = make_client(server.port());
  std::promise<std::string> second;
  client->request("GET", "/x", "", "", [&](Result<Response>) {
    client->request("POST", "/echo", "chained", "text/plain",
                    [&](Result<Response> r) { second.set_value(r.ok() ? r->body : r.error().to_string()); });
  });
  auto f = second.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(f.get(), "chained");
}

TEST(HttpClient, RefusesUnusableSettingsAndInvalidRequests) {
  ClientSettings s;
  s.port = 0;
  EXPECT_EQ(Client::create(s).error().code(), ErrorCode::invalid_argument);
  s.port = 80;
  s.max_connections = 0;
  EXPECT_EQ(Client::create(s).error().code(), ErrorCode::invalid_argument);
  auto server = TestServer::start(echo_router());
  auto client = make_client(server.port());
  auto r = client->request_sync("GET", "/with space");
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace troupe::http
