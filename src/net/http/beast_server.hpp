#pragma once
// The HTTP server's pieces: one io thread with its connections (ServerLoop)
// and one connection (ServerConnection, beast_connection.cpp); the Server
// around them is in beast_server.cpp. Boost.Beast reads and writes the
// messages; what troupe checks of them is in beast_messages.hpp. Internal to
// src/net/http/.
//
// Threads and lifetimes: a ServerConnection is touched only on its loop's io thread; a Responder
// holds its loop (shared) and its connection (weak) and posts to the loop
// while it is open.

#include <algorithm>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

#include "beast_headers.hpp"
#include "beast_messages.hpp"
#include "server_parts.hpp"
#include "syntax.hpp"
#include "troupe/core/log.hpp"
#include "troupe/core/trace.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http::detail {

using Clock = std::chrono::steady_clock;

// One io thread and its connections.
struct ServerLoop {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};
  std::mutex post_mu;
  bool open = true;  // guarded by post_mu
  std::unordered_set<std::shared_ptr<ServerConnection>> live;  // io thread only
  std::int64_t date_second = -1;
  std::string date;

  bool on_thread() const noexcept {
    return std::this_thread::get_id() == thread_id.load(std::memory_order_relaxed);
  }
  template <class F>
  bool post(F&& f) {
    std::lock_guard lk(post_mu);
    if (!open) return false;
    asio::post(io, std::forward<F>(f));
    return true;
  }
  void close_posting() {
    std::lock_guard lk(post_mu);
    open = false;
  }
  const std::string& date_now() {
    const auto s =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    if (s != date_second) {
      date_second = s;
      date = http_date(s);
    }
    return date;
  }
};

// One accepted connection. io thread only.
class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(std::shared_ptr<Shared> shared, const std::shared_ptr<ServerLoop>& loop, Stream stream)
      : s_(std::move(shared)), loop_(*loop), loop_ref_(loop), socket_(std::move(stream)), timer_(loop->io) {}

  void start();
  bool complete(std::uint64_t seq, Response&& r);
  void dropped(std::uint64_t seq, bool unwinding);
  void drain();
  void abort();
  // The remote address this connection counts against (per-address limit);
  // released when it closes.
  void hold_address(std::string address) { address_ = std::move(address); }

 private:
  struct Slot {
    std::uint64_t seq = 0;
    bool done = false;
    bool head = false;
    bool close = false;
    unsigned version = 11;
    // The request's trace (W3C traceparent), echoed in the response.
    std::optional<TraceContext> trace;
    std::shared_ptr<BeastResponse> response;  // once done
  };

  void handshake();
  void read();
  void on_read(const beast::error_code& ec, std::size_t n);
  bool parse();
  void dispatch(BeastRequest&& breq);
  void push_error(int status, std::string reason);
  std::shared_ptr<BeastResponse> build(Response&& r, const Slot& slot) {
    if (slot.trace && r.header("traceparent").empty()) r.headers.emplace_back("traceparent", slot.trace->traceparent());
    return to_beast(std::move(r), slot.version, slot.head, slot.close, loop_.date_now());
  }
  void flush();
  void start_write();
  void finish_and_linger();
  void close();
  void release_address() {
    if (!address_.empty()) s_->per_address.release(std::exchange(address_, {}));
  }
  void arm(Clock::time_point at);
  void on_timer();
  void timeout_request(std::string why);
  Duration tick() const { return s_->tick; }
  std::string remote() const;

  std::shared_ptr<Shared> s_;
  ServerLoop& loop_;
  std::weak_ptr<ServerLoop> loop_ref_;
  Stream socket_;  // TCP, or TLS over it
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  // What has arrived and the parser has not taken yet. Only touched while
  // no read is pending (a read writes into its prepared tail).
  beast::flat_buffer buffer_;
  std::optional<RequestReading> request_;  // the request being read
  std::deque<Slot> slots_;
  std::deque<std::shared_ptr<BeastResponse>> out_;  // ready, in order
  std::uint64_t next_seq_ = 1;
  std::uint64_t dispatching_seq_ = 0;
  bool reading_ = false;
  bool in_request_ = false;  // some bytes of the next request have arrived
  bool parsing_ = false;     // parse() is on the stack: read() leaves the buffer to it
  bool read_stopped_ = false;
  bool paused_ = false;
  bool writing_ = false;
  bool close_after_write_ = false;
  bool lingering_ = false;
  bool closed_ = false;
  bool draining_ = false;
  bool handshaking_ = false;  // TLS: the handshake is not done yet
  Clock::time_point last_activity_{};
  Clock::time_point request_started_{};
  Clock::time_point write_started_{};
  std::string address_;  // empty: not counted per address
};

}  // namespace troupe::http::detail
