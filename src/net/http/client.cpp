// The HTTP client: io threads, each an asio::io_context with its own share
// of the connection pool and its own queue. See http.hpp for the contract.
//
// request() touches no pool state: it checks the bound (one atomic counter
// of requests queued or in flight), serialises the request and posts it to
// the next loop in turn. Everything else (queue, idle list, connections,
// timers) belongs to a loop's io thread.
//
// Timers: a connection's timer is armed for the deadline of the request it
// carries and, when it fires, re-armed for whatever is current rather than
// cancelled and re-armed per request. The queue has one timer per loop,
// armed for the earliest deadline of the requests waiting in it.
//
// Shutdown: close() marks the client closed under close_mu_ (request()
// holds it shared while it posts, so every post made before close() runs
// before the shutdown step), then posts to every loop a step that fails
// everything with shutting_down and stops the io_context, and joins.

#include "../asio_headers.hpp"  // first: see there

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>
#include <shared_mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "parser.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"

namespace troupe::http {

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using Endpoints = std::vector<asio::ip::tcp::endpoint>;

constexpr std::size_t kInitialBuffer = 4u << 10;
constexpr std::size_t kMinReadRoom = 2u << 10;
constexpr std::size_t kKeepCapacity = 256u << 10;

std::string millis(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

Clock::time_point deadline_in(Duration d) {
  const auto now = Clock::now();
  if (d > std::chrono::duration_cast<Duration>(Clock::time_point::max() - now))
    return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(d);
}

}  // namespace

struct ClientCounters {
  std::atomic<std::uint64_t> opened{0}, connect_failures{0}, requests{0}, responses{0}, failures{0};
  std::atomic<std::uint64_t> timeouts{0}, retries{0};
};

inline void bump(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }

struct ClientShared {
  ClientSettings settings;
  std::string where;  // host:port, for messages and the Host header
  Endpoints endpoints;
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
  Clock::time_point deadline() const noexcept {
    return current_ ? current_->deadline : Clock::time_point::max();
  }

 private:
  void on_connected(const std::error_code& ec);
  void read();
  void on_read(const std::error_code& ec, std::size_t n);
  void on_lost(const std::string& why);
  void deliver_and_continue(bool keep);
  void arm(Clock::time_point at);
  void on_timer();

  ClientLoop& loop_;
  ClientShared& s_;
  asio::ip::tcp::socket socket_;
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  bool timer_armed_ = false;
  Clock::time_point armed_at_{};
  Clock::time_point connect_deadline_{};
  State state_ = State::connecting;
  std::vector<char> in_;
  std::size_t in_len_ = 0;
  bool reading_ = false;
  bool reused_ = false;  // answered a request before the current one
  ResponseParser parser_;
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
  bool closing() const noexcept { return closing_; }

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

// --- connection --------------------------------------------------------------------

ClientConnection::ClientConnection(ClientLoop& loop, ClientShared& shared)
    : loop_(loop),
      s_(shared),
      socket_(loop.io),
      timer_(loop.io),
      parser_(shared.settings.max_response_header_bytes, shared.settings.max_response_body_bytes) {}

void ClientConnection::connect() {
  connect_deadline_ = deadline_in(s_.settings.connect_timeout);
  arm(connect_deadline_);
  asio::async_connect(socket_, s_.endpoints,
                      [self = shared_from_this()](const std::error_code& ec, const asio::ip::tcp::endpoint&) {
                        self->on_connected(ec);
                      });
}

void ClientConnection::on_connected(const std::error_code& ec) {
  if (state_ != State::connecting) return;  // timed out meanwhile, or shut down
  --loop_.connecting_;
  if (ec) {
    bump(s_.c.connect_failures);
    state_ = State::closed;
    std::error_code ignored;
    socket_.close(ignored);
    ++timer_gen_;
    timer_.cancel();
    auto self = shared_from_this();
    loop_.on_closed(self);
    loop_.on_connect_failed("cannot connect to " + s_.where + ": " + ec.message());
    return;
  }
  bump(s_.c.opened);
  std::error_code ignored;
  // A request goes out in one write; Nagle would only delay it.
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  in_.resize(kInitialBuffer);
  state_ = State::idle;
  read();
  loop_.on_idle(shared_from_this());
}

void ClientConnection::send(PendingRequest&& p) {
  state_ = State::busy;
  current_.emplace(std::move(p));
  parser_.reset();
  parser_.expect(current_->head);
  in_len_ = 0;
  if (!timer_armed_ || armed_at_ > current_->deadline) arm(current_->deadline);
  asio::async_write(socket_, asio::buffer(current_->wire),
                    [self = shared_from_this()](const std::error_code& ec, std::size_t) {
                      if (ec && self->state_ == State::busy) self->on_lost("write failed: " + ec.message());
                    });
}

void ClientConnection::read() {
  if (reading_ || state_ == State::closed) return;
  if (in_.size() - in_len_ < kMinReadRoom) in_.resize(std::max(in_.size() * 2, in_len_ + kMinReadRoom * 4));
  reading_ = true;
  socket_.async_read_some(
      asio::buffer(in_.data() + in_len_, in_.size() - in_len_),
      [self = shared_from_this()](const std::error_code& ec, std::size_t n) { self->on_read(ec, n); });
}

void ClientConnection::on_read(const std::error_code& ec, std::size_t n) {
  reading_ = false;
  if (state_ == State::closed) return;
  const std::string_view data(in_.data(), in_len_ + (ec ? 0 : n));
  if (ec) {
    if (state_ != State::busy) {
      // The server closed an idle keep-alive connection: normal.
      close();
      return;
    }
    if (ec == asio::error::eof) {
      switch (parser_.finish(data)) {
        case ResponseParser::Status::complete:
          deliver_and_continue(false);
          return;
        case ResponseParser::Status::error:
          if (parser_.started()) {
            fail_and_close(Error(ErrorCode::protocol_error,
                                 "malformed response from " + s_.where + ": " + parser_.error().reason));
            return;
          }
          break;
        case ResponseParser::Status::need_more:
          break;
      }
      on_lost("the server closed the connection before responding");
      return;
    }
    on_lost("the connection failed: " + ec.message());
    return;
  }
  in_len_ += n;
  if (state_ != State::busy) {
    // Bytes nobody asked for: the stream is out of step.
    close();
    return;
  }
  switch (parser_.parse(data)) {
    case ResponseParser::Status::need_more:
      read();
      return;
    case ResponseParser::Status::error:
      fail_and_close(Error(ErrorCode::protocol_error,
                           "malformed response from " + s_.where + ": " + parser_.error().reason));
      return;
    case ResponseParser::Status::complete:
      // Anything after the response is not ours to read: close rather
      // than misread the next one.
      deliver_and_continue(parser_.keep_alive() && parser_.consumed() == in_len_);
      return;
  }
}

void ClientConnection::deliver_and_continue(bool keep) {
  PendingRequest p = std::move(*current_);
  current_.reset();
  Response r = parser_.take();
  in_len_ = 0;
  reused_ = true;
  if (keep) {
    state_ = State::idle;
    if (in_.size() > kKeepCapacity) std::vector<char>(kInitialBuffer).swap(in_);
    read();
  } else {
    close();
  }
  auto self = shared_from_this();
  // The connection goes back to the pool before `done` runs, so a request
  // made from `done` can take it.
  if (keep) loop_.on_idle(self);
  bump(s_.c.responses);
  loop_.finish(p, std::move(r));
  if (!keep) loop_.pump();
}

// The connection broke while carrying a request.
void ClientConnection::on_lost(const std::string& why) {
  if (state_ != State::busy) {
    close();
    return;
  }
  PendingRequest p = std::move(*current_);
  current_.reset();
  const bool stale = reused_ && !parser_.started();
  close();
  // A keep-alive connection the server closed just as the request went
  // out: the request was not processed if it is safe to say so (GET, HEAD).
  if (stale && p.idempotent && !p.retried) {
    p.retried = true;
    bump(s_.c.retries);
    loop_.retry(std::move(p));
    return;
  }
  loop_.finish(p, Error(ErrorCode::unreachable, "request to " + s_.where + " failed: " + why));
  loop_.pump();
}

void ClientConnection::fail_and_close(Error e) {
  std::optional<PendingRequest> p = std::move(current_);
  current_.reset();
  close();
  if (p) loop_.finish(*p, std::move(e));
  loop_.pump();
}

void ClientConnection::close() {
  if (state_ == State::closed) return;
  if (state_ == State::connecting) --loop_.connecting_;
  state_ = State::closed;
  ++timer_gen_;
  timer_armed_ = false;
  timer_.cancel();
  std::error_code ignored;
  socket_.close(ignored);
  loop_.on_closed(shared_from_this());
}

void ClientConnection::arm(Clock::time_point at) {
  const std::uint64_t gen = ++timer_gen_;
  timer_armed_ = true;
  armed_at_ = at;
  timer_.expires_at(at);
  timer_.async_wait([self = shared_from_this(), gen](const std::error_code& ec) {
    if (ec || gen != self->timer_gen_ || self->state_ == State::closed) return;
    self->timer_armed_ = false;
    self->on_timer();
  });
}

void ClientConnection::on_timer() {
  const auto now = Clock::now();
  switch (state_) {
    case State::connecting:
      if (now < connect_deadline_) {
        arm(connect_deadline_);
        return;
      }
      bump(s_.c.connect_failures);
      close();
      loop_.on_connect_failed("cannot connect to " + s_.where + ": no connection within " +
                              millis(s_.settings.connect_timeout));
      return;
    case State::busy:
      if (now < current_->deadline) {
        arm(current_->deadline);
        return;
      }
      bump(s_.c.timeouts);
      // The response may still come: this connection is out of step for good.
      fail_and_close(
          Error(ErrorCode::timeout, "no response from " + s_.where + " within " + millis(current_->timeout)));
      return;
    case State::idle:
    case State::closed:
      return;
  }
}

// --- loop ------------------------------------------------------------------------

void ClientLoop::finish(PendingRequest& p, Result<Response> outcome) {
  s_.outstanding.fetch_sub(1, std::memory_order_relaxed);
  if (!outcome.ok()) bump(s_.c.failures);
  Client::Done done = std::move(p.done);
  try {
    done(std::move(outcome));
  } catch (...) {
    // The contract: an exception from done is swallowed.
  }
}

void ClientLoop::enqueue(PendingRequest&& p) {
  if (closing_) {
    finish(p, Error(ErrorCode::shutting_down, "the client for " + s_.where + " is closed"));
    return;
  }
  queue_.push_back(std::move(p));
  pump();
}

void ClientLoop::retry(PendingRequest&& p) {
  queue_.push_front(std::move(p));
  pump();
}

void ClientLoop::pump() {
  if (closing_) return;
  while (!queue_.empty() && !idle_.empty()) {
    std::shared_ptr<ClientConnection> c = std::move(idle_.back());
    idle_.pop_back();
    if (c->state() != ClientConnection::State::idle) continue;
    PendingRequest p = std::move(queue_.front());
    queue_.pop_front();
    c->send(std::move(p));
  }
  // One new connection per request left waiting, as far as the pool allows.
  while (queue_.size() > connecting_ && conns_.size() < max_connections_) {
    auto c = std::make_shared<ClientConnection>(*this, s_);
    conns_.insert(c);
    ++connecting_;
    c->connect();
  }
  if (!queue_.empty()) {
    auto earliest = Clock::time_point::max();
    // The queue is nearly in deadline order; the front usually decides.
    earliest = std::min(earliest, queue_.front().deadline);
    earliest = std::min(earliest, queue_.back().deadline);
    if (!sweep_armed_ || earliest < sweep_at_) arm_sweep(earliest);
  }
}

void ClientLoop::on_idle(const std::shared_ptr<ClientConnection>& c) {
  if (closing_) return;
  if (!queue_.empty()) {
    PendingRequest p = std::move(queue_.front());
    queue_.pop_front();
    c->send(std::move(p));
    return;
  }
  idle_.push_back(c);
}

void ClientLoop::on_closed(const std::shared_ptr<ClientConnection>& c) {
  conns_.erase(c);
  auto it = std::find(idle_.begin(), idle_.end(), c);
  if (it != idle_.end()) idle_.erase(it);
}

// A connection attempt failed: the request that waited longest fails with
// it (each queued request gets its own attempt, so a server that is down
// fails them all, quickly); the rest try again.
void ClientLoop::on_connect_failed(const std::string& why) {
  if (!queue_.empty()) {
    PendingRequest p = std::move(queue_.front());
    queue_.pop_front();
    finish(p, Error(ErrorCode::unreachable, why));
  }
  pump();
}

void ClientLoop::arm_sweep(Clock::time_point at) {
  sweep_armed_ = true;
  sweep_at_ = at;
  sweep_.expires_at(at);
  sweep_.async_wait([this, at](const std::error_code& ec) {
    if (ec || closing_ || at != sweep_at_) return;
    sweep_armed_ = false;
    sweep_at_ = Clock::time_point::max();
    sweep();
  });
}

// Fails the queued requests whose deadline passed and re-arms for the next.
void ClientLoop::sweep() {
  const auto now = Clock::now();
  auto earliest = Clock::time_point::max();
  std::deque<PendingRequest> expired;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->deadline <= now) {
      expired.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      earliest = std::min(earliest, it->deadline);
      ++it;
    }
  }
  if (earliest != Clock::time_point::max()) arm_sweep(earliest);
  for (PendingRequest& p : expired) {
    bump(s_.c.timeouts);
    finish(p,
           Error(ErrorCode::timeout, "no connection to " + s_.where + " free within " + millis(p.timeout)));
  }
}

void ClientLoop::shutdown() {
  closing_ = true;
  sweep_.cancel();
  std::deque<PendingRequest> queued = std::move(queue_);
  queue_.clear();
  const std::vector<std::shared_ptr<ClientConnection>> conns(conns_.begin(), conns_.end());
  for (const auto& c : conns)
    c->fail_and_close(Error(ErrorCode::shutting_down, "the client for " + s_.where + " is closed"));
  for (PendingRequest& p : queued)
    finish(p, Error(ErrorCode::shutting_down, "the client for " + s_.where + " is closed"));
  idle_.clear();
  conns_.clear();
  io.stop();
}

}  // namespace detail

// --- Client ------------------------------------------------------------------------

class Client::Impl {
 public:
  explicit Impl(std::unique_ptr<detail::ClientShared> shared) : s_(std::move(shared)) {
    const auto n = static_cast<std::size_t>(s_->settings.io_threads);
    const std::size_t max = s_->settings.max_connections;
    for (std::size_t i = 0; i < n; ++i)
      loops_.push_back(std::make_unique<detail::ClientLoop>(*s_, max / n + (i < max % n ? 1 : 0)));
  }
  ~Impl() { close(); }

  void start_threads();
  void request(ClientRequest r, Done done);
  Result<Response> request_sync(ClientRequest r);
  void close();
  ClientStats stats() const;
  bool on_io_thread() const noexcept {
    return std::any_of(loops_.begin(), loops_.end(), [](const auto& l) { return l->on_thread(); });
  }

 private:
  std::unique_ptr<detail::ClientShared> s_;
  std::vector<std::unique_ptr<detail::ClientLoop>> loops_;
  std::atomic<std::size_t> next_loop_{0};
  std::shared_mutex close_mu_;
  bool closed_ = false;  // guarded by close_mu_
  bool joined_ = false;  // guarded by join_mu_
  std::mutex join_mu_;
};

void Client::Impl::start_threads() {
  for (auto& loop : loops_) {
    detail::ClientLoop* l = loop.get();
    l->thread = std::thread([l] {
      l->thread_id.store(std::this_thread::get_id());
      auto work = asio::make_work_guard(l->io);
      for (;;) {
        try {
          l->io.run();
          return;
        } catch (...) {
          // A `done` that throws is caught where it is called; anything
          // else is a bug in this file, and the loop must go on regardless.
        }
      }
    });
  }
}

void Client::Impl::request(ClientRequest r, Done done) {
  std::shared_lock lk(close_mu_);
  if (closed_) {
    lk.unlock();
    if (done) done(Error(ErrorCode::shutting_down, "the client for " + s_->where + " is closed"));
    return;
  }
  detail::PendingRequest p;
  p.done = std::move(done);
  p.head = r.method == "HEAD";
  p.idempotent = r.method == "GET" || p.head;
  p.timeout = r.timeout.value_or(s_->settings.request_timeout);
  p.deadline = detail::deadline_in(p.timeout);
  auto& loop = *loops_[next_loop_.fetch_add(1, std::memory_order_relaxed) % loops_.size()];
  const std::size_t bound = s_->settings.max_connections + s_->settings.max_queued;
  std::optional<Error> refused;
  if (!detail::serialize_request(r, s_->where, p.wire)) {
    refused = Error(ErrorCode::invalid_argument, "request " + r.method.substr(0, 32) + " " +
                                                     r.target.substr(0, 64) +
                                                     ": the method, target or a header is not valid HTTP");
  } else if (s_->outstanding.fetch_add(1, std::memory_order_relaxed) >= bound) {
    s_->outstanding.fetch_sub(1, std::memory_order_relaxed);
    refused = Error(ErrorCode::buffer_overflow, "client for " + s_->where + ": " + std::to_string(bound) +
                                                    " requests already queued or in flight");
  }
  if (refused) {
    detail::bump(s_->c.failures);
    asio::post(loop.io, [done = std::move(p.done), e = std::move(*refused)]() mutable {
      try {
        if (done) done(std::move(e));
      } catch (...) {
      }
    });
    return;
  }
  detail::bump(s_->c.requests);
  if (!p.done) p.done = [](Result<Response>) {};
  asio::post(loop.io, [l = &loop, p = std::move(p)]() mutable { l->enqueue(std::move(p)); });
}

Result<Response> Client::Impl::request_sync(ClientRequest r) {
  if (on_io_thread())
    return Error(ErrorCode::invalid_argument,
                 "request_sync called on the client's own io thread (it would wait for itself)");
  std::promise<Result<Response>> promise;
  std::future<Result<Response>> future = promise.get_future();
  request(std::move(r), [&promise](Result<Response> outcome) { promise.set_value(std::move(outcome)); });
  return future.get();
}

void Client::Impl::close() {
  {
    std::unique_lock lk(close_mu_);
    if (!closed_) {
      closed_ = true;
      for (auto& l : loops_) asio::post(l->io, [lp = l.get()] { lp->shutdown(); });
    }
  }
  if (on_io_thread()) return;  // from `done`: the destructor joins
  std::lock_guard lk(join_mu_);
  if (joined_) return;
  for (auto& l : loops_)
    if (l->thread.joinable()) l->thread.join();
  joined_ = true;
}

ClientStats Client::Impl::stats() const {
  auto v = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const detail::ClientCounters& c = s_->c;
  ClientStats s;
  s.connections_opened = v(c.opened);
  s.connect_failures = v(c.connect_failures);
  s.requests = v(c.requests);
  s.responses = v(c.responses);
  s.failures = v(c.failures);
  s.timeouts = v(c.timeouts);
  s.retries = v(c.retries);
  return s;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (!impl_) return;
  if (impl_->on_io_thread()) {
    // Destroyed from its own `done`: see Server::~Server.
    impl_->close();
    (void)impl_.release();
    return;
  }
  impl_->close();
}

Result<std::unique_ptr<Client>> Client::create(ClientSettings settings) {
  auto bad = [](std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); };
  if (settings.host.empty()) return bad("client: host is empty");
  if (settings.port == 0) return bad("client: port 0");
  if (settings.io_threads < 1 || settings.io_threads > 64)
    return bad("client: io_threads must be between 1 and 64");
  if (settings.max_connections < static_cast<std::size_t>(settings.io_threads))
    return bad("client: max_connections must be at least io_threads");
  if (settings.connect_timeout <= Duration::zero() || settings.request_timeout <= Duration::zero())
    return bad("client: connect_timeout and request_timeout must be positive");
  if (settings.max_response_header_bytes < 64)
    return bad("client: max_response_header_bytes must be at least 64");

  auto shared = std::make_unique<detail::ClientShared>();
  shared->where = authority(settings.host, settings.port);
  {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    std::error_code ec;
    auto results = resolver.resolve(settings.host, std::to_string(settings.port), ec);
    if (ec || results.empty())
      return bad("client: cannot resolve '" + settings.host + "': " + (ec ? ec.message() : "no address"));
    for (const auto& r : results) shared->endpoints.push_back(r.endpoint());
  }
  shared->settings = std::move(settings);
  auto impl = std::make_unique<Impl>(std::move(shared));
  impl->start_threads();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

void Client::request(ClientRequest request, Done done) {
  impl_->request(std::move(request), std::move(done));
}

void Client::request(std::string method, std::string target, std::string body, std::string content_type,
                     Done done, std::optional<Duration> timeout) {
  ClientRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  r.timeout = timeout;
  impl_->request(std::move(r), std::move(done));
}

Result<Response> Client::request_sync(ClientRequest request) {
  return impl_->request_sync(std::move(request));
}

Result<Response> Client::request_sync(std::string method, std::string target, std::string body,
                                      std::string content_type, std::optional<Duration> timeout) {
  ClientRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  r.timeout = timeout;
  return impl_->request_sync(std::move(r));
}

ClientStats Client::stats() const { return impl_->stats(); }
void Client::close() { impl_->close(); }

}  // namespace troupe::http
