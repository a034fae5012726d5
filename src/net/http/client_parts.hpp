#pragma once
// The HTTP client's pieces: what a client's io threads share (ClientShared),
// one request on its way (PendingRequest), one pooled connection
// (ClientConnection, client_connection.cpp) and one io thread with its
// share of the pool and its queue (ClientLoop, client.cpp). Boost.Beast
// writes each request and parses each response; the pool, the queue and the
// deadlines are troupe's. Internal to src/net/http/.
//
// Threads: request() (client.cpp) touches no pool state: it checks the
// bound (one atomic counter of requests queued or in flight), serialises
// the request and posts it to the next loop in turn. Everything else
// (queue, idle list, connections, timers) belongs to a loop's io thread.
//
// Timers: a connection's timer is armed for the deadline of the request it
// carries and, when it fires, re-armed for whatever is current rather than
// cancelled and re-armed per request. The queue has one timer per loop,
// armed for the earliest deadline of the requests waiting in it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "beast_headers.hpp"
#include "beast_messages.hpp"
#include "syntax.hpp"
#include "tls.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http::detail {

using Clock = std::chrono::steady_clock;
using Endpoints = std::vector<asio::ip::tcp::endpoint>;

// Now + d, saturating.
inline Clock::time_point deadline_in(Duration d) {
  const auto now = Clock::now();
  if (d > std::chrono::duration_cast<Duration>(Clock::time_point::max() - now)) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(d);
}

struct ClientCounters {
  std::atomic<std::uint64_t> opened{0}, connect_failures{0}, requests{0}, responses{0}, failures{0};
  std::atomic<std::uint64_t> timeouts{0}, retries{0};
};

// Counters order nothing: relaxed.
inline void count(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }

// What every loop of one client shares. Immutable after create() but for
// the atomics.
struct ClientShared {
  ClientSettings settings;
  std::string where;  // host:port, for messages and the Host header
  Endpoints endpoints;
  TlsContext tls;  // null: plain HTTP
  ClientCounters c;
  std::atomic<std::size_t> outstanding{0};  // queued or in flight, over every loop
};

struct PendingRequest {
  std::string wire;
  bool head = false;
  bool idempotent = false;  // GET or HEAD: may be resent once
  bool retried = false;
  Clock::time_point deadline{};
  Duration timeout{};
  Client::Done done;
};

class ClientLoop;

// One connection of the pool. io thread only.
class ClientConnection : public std::enable_shared_from_this<ClientConnection> {
 public:
  enum class State { connecting, idle, busy, closed };

  ClientConnection(ClientLoop& loop, ClientShared& shared);
  void connect();
  void send(PendingRequest&& p);
  // Fails the request in flight with `e` and closes.
  void fail_and_close(Error e);
  void close();
  State state() const noexcept { return state_; }

 private:
  void on_connected(const beast::error_code& ec);
  void on_handshake(const beast::error_code& ec);
  void connect_failed(std::string why);
  void read();
  void on_read(const beast::error_code& ec, std::size_t n);
  void parse();
  void on_eof();
  void on_lost(const std::string& why);
  void deliver_and_continue(bool keep);
  void arm(Clock::time_point at);
  void on_timer();
  Error malformed(const beast::error_code& ec) const;

  ClientLoop& loop_;
  ClientShared& s_;
  Stream socket_;  // TCP; TLS over it once connected, when the client speaks TLS
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  bool timer_armed_ = false;
  Clock::time_point armed_at_{};
  Clock::time_point connect_deadline_{};
  State state_ = State::connecting;
  // What has arrived and the parser has not taken yet. Only touched while
  // no read is pending (a read writes into its prepared tail).
  beast::flat_buffer in_;
  bool reading_ = false;
  bool reused_ = false;    // answered a request before the current one
  bool got_bytes_ = false;  // some of the current request's response has arrived
  std::optional<ResponseReading> response_;  // the response being read
  std::optional<PendingRequest> current_;
};

// One io thread, its share of the pool and its queue.
class ClientLoop {
 public:
  ClientLoop(ClientShared& shared, std::size_t max_connections)
      : s_(shared), max_connections_(max_connections), sweep_(io) {}

  asio::io_context io{1};
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};

  bool on_thread() const noexcept {
    return std::this_thread::get_id() == thread_id.load(std::memory_order_relaxed);
  }

  // io thread from here on.
  void enqueue(PendingRequest&& p);
  void pump();
  void on_idle(const std::shared_ptr<ClientConnection>& c);
  void on_closed(const std::shared_ptr<ClientConnection>& c);
  void on_connect_failed(const std::string& why);
  void retry(PendingRequest&& p);
  void finish(PendingRequest& p, Result<Response> outcome);
  void shutdown();

 private:
  void arm_sweep(Clock::time_point at);
  void sweep();

  ClientShared& s_;
  const std::size_t max_connections_;
  std::deque<PendingRequest> queue_;
  std::vector<std::shared_ptr<ClientConnection>> idle_;  // most recently used last
  std::unordered_set<std::shared_ptr<ClientConnection>> conns_;
  std::size_t connecting_ = 0;
  asio::steady_timer sweep_;
  bool sweep_armed_ = false;
  Clock::time_point sweep_at_ = Clock::time_point::max();
  bool closing_ = false;

  friend class ClientConnection;
};

}  // namespace troupe::http::detail
