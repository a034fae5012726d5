#pragma once
// The Boost.Beast HTTP server's pieces (TROUPE_HTTP_BACKEND=beast): one io
// thread with its connections (ServerLoop) and one connection
// (ServerConnection, beast_connection.cpp); the Server around them is in
// beast_server.cpp. Internal to src/net/http/.
//
// Boost.Asio here, standalone Asio in the cluster: the two never meet. The
// server's io_contexts are its own, behind the same Server interface, and
// nothing of Boost shows in troupe/net/http.hpp.
//
// Threads and lifetimes are those of the hand-written server: a
// ServerConnection is touched only on its loop's io thread; a Responder
// holds its loop (shared) and its connection (weak) and posts to the loop
// while it is open.

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wtsan"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wold-style-cast"
#endif
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it under C++20
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

#include "parser.hpp"
#include "server_parts.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Socket = asio::ip::tcp::socket;
using Clock = std::chrono::steady_clock;
using BeastRequest = bhttp::request<bhttp::string_body>;
using BeastResponse = bhttp::response<bhttp::string_body>;

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
  ServerConnection(std::shared_ptr<Shared> shared, const std::shared_ptr<ServerLoop>& loop, Socket socket)
      : s_(std::move(shared)), loop_(*loop), loop_ref_(loop), socket_(std::move(socket)), timer_(loop->io) {}

  void start();
  bool complete(std::uint64_t seq, Response&& r);
  void dropped(std::uint64_t seq, bool unwinding);
  void drain();
  void abort();

 private:
  struct Slot {
    std::uint64_t seq = 0;
    bool done = false;
    bool head = false;
    bool close = false;
    unsigned version = 11;
    std::shared_ptr<BeastResponse> response;  // once done
  };

  void read();
  void on_header(const beast::error_code& ec);
  void on_body(const beast::error_code& ec);
  void dispatch(BeastRequest&& breq);
  void push_error(int status, std::string reason);
  std::shared_ptr<BeastResponse> build(Response&& r, const Slot& slot);
  void flush();
  void start_write();
  void finish_and_linger();
  void close();
  void arm(Clock::time_point at);
  void on_timer();
  void timeout_request(std::string why);
  Duration tick() const { return s_->tick; }
  std::string remote() const;

  std::shared_ptr<Shared> s_;
  ServerLoop& loop_;
  std::weak_ptr<ServerLoop> loop_ref_;
  Socket socket_;
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<Slot> slots_;
  std::deque<std::shared_ptr<BeastResponse>> out_;  // ready, in order
  std::uint64_t next_seq_ = 1;
  std::uint64_t dispatching_seq_ = 0;
  bool reading_ = false;
  bool in_request_ = false;  // a request's header is in, its body is being read
  bool read_stopped_ = false;
  bool paused_ = false;
  bool writing_ = false;
  bool close_after_write_ = false;
  bool lingering_ = false;
  bool closed_ = false;
  bool draining_ = false;
  Clock::time_point last_activity_{};
  Clock::time_point request_started_{};
  Clock::time_point write_started_{};
};

}  // namespace troupe::http::detail
