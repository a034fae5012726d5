// The HTTP server: io threads, each an asio::io_context with its own
// connections; the first also accepts and deals connections out in turn.
// See http.hpp for the contract.
//
// Threads and lifetimes:
//   - A ServerConnection is touched only on its loop's io thread. Its loop
//     owns it (ServerLoop::live) until it closes; the asynchronous
//     operations in flight hold it too.
//   - A Responder holds its loop (shared) and its connection (weak). Called
//     on the loop's io thread it completes the request inline; from another
//     thread it posts to the loop, under ServerLoop::post_mu, and only while
//     the loop is open. stop() closes every loop before joining its thread,
//     so nothing is posted to an io_context whose thread is gone, and the
//     shared ServerLoop keeps the io_context itself alive for as long as any
//     Responder could still look at it.
//   - Nothing in a ServerConnection points back at the Server: what it
//     needs (settings, router, counters) sits in a Shared it co-owns, so a
//     connection that outlives the Server (inside an io_context a late
//     Responder keeps alive) is only memory.
//
// Pipelining: every parsed request takes the next slot of the connection's
// queue. A response fills its slot; whatever is done at the front of the
// queue is appended to the output, so responses leave in request order. A
// connection stops reading while max_pipelined slots are open.
//
// Timers: one per connection, armed at most every min(idle_timeout,
// request_read_timeout) and never per request: when it fires it looks at
// the connection's timestamps and decides (idle, slow request, stalled
// write, end of a lingering close).

#include "../asio_headers.hpp"  // first: see there

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "parser.hpp"
#include "server_parts.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http {

namespace detail {
namespace {

using Socket = asio::ip::tcp::socket;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kInitialBuffer = 4u << 10;
constexpr std::size_t kMinReadRoom = 2u << 10;
// A read buffer or write buffer larger than this is released once empty.
constexpr std::size_t kKeepCapacity = 256u << 10;
// After a response that closes the connection the server stops sending,
// then reads (and drops) what the client still sends, for at most this
// long or this many bytes, so that unread input does not turn the close
// into a reset that destroys the response in flight (RFC 9112 9.6).
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr std::size_t kLingerBytes = 1u << 20;

}  // namespace

// One io thread and its connections.
struct ServerLoop {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};

  std::mutex post_mu;
  bool open = true;  // guarded by post_mu: respond() from other threads may post

  // io thread only.
  std::unordered_set<std::shared_ptr<ServerConnection>> live;
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

  // The Date header, formatted once per second.
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

// One accepted connection. io thread only (see the file comment).
class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(std::shared_ptr<Shared> shared, const std::shared_ptr<ServerLoop>& loop, Socket socket)
      : s_(std::move(shared)),
        loop_(*loop),
        loop_ref_(loop),
        socket_(std::move(socket)),
        timer_(loop->io),
        parser_(s_->settings.max_header_bytes, s_->settings.max_body_bytes) {}

  void start();
  // Fills the slot of request `seq`; false if it was answered already or
  // the connection is gone.
  bool complete(std::uint64_t seq, Response&& r);
  void dropped(std::uint64_t seq, bool unwinding);
  void drain();  // stop(): no more requests; close once answered
  void abort();  // after the io thread was joined

 private:
  struct Slot {
    std::uint64_t seq = 0;
    bool done = false;
    bool head = false;               // a HEAD: no body
    bool close = false;              // the connection closes after this response
    bool keep_alive_header = false;  // HTTP/1.0 keep-alive: say so
    std::string wire;                // the serialised response, once done
  };

  void read();
  void on_read(const std::error_code& ec, std::size_t n);
  void process();
  void dispatch(Request&& req, bool keep_alive, bool http10);
  void push_error(int status, std::string reason);
  void flush();
  void start_write();
  void on_write(const std::error_code& ec, std::size_t n);
  void finish_and_linger();
  void close();
  void arm(Clock::time_point at);
  void on_timer();
  std::string remote() const;

  std::shared_ptr<Shared> s_;
  ServerLoop& loop_;
  std::weak_ptr<ServerLoop> loop_ref_;  // for Responders; weak: the loop's io_context holds this connection
  Socket socket_;
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;

  std::vector<char> in_;
  std::size_t in_start_ = 0;  // first byte of the request being parsed
  std::size_t in_end_ = 0;    // end of what was read
  RequestParser parser_;
  std::deque<Slot> slots_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t dispatching_seq_ = 0;  // the request whose handler is running

  std::string out_pending_;  // responses ready, not yet handed to a write
  std::string out_writing_;  // the write in flight

  bool reading_ = false;       // a read is in flight
  bool read_stopped_ = false;  // no more requests: a close is coming
  bool paused_ = false;        // max_pipelined slots open: not reading
  bool writing_ = false;
  bool close_after_write_ = false;
  bool lingering_ = false;
  bool closed_ = false;
  bool draining_ = false;
  bool peer_eof_ = false;
  bool continue_sent_ = false;
  bool in_request_ = false;  // part of a request has arrived
  std::size_t lingered_ = 0;
  Clock::time_point last_activity_{};
  Clock::time_point request_started_{};
  Clock::time_point write_started_{};
  Clock::time_point linger_until_{};
};

void ServerConnection::start() {
  std::error_code ignored;
  // Responses are written whole, one write per batch; Nagle would only hold
  // back the last segment of each.
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  in_.resize(kInitialBuffer);
  last_activity_ = Clock::now();
  arm(last_activity_ + s_->tick);
  read();
}

std::string ServerConnection::remote() const {
  std::error_code ec;
  const auto ep = socket_.remote_endpoint(ec);
  if (ec) return "a closed connection";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

void ServerConnection::read() {
  if (reading_ || closed_) return;
  if (in_start_ == in_end_) {
    in_start_ = in_end_ = 0;
    if (in_.size() > kKeepCapacity) std::vector<char>(kInitialBuffer).swap(in_);
  }
  if (in_.size() - in_end_ < kMinReadRoom) {
    if (in_start_ > 0) {
      std::memmove(in_.data(), in_.data() + in_start_, in_end_ - in_start_);
      in_end_ -= in_start_;
      in_start_ = 0;
    }
    // The parser bounds what one request may take, so the buffer is
    // bounded too (a request, plus at most one read beyond it).
    if (in_.size() - in_end_ < kMinReadRoom) in_.resize(std::max(in_.size() * 2, in_end_ + kMinReadRoom * 4));
  }
  reading_ = true;
  socket_.async_read_some(
      asio::buffer(in_.data() + in_end_, in_.size() - in_end_),
      [self = shared_from_this()](const std::error_code& ec, std::size_t n) { self->on_read(ec, n); });
}

void ServerConnection::on_read(const std::error_code& ec, std::size_t n) {
  reading_ = false;
  if (closed_) return;
  if (lingering_) {
    lingered_ += n;
    if (ec || lingered_ > kLingerBytes) {
      close();
      return;
    }
    in_start_ = in_end_ = 0;
    read();
    return;
  }
  if (ec) {
    if (ec != asio::error::eof) {
      close();
      return;
    }
    // The client finished sending: answer what it asked, then close.
    peer_eof_ = true;
    if (read_stopped_) return;
    read_stopped_ = true;
    if (in_request_) {
      push_error(400, "the connection ended inside a request");
      return;
    }
    if (slots_.empty() && !writing_ && out_pending_.empty())
      close();
    else
      flush();
    return;
  }
  bump(s_->c.bytes_received, n);
  in_end_ += n;
  last_activity_ = Clock::now();
  process();
}

void ServerConnection::process() {
  const std::size_t max_pipelined = s_->settings.max_pipelined;
  while (!read_stopped_ && !closed_) {
    if (slots_.size() >= max_pipelined) {
      paused_ = true;
      return;
    }
    const std::string_view data(in_.data() + in_start_, in_end_ - in_start_);
    if (data.empty()) break;
    const RequestParser::Status st = parser_.parse(data);
    if (st == RequestParser::Status::need_more) {
      if (!in_request_ && parser_.started(data)) {
        in_request_ = true;
        request_started_ = last_activity_;
      }
      // The interim 100 may only go out when no response is owed before it.
      if (parser_.headers_complete() && parser_.expects_continue() && !continue_sent_ && slots_.empty()) {
        continue_sent_ = true;
        out_pending_.append("HTTP/1.1 100 Continue\r\n\r\n");
        start_write();
      }
      break;
    }
    if (st == RequestParser::Status::error) {
      const ParseError& e = parser_.error();
      push_error(e.status, e.reason);
      return;
    }
    in_start_ += parser_.consumed();
    const bool keep_alive = parser_.keep_alive();
    const bool http10 = parser_.http10();
    Request req = parser_.take();
    in_request_ = false;
    continue_sent_ = false;
    dispatch(std::move(req), keep_alive, http10);
  }
  if (!read_stopped_ && !closed_) read();
}

void ServerConnection::dispatch(Request&& req, bool keep_alive, bool http10) {
  Slot slot;
  slot.seq = next_seq_++;
  slot.head = req.method == "HEAD";
  slot.close = !keep_alive || draining_;
  slot.keep_alive_header = keep_alive && http10;
  if (slot.close) read_stopped_ = true;
  const std::uint64_t seq = slot.seq;
  slots_.push_back(std::move(slot));
  bump(s_->c.requests);
  std::shared_ptr<ServerLoop> loop = loop_ref_.lock();
  dispatching_seq_ = seq;
  try {
    s_->router.dispatch(req, Responder(std::move(loop), weak_from_this(), seq));
  } catch (const std::exception& e) {
    bump(s_->c.handler_exceptions);
    s_->log("handler for " + req.method + " " + req.path + " threw: " + e.what());
    complete(seq,
             Response::error(500, "handler_failed", std::string("the request handler threw: ") + e.what()));
  } catch (...) {
    bump(s_->c.handler_exceptions);
    s_->log("handler for " + req.method + " " + req.path + " threw a non-standard exception");
    complete(seq,
             Response::error(500, "handler_failed", "the request handler threw a non-standard exception"));
  }
  dispatching_seq_ = 0;
}

bool ServerConnection::complete(std::uint64_t seq, Response&& r) {
  if (closed_ || slots_.empty() || seq < slots_.front().seq) return false;
  const std::uint64_t idx = seq - slots_.front().seq;
  if (idx >= slots_.size()) return false;
  Slot& slot = slots_[static_cast<std::size_t>(idx)];
  if (slot.done) return false;
  slot.done = true;
  const std::string& date = loop_.date_now();
  // An interim (1xx) status cannot be the answer to a request.
  if (r.status < 200 || !serialize_response(r, slot.head, slot.close, slot.keep_alive_header, date, slot.wire)) {
    slot.wire.clear();
    s_->log("a handler answered with an invalid status (" + std::to_string(r.status) +
            ") or a header that could break the response; answered 500 instead");
    const Response fallback =
        Response::error(500, "invalid_response", "the request handler produced an invalid status or header");
    serialize_response(fallback, slot.head, slot.close, slot.keep_alive_header, date, slot.wire);
  }
  if (idx == 0) flush();
  return true;
}

void ServerConnection::dropped(std::uint64_t seq, bool unwinding) {
  // A handler that throws drops its Responder on the way out; the catch in
  // dispatch() answers with what was thrown.
  if (unwinding && seq == dispatching_seq_) return;
  if (closed_ || slots_.empty() || seq < slots_.front().seq || seq - slots_.front().seq >= slots_.size())
    return;
  if (slots_[static_cast<std::size_t>(seq - slots_.front().seq)].done) return;
  // Counted before the answer goes out, so whoever sees the 500 sees the count.
  bump(s_->c.responders_dropped);
  complete(seq,
           Response::error(500, "no_reply", "the request handler dropped its responder without responding"));
}

void ServerConnection::push_error(int status, std::string reason) {
  if (status == 408)
    bump(s_->c.timeouts);
  else
    bump(s_->c.bad_requests);
  s_->log("closing connection from " + remote() + ": " + std::to_string(status) + " " + reason);
  Slot slot;
  slot.seq = next_seq_++;
  slot.done = true;
  slot.close = true;
  serialize_response(Response::error(status, error_code_for(status), reason), false, true, false,
                     loop_.date_now(), slot.wire);
  slots_.push_back(std::move(slot));
  read_stopped_ = true;
  in_request_ = false;
  flush();
}

// Moves the responses done at the front of the queue to the output.
void ServerConnection::flush() {
  bool closing = false;
  while (!slots_.empty() && slots_.front().done) {
    Slot& front = slots_.front();
    if (out_pending_.empty())
      out_pending_.swap(front.wire);
    else
      out_pending_.append(front.wire);
    bump(s_->c.responses);
    closing = front.close;
    slots_.pop_front();
    if (closing) {
      // Whatever was pipelined after a closing response is not answered.
      slots_.clear();
      read_stopped_ = true;
      break;
    }
  }
  if (closing || ((peer_eof_ || draining_) && slots_.empty())) close_after_write_ = true;
  start_write();
  if (paused_ && !read_stopped_ && slots_.size() < s_->settings.max_pipelined) {
    paused_ = false;
    process();
  }
}

void ServerConnection::start_write() {
  if (writing_ || closed_) return;
  if (out_pending_.empty()) {
    if (close_after_write_) finish_and_linger();
    return;
  }
  out_writing_.clear();
  out_writing_.swap(out_pending_);
  writing_ = true;
  write_started_ = Clock::now();
  asio::async_write(
      socket_, asio::buffer(out_writing_),
      [self = shared_from_this()](const std::error_code& ec, std::size_t n) { self->on_write(ec, n); });
}

void ServerConnection::on_write(const std::error_code& ec, std::size_t n) {
  writing_ = false;
  if (closed_) return;
  if (ec) {
    close();
    return;
  }
  bump(s_->c.bytes_sent, n);
  last_activity_ = Clock::now();
  if (out_writing_.capacity() > kKeepCapacity) std::string().swap(out_writing_);
  start_write();
}

// Everything owed is written and the connection closes: stop sending, then
// read what the client may still send until it closes too (bounded).
void ServerConnection::finish_and_linger() {
  if (lingering_ || closed_) return;
  std::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_send, ignored);
  if (peer_eof_ || draining_) {
    close();
    return;
  }
  lingering_ = true;
  linger_until_ = Clock::now() + kLingerTime;
  arm(linger_until_);
  read();
}

void ServerConnection::close() {
  if (closed_) return;
  closed_ = true;
  ++timer_gen_;
  timer_.cancel();
  std::error_code ignored;
  socket_.close(ignored);
  slots_.clear();
  s_->c.open.fetch_sub(1, std::memory_order_relaxed);
  // Last: the set may hold the last reference but one (the caller's handler).
  loop_.live.erase(shared_from_this());
}

void ServerConnection::drain() {
  if (closed_) return;
  draining_ = true;
  read_stopped_ = true;
  in_request_ = false;
  if (slots_.empty() && !writing_ && out_pending_.empty()) {
    close();
    return;
  }
  if (!slots_.empty())
    slots_.back().close = true;
  else
    close_after_write_ = true;
}

void ServerConnection::abort() {
  if (closed_) return;
  s_->c.open.fetch_sub(1, std::memory_order_relaxed);
  closed_ = true;
  timer_.cancel();
  std::error_code ignored;
  socket_.close(ignored);
  slots_.clear();
}

void ServerConnection::arm(Clock::time_point at) {
  const std::uint64_t gen = ++timer_gen_;
  timer_.expires_at(at);
  timer_.async_wait([self = shared_from_this(), gen](const std::error_code& ec) {
    if (ec || gen != self->timer_gen_ || self->closed_) return;
    self->on_timer();
  });
}

void ServerConnection::on_timer() {
  const auto now = Clock::now();
  const ServerSettings& st = s_->settings;
  if (lingering_) {
    if (now >= linger_until_)
      close();
    else
      arm(linger_until_);
    return;
  }
  Clock::time_point next = now + s_->tick;
  if (writing_) {
    const auto due = write_started_ + st.idle_timeout;
    if (now >= due) {
      bump(s_->c.timeouts);
      s_->log("closing connection from " + remote() + ": the client read nothing of a response for " +
              millis(st.idle_timeout));
      close();
      return;
    }
    next = std::min(next, due);
  }
  if (in_request_ && !read_stopped_) {
    const auto due = request_started_ + st.request_read_timeout;
    if (now >= due) {
      push_error(408, "the request did not arrive whole within " + millis(st.request_read_timeout));
      return;
    }
    next = std::min(next, due);
  }
  if (slots_.empty() && !writing_ && !read_stopped_) {
    const auto due = last_activity_ + st.idle_timeout;
    if (now >= due) {
      if (in_request_) {
        push_error(408, "nothing arrived for " + millis(st.idle_timeout) + " in the middle of a request");
      } else {
        bump(s_->c.timeouts);
        close();
      }
      return;
    }
    next = std::min(next, due);
  }
  arm(next);
}

}  // namespace detail

// --- Responder -----------------------------------------------------------------------
// Its moves and destructor: responder.cpp.

void Responder::respond(Response response) {
  if (seq_ == 0) return;
  detail::respond_through(std::move(loop_), std::move(conn_), std::exchange(seq_, 0), std::move(response));
}

void Responder::drop() noexcept {
  if (seq_ == 0) return;
  detail::drop_through(std::move(loop_), std::move(conn_), std::exchange(seq_, 0));
}

// --- Server ------------------------------------------------------------------------

class Server::Impl {
 public:
  explicit Impl(std::shared_ptr<detail::Shared> shared) : s_(std::move(shared)) {
    const int n = s_->settings.io_threads;
    for (int i = 0; i < n; ++i) loops_.push_back(std::make_shared<detail::ServerLoop>());
    acceptor_.emplace(loops_.front()->io);
    accept_retry_.emplace(loops_.front()->io);
  }
  ~Impl() { stop(); }

  Result<void> listen();
  void start_threads();
  void stop();
  ServerStats stats() const;
  std::uint16_t port() const noexcept { return port_; }
  bool on_io_thread() const noexcept {
    return std::any_of(loops_.begin(), loops_.end(), [](const auto& l) { return l->on_thread(); });
  }

 private:
  void accept();
  void on_accept(const std::shared_ptr<detail::ServerLoop>& loop, asio::ip::tcp::socket socket);

  std::shared_ptr<detail::Shared> s_;
  std::vector<std::shared_ptr<detail::ServerLoop>> loops_;
  std::optional<asio::ip::tcp::acceptor> acceptor_;  // loop 0
  std::optional<asio::steady_timer> accept_retry_;   // loop 0
  std::size_t next_loop_ = 0;                        // loop 0's thread
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  bool joined_ = false;
};

Result<void> Server::Impl::listen() {
  const ServerSettings& st = s_->settings;
  const std::string where = st.host + ":" + std::to_string(st.port);
  std::error_code ec;
  asio::ip::tcp::endpoint ep;
  const asio::ip::address addr = asio::ip::make_address(st.host, ec);
  if (!ec) {
    ep = asio::ip::tcp::endpoint(addr, st.port);
  } else {
    asio::ip::tcp::resolver resolver(loops_.front()->io);
    auto results = resolver.resolve(st.host, std::to_string(st.port), ec);
    if (ec || results.empty())
      return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": cannot resolve the host: " +
                                                    (ec ? ec.message() : "no address"));
    ep = *results.begin();
  }
  auto& acc = *acceptor_;
  if (acc.open(ep.protocol(), ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  // A restarted server takes its port back at once, past TIME_WAIT.
  acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (acc.bind(ep, ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  if (acc.listen(asio::socket_base::max_listen_connections, ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  port_ = acc.local_endpoint(ec).port();
  return {};
}

void Server::Impl::start_threads() {
  asio::post(loops_.front()->io, [this] { accept(); });
  for (auto& loop : loops_) {
    detail::ServerLoop* l = loop.get();
    const std::shared_ptr<detail::Shared> shared = s_;
    l->thread = std::thread([l, shared] {
      l->thread_id.store(std::this_thread::get_id());
      for (;;) {
        try {
          l->io.run();
          return;
        } catch (const std::exception& e) {
          shared->log(std::string("io thread: unexpected exception: ") + e.what());
        } catch (...) {
          shared->log("io thread: unexpected exception");
        }
      }
    });
  }
}

void Server::Impl::accept() {
  // Handlers hold loops by index, never by shared_ptr: a handler left in an
  // io_context that is never run again must not keep that io_context alive.
  const std::size_t target = next_loop_++ % loops_.size();
  acceptor_->async_accept(loops_[target]->io,
                          [this, target](const std::error_code& ec, asio::ip::tcp::socket socket) {
                            if (stopping_.load()) return;
                            if (ec) {
                              if (ec == asio::error::operation_aborted) return;
                              // Out of descriptors or memory: try again shortly rather than spin.
                              s_->log("accept failed: " + ec.message() + "; retrying in 100 ms");
                              accept_retry_->expires_after(std::chrono::milliseconds(100));
                              accept_retry_->async_wait([this](const std::error_code& e) {
                                if (!e && !stopping_.load()) accept();
                              });
                              return;
                            }
                            on_accept(loops_[target], std::move(socket));
                            accept();
                          });
}

void Server::Impl::on_accept(const std::shared_ptr<detail::ServerLoop>& loop, asio::ip::tcp::socket socket) {
  detail::bump(s_->c.accepted);
  if (s_->c.open.load(std::memory_order_relaxed) >= s_->settings.max_connections) {
    detail::bump(s_->c.refused);
    static const std::string kRefusal = [] {
      std::string out;
      detail::serialize_response(Response::error(503, "unavailable", "too many connections"), false, true,
                                 false, {}, out);
      return out;
    }();
    // Best effort, without waiting: a fresh socket's send buffer takes it.
    std::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(kRefusal), ignored);
    socket.shutdown(asio::socket_base::shutdown_send, ignored);
    socket.close(ignored);
    return;
  }
  s_->c.open.fetch_add(1, std::memory_order_relaxed);
  auto conn = std::make_shared<detail::ServerConnection>(s_, loop, std::move(socket));
  asio::post(loop->io, [this, lp = loop.get(), conn] {
    // Accepted as stop() began: its drain has passed this loop already.
    if (stopping_.load()) {
      conn->abort();
      return;
    }
    lp->live.insert(conn);
    conn->start();
  });
}

void Server::Impl::stop() {
  if (on_io_thread()) {
    // From a handler: stop everything now; the io threads are joined by
    // whoever destroys the server.
    stopping_.store(true);
    for (auto& l : loops_) {
      l->close_posting();
      l->io.stop();
    }
    return;
  }
  std::lock_guard lk(stop_mu_);
  if (joined_) return;
  const bool was_running = !stopping_.exchange(true);
  if (was_running) {
    // Stop taking connections and requests; idle connections close now,
    // the others once their answers are out.
    asio::post(loops_.front()->io, [this] {
      std::error_code ignored;
      acceptor_->close(ignored);
      accept_retry_->cancel();
    });
    for (auto& l : loops_) {
      asio::post(l->io, [lp = l.get()] {
        const std::vector<std::shared_ptr<detail::ServerConnection>> conns(lp->live.begin(), lp->live.end());
        for (const auto& c : conns) c->drain();
      });
    }
    const auto deadline = std::chrono::steady_clock::now() + s_->settings.drain_timeout;
    while (s_->c.open.load(std::memory_order_relaxed) > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& l : loops_) {
    l->close_posting();
    l->io.stop();
  }
  for (auto& l : loops_)
    if (l->thread.joinable()) l->thread.join();
  joined_ = true;
  // The io threads are gone: close what is left and drop the connections
  // (any still referenced by pending handlers go with their io_context).
  std::error_code ignored;
  acceptor_->close(ignored);
  accept_retry_->cancel();
  for (auto& l : loops_) {
    for (const auto& c : l->live) c->abort();
    l->live.clear();
    l->work.reset();
  }
}

ServerStats Server::Impl::stats() const { return detail::stats_of(s_->c); }

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (!impl_) return;
  if (impl_->on_io_thread()) {
    // Destroyed from one of its own handlers: the thread cannot join itself,
    // and freeing what it runs would pull the stack from under it. Stop,
    // and leave the rest to the process's exit.
    impl_->stop();
    (void)impl_.release();
    return;
  }
  impl_->stop();
}

Result<std::unique_ptr<Server>> Server::start(ServerSettings settings, Router router) {
  auto shared = detail::make_shared_state(std::move(settings), std::move(router));
  if (!shared.ok()) return std::move(shared).error();
  auto impl = std::make_unique<Impl>(std::move(*shared));
  if (auto listening = impl->listen(); !listening.ok()) return std::move(listening).error();
  impl->start_threads();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

std::uint16_t Server::port() const noexcept { return impl_->port(); }
ServerStats Server::stats() const { return impl_->stats(); }
void Server::stop() { impl_->stop(); }

}  // namespace troupe::http
