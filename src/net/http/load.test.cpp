// The HTTP stack under concurrent load: many threads share one Client, the
// server answers some requests inline and some from worker threads, and
// every answer must reach the request it belongs to.

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http_test_support.hpp"

namespace troupe::http {
namespace {

using namespace std::chrono_literals;
using testing::make_client;
using testing::TestServer;

// A few threads that answer responders handed to them: the actors of a
// real service, in miniature.
class Workers {
 public:
  explicit Workers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  }
  ~Workers() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void post(Responder r, std::string body) {
    {
      std::lock_guard lk(mu_);
      jobs_.emplace_back(std::move(r), std::move(body));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto [r, body] = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      r.respond(Response::text(200, "worker:" + body));
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Responder, std::string>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

TEST(HttpLoad, TwentyThousandConcurrentRequestsFromSeveralThreadsAllGetTheirOwnAnswers) {
  Workers workers(2);
  Router router;
  router.add("POST", "/work/{n}", [&](Request& req, Responder r) {
    // Odd requests are answered by a worker thread, even ones inline.
    const std::string n = req.params["n"];
    if ((n.back() - '0') % 2 == 1)
      workers.post(std::move(r), req.body);
    else
      r.respond(Response::text(200, "inline:" + req.body));
  });
  ServerSettings ss;
  ss.io_threads = 2;
  auto server = TestServer::start(std::move(router), ss);
  ClientSettings cs;
  cs.max_connections = 32;
  cs.max_queued = 50000;
  cs.request_timeout = 60s;
  auto client = make_client(server.port(), cs);

  constexpr int kThreads = 4;
  constexpr int kPerThread = 5000;
  std::atomic<int> right{0};
  std::atomic<int> wrong{0};
  std::atomic<int> left{kThreads * kPerThread};
  std::promise<void> all;
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int n = t * kPerThread + i;
        const std::string body = "payload-" + std::to_string(n);
        const std::string expected = (n % 2 == 1 ? "worker:" : "inline:") + body;
        client->request("POST", "/work/" + std::to_string(n), body, "text/plain",
                        [&, expected](Result<Response> r) {
                          if (r.ok() && r->status == 200 && r->body == expected)
                            right.fetch_add(1);
                          else
                            wrong.fetch_add(1);
                          if (left.fetch_sub(1) == 1) all.set_value();
                        });
      }
    });
  }
  for (auto& s : senders) s.join();
  ASSERT_EQ(all.get_future().wait_for(120s), std::future_status::ready) << left.load() << " unanswered";
  EXPECT_EQ(right.load(), kThreads * kPerThread);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(server->stats().connections_accepted, 32u);
  EXPECT_EQ(server->stats().requests, static_cast<std::uint64_t>(kThreads * kPerThread));
}

}  // namespace
}  // namespace troupe::http
