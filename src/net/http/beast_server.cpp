// The HTTP server on Boost.Beast: io threads, each a boost::asio::io_context
// with its own connections (beast_connection.cpp); the first also accepts
// and deals connections out in turn. See beast_server.hpp.

#include "beast_server.hpp"

namespace troupe::http {

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
    for (int i = 0; i < s_->settings.io_threads; ++i) loops_.push_back(std::make_shared<detail::ServerLoop>());
    acceptor_.emplace(loops_.front()->io);
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
  void on_accept(const std::shared_ptr<detail::ServerLoop>& loop, detail::Socket socket);

  std::shared_ptr<detail::Shared> s_;
  std::vector<std::shared_ptr<detail::ServerLoop>> loops_;
  std::optional<detail::asio::ip::tcp::acceptor> acceptor_;
  std::size_t next_loop_ = 0;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  bool joined_ = false;
};

Result<void> Server::Impl::listen() {
  namespace asio = detail::asio;
  const ServerSettings& st = s_->settings;
  const std::string where = st.host + ":" + std::to_string(st.port);
  boost::system::error_code ec;
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
  acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (acc.bind(ep, ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  if (acc.listen(asio::socket_base::max_listen_connections, ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  port_ = acc.local_endpoint(ec).port();
  return {};
}

void Server::Impl::start_threads() {
  detail::asio::post(loops_.front()->io, [this] { accept(); });
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
        }
      }
    });
  }
}

void Server::Impl::accept() {
  const std::size_t target = next_loop_++ % loops_.size();
  acceptor_->async_accept(loops_[target]->io,
                          [this, target](const boost::system::error_code& ec, detail::Socket socket) {
                            if (stopping_.load()) return;
                            if (ec) {
                              if (ec == detail::asio::error::operation_aborted) return;
                              s_->log("accept failed: " + ec.message());
                              accept();
                              return;
                            }
                            on_accept(loops_[target], std::move(socket));
                            accept();
                          });
}

namespace {
// A 503 written without waiting (what fits in the socket's buffer), then
// closed; on a TLS port closed only (the client expects a handshake).
void refuse(detail::Socket& socket, bool tls) {
  static const std::string kRefusal =
      detail::to_wire(*detail::to_beast(Response::error(503, "unavailable", "too many connections"), 11, false, true, {}));
  boost::system::error_code ignored;
  if (tls) {
    socket.close(ignored);
    return;
  }
  socket.non_blocking(true, ignored);
  socket.write_some(detail::asio::buffer(kRefusal), ignored);
  socket.shutdown(detail::asio::socket_base::shutdown_send, ignored);
  socket.close(ignored);
}
}  // namespace

void Server::Impl::on_accept(const std::shared_ptr<detail::ServerLoop>& loop, detail::Socket socket) {
  detail::bump(s_->c.accepted);
  if (s_->c.open.load(std::memory_order_relaxed) >= s_->settings.max_connections) {
    detail::bump(s_->c.refused);
    refuse(socket, s_->tls != nullptr);
    return;
  }
  std::string address;
  if (const std::size_t per = s_->settings.max_connections_per_address; per != 0) {
    boost::system::error_code ec;
    const auto ep = socket.remote_endpoint(ec);
    if (ec) {  // already gone
      socket.close(ec);
      return;
    }
    address = ep.address().to_string();
    if (!s_->per_address.take(address, per)) {
      detail::bump(s_->c.refused_per_address);
      refuse(socket, s_->tls != nullptr);
      return;
    }
  }
  s_->c.open.fetch_add(1, std::memory_order_relaxed);
  detail::Stream stream = s_->tls ? detail::Stream(std::move(socket), s_->tls->current()) : detail::Stream(std::move(socket));
  auto conn = std::make_shared<detail::ServerConnection>(s_, loop, std::move(stream));
  conn->hold_address(std::move(address));
  detail::asio::post(loop->io, [this, lp = loop.get(), conn] {
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
    detail::asio::post(loops_.front()->io, [this] {
      boost::system::error_code ignored;
      acceptor_->close(ignored);
    });
    for (auto& l : loops_) {
      detail::asio::post(l->io, [lp = l.get()] {
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
  boost::system::error_code ignored;
  acceptor_->close(ignored);
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
