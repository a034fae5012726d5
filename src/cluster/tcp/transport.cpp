// The public face of the TCP transport: Transport::start() with its
// checks of the settings, the calls Transport forwards to its Impl, and the
// Impl's start-up (listening, the io thread), shutdown and counters. The
// rest of the Impl is in the files transport_impl.hpp lists.

#include "transport_impl.hpp"  // first: it includes Asio first

#include <limits>

#include "troupe/cluster/node_id.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster {

namespace {

// The largest HELLO, which every max_frame_bytes must admit.
constexpr std::size_t kMinFrameLimit = 2 + tcp::hello_fixed_bytes + max_node_id_length;

}  // namespace

// --- set-up and shutdown -----------------------------------------------------------

Result<void> Transport::Impl::listen() {
  std::error_code ec;
  Endpoint ep;
  const asio::ip::address addr = asio::ip::make_address(s_.listen_host, ec);
  if (!ec) {
    ep = Endpoint(addr, s_.listen_port);
  } else {
    asio::ip::tcp::resolver resolver(io_);
    auto results = resolver.resolve(s_.listen_host, std::to_string(s_.listen_port), ec);
    if (ec || results.empty())
      return Error(ErrorCode::invalid_argument,
                   "cannot resolve listen host '" + s_.listen_host + "': " + (ec ? ec.message() : "no address"));
    ep = *results.begin();
  }
  const std::string where = s_.listen_host + ":" + std::to_string(s_.listen_port);
  if (acceptor_.open(ep.protocol(), ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  // A restarted node takes its port back at once, past TIME_WAIT.
  acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (acceptor_.bind(ep, ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  if (acceptor_.listen(asio::socket_base::max_listen_connections, ec); ec)
    return Error(ErrorCode::invalid_argument, "cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint(ec).port();
  return {};
}

void Transport::Impl::start_thread() {
  asio::post(io_, [this] {
    accept();
    poll_tls_files();
  });
  thread_ = std::thread([this] {
    io_id_.store(std::this_thread::get_id());
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        log(std::string("io thread: unexpected exception: ") + e.what());
      } catch (...) {
        log("io thread: unexpected exception");
      }
    }
  });
}

void Transport::Impl::stop() {
  if (on_io_thread()) {
    // From a handler: nothing more is delivered once that handler returns;
    // the io thread is joined by whoever destroys the transport.
    stopped_.store(true);
    io_.stop();
    return;
  }
  std::lock_guard lk(stop_mu_);
  stopped_.store(true);
  io_.stop();
  if (thread_.joinable()) {
    thread_.join();
    cleanup();
  }
}

// After the io thread has been joined: close what is open and break the
// Peer <-> Connection cycles, so that destroying io_ (which destroys the
// handlers it still holds) frees everything.
void Transport::Impl::cleanup() {
  std::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  tls_poll_.cancel();
  for (const ConnPtr& c : live_) {
    if (c->peer) {
      // A sender may be writing to this socket itself; it holds mu while it does.
      std::lock_guard pl(c->peer->mu);
      c->peer->direct = false;
      c->peer->direct_fd = -1;
      c->peer->direct_tls = nullptr;
    }
    c->state = Connection::State::closed;
    c->timer.cancel();
    if (c->resolver) c->resolver->cancel();
    c->socket.close(ignored);
    c->peer.reset();
  }
  live_.clear();
  std::unique_lock lk(peers_mu_);
  for (auto& [id, p] : peers_) {
    p->conn.reset();
    p->redial.cancel();
  }
  peers_.clear();
}

void Transport::Impl::log(std::string_view line) noexcept {
  try {
    if (s_.log) s_.log(line);
  } catch (...) {
    // A failing log sink must not take the transport down.
  }
}

std::string Transport::Impl::describe(const Connection& c) {
  if (!c.inbound) return "connection to " + c.peer->id + " at " + c.remote;
  if (c.peer) return "connection from " + c.peer->id + " at " + c.remote;
  return "connection from " + c.remote;
}

Transport::Impl::PeerPtr Transport::Impl::find(std::string_view node) const {
  std::shared_lock lk(peers_mu_);
  auto it = peers_.find(node);
  return it == peers_.end() ? nullptr : it->second;
}

// --- counters ------------------------------------------------------------------------

TransportStats Transport::Impl::stats() const {
  auto v = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  TransportStats s;
  s.frames_sent = v(c_.frames_sent);
  s.bytes_sent = v(c_.bytes_sent);
  s.frames_received = v(c_.frames_received);
  s.bytes_received = v(c_.bytes_received);
  s.write_batches = v(c_.write_batches);
  s.direct_writes = v(c_.direct_writes);
  s.reads = v(c_.reads);
  s.connections_opened = v(c_.connections_opened);
  s.connections_accepted = v(c_.connections_accepted);
  s.handshakes = v(c_.handshakes);
  s.connections_closed = v(c_.connections_closed);
  s.reconnects = v(c_.reconnects);
  s.peer_restarts = v(c_.peer_restarts);
  s.keepalive_timeouts = v(c_.keepalive_timeouts);
  s.pings_sent = v(c_.pings_sent);
  s.refused_full = v(c_.refused_full);
  s.refused_unknown = v(c_.refused_unknown);
  s.refused_too_large = v(c_.refused_too_large);
  s.frames_dropped = v(c_.frames_dropped);
  auto b = [&](Bad r) { return v(c_.bad[static_cast<int>(r)]); };
  BadInputCounts& x = s.closed_for_bad_input;
  x.undersized = b(Bad::undersized);
  x.oversized = b(Bad::oversized);
  x.bad_version = b(Bad::bad_version);
  x.unknown_kind = b(Bad::unknown_kind);
  x.short_body = b(Bad::short_body);
  x.bad_body = b(Bad::bad_body);
  x.truncated = b(Bad::truncated);
  x.missing_hello = b(Bad::missing_hello);
  x.second_hello = b(Bad::second_hello);
  x.invalid_node_id = b(Bad::invalid_node_id);
  x.own_node_id = b(Bad::own_node_id);
  x.wrong_direction = b(Bad::wrong_direction);
  x.unknown_node = b(Bad::unknown_node);
  x.unexpected_node = b(Bad::unexpected_node);
  x.handshake_timeout = b(Bad::handshake_timeout);
  auto r = [&](tcp::Refused why) { return v(c_.refused[static_cast<int>(why)]); };
  RefusedPeerCounts& y = s.refused_peers;
  y.tls_handshake = r(tcp::Refused::tls_handshake);
  y.no_certificate = r(tcp::Refused::no_certificate);
  y.untrusted_certificate = r(tcp::Refused::untrusted_certificate);
  y.name_mismatch = r(tcp::Refused::name_mismatch);
  y.over_address_limit = r(tcp::Refused::over_address_limit);
  y.over_total_limit = r(tcp::Refused::over_total_limit);
  s.tls_reloads = v(c_.tls_reloads);
  s.tls_reload_failures = v(c_.tls_reload_failures);
  return s;
}

// --- Transport -----------------------------------------------------------------------

Transport::Transport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Transport::~Transport() {
  if (!impl_) return;
  if (impl_->on_io_thread()) {
    // Destroyed from one of its own handlers: the io thread cannot join
    // itself, and freeing what it is running would pull the stack from
    // under it. Stop, and leave the rest to the thread's exit.
    impl_->stop();
    (void)impl_.release();
    return;
  }
  impl_->stop();
}

Result<std::unique_ptr<Transport>> Transport::start(TransportSettings settings, Handler handler,
                                                    PeerHandler peer_handler) {
  if (auto valid = validate_node_id(settings.node_id); !valid.ok()) return std::move(valid).error();
  auto bad = [](std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); };
  if (!handler) return bad("a frame handler is required");
  if (settings.max_frame_bytes < kMinFrameLimit || settings.max_frame_bytes > std::numeric_limits<std::uint32_t>::max())
    return bad("max_frame_bytes must be between " + std::to_string(kMinFrameLimit) + " and 2^32-1");
  if (settings.max_outbound_bytes == 0) return bad("max_outbound_bytes must be positive");
  if (settings.connect_timeout <= Duration::zero() || settings.handshake_timeout <= Duration::zero())
    return bad("connect_timeout and handshake_timeout must be positive");
  if (settings.reconnect_min <= Duration::zero() || settings.reconnect_max < settings.reconnect_min)
    return bad("reconnect_min must be positive and at most reconnect_max");
  if (settings.keepalive_interval <= Duration::zero() || settings.keepalive_timeout < settings.keepalive_interval)
    return bad("keepalive_interval must be positive and at most keepalive_timeout");
  if (settings.tls.configured() && settings.insecure)
    return bad("tls and insecure are exclusive: give TLS files or insecure = true, not both");
  if (!settings.tls.configured() && !settings.insecure)
    return bad("no TLS files (tls.cert_file, key_file, ca_file) and not insecure: plain TCP must be chosen "
               "explicitly with insecure = true");
  if (settings.max_handshakes == 0 || settings.max_handshakes_per_address == 0)
    return bad("max_handshakes and max_handshakes_per_address must be positive");
  if (!settings.log) {
    settings.log = [id = settings.node_id](std::string_view line) {
      log::info(log::Component::cluster, line, {{"transport", id}});
    };
  }
  auto impl = std::make_unique<Impl>(std::move(settings), std::move(handler), std::move(peer_handler));
  if (auto tls = impl->init_tls(); !tls.ok()) return std::move(tls).error();
  if (auto listening = impl->listen(); !listening.ok()) return std::move(listening).error();
  impl->start_thread();
  return std::unique_ptr<Transport>(new Transport(std::move(impl)));
}

std::uint16_t Transport::port() const noexcept { return impl_->port(); }
const std::string& Transport::node_id() const noexcept { return impl_->settings().node_id; }
std::uint64_t Transport::incarnation() const noexcept { return impl_->incarnation(); }

void Transport::set_peer(std::string node_id, std::string host, std::uint16_t port) {
  impl_->set_peer(std::move(node_id), std::move(host), port);
}
void Transport::remove_peer(std::string_view node_id) { impl_->remove_peer(node_id); }

// send() and send_encoded() are in transport_send.cpp, beside what they call.

bool Transport::connected(std::string_view node) const { return impl_->connected(node); }
std::vector<PeerStatus> Transport::peers() const { return impl_->peers(); }
TransportStats Transport::stats() const { return impl_->stats(); }
void Transport::stop() { impl_->stop(); }
Result<void> Transport::reload_tls() { return impl_->reload_tls(); }

}  // namespace troupe::cluster
