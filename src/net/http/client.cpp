// The HTTP client: io threads, each a Boost.Asio io_context with its own
// share of the connection pool and its own queue (ClientLoop, here), and
// the connections (client_connection.cpp). See http.hpp for the contract
// and client_parts.hpp for the threads and timers.
//
// Shutdown: close() marks the client closed under close_mu_ (request()
// holds it shared while it posts, so every post made before close() runs
// before the shutdown step), then posts to every loop a step that fails
// everything with shutting_down and stops the io_context, and joins.

#include <algorithm>
#include <future>
#include <mutex>
#include <shared_mutex>

#include "client_parts.hpp"
#include "troupe/core/detail/trace_box.hpp"
#include "troupe/net/url.hpp"

namespace troupe::http {

namespace detail {

// --- loop ------------------------------------------------------------------------

void ClientLoop::finish(PendingRequest& p, Result<Response> outcome) {
  s_.outstanding.fetch_sub(1, std::memory_order_relaxed);
  if (!outcome.ok()) count(s_.c.failures);
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
  sweep_.async_wait([this, at](const beast::error_code& ec) {
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
    count(s_.c.timeouts);
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

namespace asio = detail::asio;

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
  // Sent under a trace (SPEC X4): the server hears of it in a traceparent
  // header (unless the caller wrote one), and `done` runs under it again.
  if (troupe::detail::t_trace) [[unlikely]] {
    auto has = [&](std::string_view n) {
      return std::any_of(r.headers.begin(), r.headers.end(), [&](const auto& h) { return detail::iequals(h.first, n); });
    };
    if (!has("traceparent")) r.headers.emplace_back("traceparent", current_trace()->traceparent());
    if (done) {
      done = [trace = troupe::detail::TraceRef::current(), d = std::move(done)](Result<Response> out) {
        troupe::detail::BorrowedTraceScope scope(trace);
        d(std::move(out));
      };
    }
  }
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
  if (auto wire = detail::request_wire(r, s_->where)) {
    p.wire = std::move(*wire);
  } else {
    refused = Error(ErrorCode::invalid_argument, "request " + r.method.substr(0, 32) + " " +
                                                     r.target.substr(0, 64) +
                                                     ": the method, target or a header is not valid HTTP");
  }
  if (!refused && s_->outstanding.fetch_add(1, std::memory_order_relaxed) >= bound) {
    s_->outstanding.fetch_sub(1, std::memory_order_relaxed);
    refused = Error(ErrorCode::buffer_overflow, "client for " + s_->where + ": " + std::to_string(bound) +
                                                    " requests already queued or in flight");
  }
  if (refused) {
    detail::count(s_->c.failures);
    asio::post(loop.io, [done = std::move(p.done), e = std::move(*refused)]() mutable {
      try {
        if (done) done(std::move(e));
      } catch (...) {
      }
    });
    return;
  }
  detail::count(s_->c.requests);
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
  if (settings.tls) {
    auto ctx = detail::client_context(settings.tls_ca_file);
    if (!ctx.ok()) return bad("client: " + ctx.error().message());
    shared->tls = std::move(*ctx);
  }
  {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    detail::beast::error_code ec;
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
