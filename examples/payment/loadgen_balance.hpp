#pragma once
// payment_loadgen as a load balancer: ReadyRoundRobin (which node a request
// goes to, and the requests waiting while no node is ready), WindowLatency
// (the p99 and max of each fixed window of the run) and NodePool (each
// node's HTTP client and the poller of its /ready). loadgen_balance.cpp
// holds them; loadgen_balance.test.cpp tests the first two.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "troupe/net/http.hpp"

namespace payment_loadgen {

using Steady = std::chrono::steady_clock;

// Round robin over the nodes that are ready now. A request routed while
// none is ready waits (parked, in arrival order) until one turns ready or
// its deadline passes; a request already handed to a node is never moved.
// Time comes in as arguments, so the bookkeeping runs without a clock.
// Ownership: a plain object; it owns the parked callbacks. Thread safety:
// every member may be called from any thread; the callbacks run on the
// calling thread, never under the object's lock (they may route again).
class ReadyRoundRobin {
 public:
  // Called once: with the node's index, or with nullopt when no node was
  // ready before the deadline (or at close()).
  using Go = std::function<void(std::optional<std::size_t>)>;

  explicit ReadyRoundRobin(std::vector<bool> ready);

  // Hands the request to the next ready node after the last one chosen, at
  // once, or parks it until `deadline`.
  void route(Steady::time_point now, Steady::time_point deadline, Go go);

  // Node `node`'s latest /ready answer. A node turning ready takes the
  // parked requests (round robin with the other ready ones).
  void set_ready(std::size_t node, bool ready, Steady::time_point now);

  // Gives up the parked requests whose deadline is at or before `now`.
  void expire(Steady::time_point now);

  // Gives up every parked request; later routes still work.
  void close();

  bool ready(std::size_t node) const;
  std::size_t size() const { return turned_not_ready_.size(); }
  // The earliest deadline of a parked request, if any.
  std::optional<Steady::time_point> next_deadline() const;

  // Requests that had to wait for a ready node; of those, how many gave up;
  // the longest wait (until a node or the deadline; close() ends no wait).
  std::uint64_t waits() const;
  std::uint64_t gave_up() const;
  Steady::duration longest_wait() const;
  // How many times node `node` went from ready to not ready.
  std::uint64_t turned_not_ready(std::size_t node) const;

 private:
  struct Parked {
    Steady::time_point since, deadline;
    Go go;
  };
  // The next ready node, round robin; nullopt when none. Under mu_.
  std::optional<std::size_t> pick_locked();

  mutable std::mutex mu_;
  std::vector<bool> ready_;
  std::vector<std::uint64_t> turned_not_ready_;
  std::size_t next_ = 0;
  std::deque<Parked> parked_;
  std::uint64_t waits_ = 0, gave_up_ = 0;
  Steady::duration longest_wait_{0};
};

// The latencies of a run in fixed windows by the time each request was
// sent: per window its count, p99 and max, and the p99 of the whole run.
// Percentiles are exact (nearest rank over the values kept: 4 bytes each;
// values above about 71 minutes count as that). Ownership: a plain object.
// Thread safety: every member may be called from any thread.
class WindowLatency {
 public:
  explicit WindowLatency(Steady::duration window) : window_(window) {}

  // A request sent `since_start` after the measured run began.
  void record(Steady::duration since_start, std::uint64_t micros);

  struct Window {
    std::size_t index = 0;  // covers [index * window, (index + 1) * window)
    std::uint64_t count = 0;
    std::uint64_t p99_us = 0;  // 0 when empty
    std::uint64_t max_us = 0;
  };
  // Windows 0 .. count - 1, empty ones included; values of later windows
  // count in the last one (requests sent after the measured run: cancels of
  // its last payments). 0: up to the last window with a value.
  std::vector<Window> windows(std::size_t count) const;
  // The p99 over every value recorded; 0 when none.
  std::uint64_t p99_all() const;

  // The nearest-rank `percent` percentile of `values` (reordered); 0 when empty.
  static std::uint64_t percentile(std::vector<std::uint32_t>& values, double percent);

 private:
  const Steady::duration window_;
  mutable std::mutex mu_;
  std::vector<std::vector<std::uint32_t>> by_window_;
};

// Where a node is reached: its payment API and its admin API ("": none,
// the node counts as always ready).
struct NodeAddress {
  std::string api, admin;
};

// The nodes a run sends to: one keep-alive HTTP client per node, and a
// poller thread that GETs each admin URL's /ready every 100 ms (500 ms
// timeout) and tells the round robin (200: ready; any other status or a
// transport error: not ready). Ownership: owns its clients and its poller
// thread. Thread safety: route() and the counters from any thread;
// start_polling() and stop() from one thread.
class NodePool {
 public:
  struct Node {
    NodeAddress address;
    std::unique_ptr<troupe::http::Client> api, admin;  // admin: none without an admin URL
    std::atomic<bool> poll_in_flight{false};
    std::atomic<std::uint64_t> payments{0}, cancels{0};  // requests sent to it
  };

  // Clients for every node: `api` settings get each node's host and port.
  // Errors: invalid_argument for an unusable URL or a host that does not
  // resolve, naming the node.
  static troupe::Result<std::unique_ptr<NodePool>> create(const std::vector<NodeAddress>& nodes,
                                                          troupe::http::ClientSettings api);
  ~NodePool();  // close()

  // Polls every admin URL once and waits for the answers (at most ~0.5 s),
  // then starts the poller thread.
  void start_polling();
  // Stops the poller and gives up the parked requests.
  void stop();
  // stop(), then closes every client: requests still in flight fail with
  // shutting_down. Idempotent; not from inside a client's callback.
  void close();

  // Hands `go` a node (or nullopt after waiting until `deadline`).
  void route(Steady::time_point deadline, ReadyRoundRobin::Go go);

  std::size_t size() const { return nodes_.size(); }
  Node& node(std::size_t i) { return *nodes_[i]; }
  const Node& node(std::size_t i) const { return *nodes_[i]; }
  const ReadyRoundRobin& balance() const { return rr_; }

  static constexpr std::chrono::milliseconds poll_every{100};
  static constexpr std::chrono::milliseconds poll_timeout{500};

 private:
  explicit NodePool(std::vector<std::unique_ptr<Node>> nodes);
  void poll(std::size_t i);
  void poller_loop();

  std::vector<std::unique_ptr<Node>> nodes_;
  ReadyRoundRobin rr_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread poller_;
};

}  // namespace payment_loadgen
