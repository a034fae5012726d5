// The TCP transport's connections from birth to close, on the io thread:
// accepting, dialling (by address or by name), the HELLO handshake in both
// directions with its timeouts, and closing, which counts bad input, tells
// the PeerHandler and schedules a redial. See transport_impl.hpp for the
// threads and locks.

#include "transport_impl.hpp"  // first: it includes Asio first

#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {

// --- connections (io thread) -----------------------------------------------------------

void Transport::Impl::accept() {
  acceptor_.async_accept([this](const std::error_code& ec, Socket socket) {
    if (stopped_.load()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors or memory: try again shortly rather than spin.
      log("accept failed: " + ec.message() + "; retrying in 100 ms");
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](const std::error_code& e) {
        if (!e && !stopped_.load()) accept();
      });
      return;
    }
    bump(c_.connections_accepted);
    auto c = std::make_shared<Connection>(std::move(socket), true, s_.max_frame_bytes);
    std::error_code ignored;
    const Endpoint remote = c->socket.remote_endpoint(ignored);
    c->remote_ip = remote.address().to_string();
    c->remote = c->remote_ip + ":" + std::to_string(remote.port());
    if (admit(c)) {
      with_tls(c);
      live_.insert(c);
      begin(c);
    }
    accept();
  });
}

void Transport::Impl::dial(const PeerPtr& p) {
  if (stopped_.load() || p->conn) return;
  std::string host;
  std::uint16_t port = 0;
  {
    std::lock_guard pl(p->mu);
    if (p->removed) return;
    host = p->host;
    port = p->port;
  }
  auto c = std::make_shared<Connection>(Socket(io_), false, s_.max_frame_bytes);
  c->peer = p;
  c->remote = host + ":" + std::to_string(port);
  with_tls(c);
  p->conn = c;
  live_.insert(c);
  arm(c, s_.connect_timeout, &Impl::on_connect_timeout);
  std::error_code ec;
  const asio::ip::address addr = asio::ip::make_address(host, ec);
  if (!ec) {
    c->socket.async_connect(Endpoint(addr, port), [this, c](const std::error_code& e) { on_connected(c, e); });
    return;
  }
  c->resolver = std::make_unique<asio::ip::tcp::resolver>(io_);
  c->resolver->async_resolve(
      host, std::to_string(port), [this, c](const std::error_code& e, asio::ip::tcp::resolver::results_type r) {
        if (c->state != Connection::State::connecting) return;
        if (e) {
          close(c, "cannot resolve: " + e.message());
          return;
        }
        asio::async_connect(c->socket, r,
                            [this, c](const std::error_code& e2, const Endpoint&) { on_connected(c, e2); });
      });
}

void Transport::Impl::on_connected(const ConnPtr& c, const std::error_code& ec) {
  if (c->state != Connection::State::connecting || stopped_.load()) return;
  if (ec) {
    close(c, ec.message());
    return;
  }
  bump(c_.connections_opened);
  begin(c);
}

// With TLS: the connection gets a stream over its socket, made with the
// context in use now (a reload changes it for later connections only).
void Transport::Impl::with_tls(const ConnPtr& c) {
  std::lock_guard lk(tls_mu_);
  if (!tls_ctx_) return;
  c->tls_ctx = tls_ctx_;
  c->tls = std::make_unique<tcp::TlsChannel>(c->tls_ctx->native_handle(), c->inbound);
}

// A TCP connection is up: TLS first if configured (transport_tls.cpp), then
// HELLOs, all within handshake_timeout.
void Transport::Impl::begin(const ConnPtr& c) {
  std::error_code ignored;
  // Batching is ours; Nagle would only delay the first frame of a batch.
  c->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  c->state = Connection::State::handshaking;
  arm(c, s_.handshake_timeout, &Impl::on_handshake_timeout);
  if (c->tls) {
    if (tls_handshake(c)) start_read(c);
    return;
  }
  say_hello(c);
  start_read(c);
}

// The dialer says HELLO at once; the acceptor answers only a HELLO it
// accepts, so a dialer that gets the answer knows it was accepted.
void Transport::Impl::say_hello(const ConnPtr& c) {
  if (c->inbound) return;
  tcp::append_hello(c->control, incarnation_, s_.node_id);
  start_write(c);
}

void Transport::Impl::arm(const ConnPtr& c, Duration after, void (Impl::*fire)(const ConnPtr&)) {
  const std::uint64_t gen = ++c->timer_gen;
  c->timer.expires_after(after);
  c->timer.async_wait([this, c, gen, fire](const std::error_code& ec) {
    if (ec || gen != c->timer_gen || c->state == Connection::State::closed || stopped_.load()) return;
    (this->*fire)(c);
  });
}

void Transport::Impl::on_connect_timeout(const ConnPtr& c) {
  if (c->state == Connection::State::connecting) close(c, "no TCP connection within " + millis(s_.connect_timeout));
}

void Transport::Impl::on_handshake_timeout(const ConnPtr& c) {
  if (c->state != Connection::State::handshaking) return;
  // Strangers may hold many connections open: their timeouts are logged as
  // refusals are, once a minute per address.
  close(c, std::string(c->tls ? "no TLS handshake and HELLO within " : "no HELLO within ") +
               millis(s_.handshake_timeout),
        Bad::handshake_timeout, c->inbound && !log_refusal(*c));
}

// --- handshake -----------------------------------------------------------------------

bool Transport::Impl::on_hello(const ConnPtr& c, const Frame& f) {
  if (auto valid = validate_node_id(f.node_id); !valid.ok()) {
    close(c, "HELLO carries an invalid node id: " + valid.error().message(), Bad::invalid_node_id);
    return false;
  }
  if (f.node_id == s_.node_id) {
    close(c, "HELLO claims this node's own id '" + s_.node_id + "'", Bad::own_node_id);
    return false;
  }
  // Before anything else learns of the claimed id: the certificate must name it.
  if (c->tls && c->inbound && !names_match(c, f.node_id)) return false;
  if (c->inbound) {
    if (!(f.node_id < std::string_view(s_.node_id))) {
      close(c,
            "node '" + std::string(f.node_id) + "' has the larger id: it accepts from '" + s_.node_id +
                "' and must not dial it",
            Bad::wrong_direction);
      return false;
    }
    PeerPtr p = find(f.node_id);
    if (!p && s_.accept_unknown_nodes) p = add_unaddressed(std::string(f.node_id));
    if (!p) {
      close(c, "node '" + std::string(f.node_id) + "' is not in the address book", Bad::unknown_node);
      return false;
    }
    // A node dials again only when it has given up on its old connection;
    // whatever that one still carries is not worth keeping.
    if (p->conn && p->conn != c) close(p->conn, "replaced by a new connection from the same node");
    c->peer = p;
    p->conn = c;
    tcp::append_hello(c->control, incarnation_, s_.node_id);
  } else if (f.node_id != c->peer->id) {
    close(c, "the node there answered as '" + std::string(f.node_id) + "'", Bad::unexpected_node);
    return false;
  }
  establish(c, f.incarnation);
  return c->state == Connection::State::established && !stopped_.load();
}

void Transport::Impl::establish(const ConnPtr& c, std::uint64_t incarnation) {
  Peer& p = *c->peer;
  uncount(*c);
  c->state = Connection::State::established;
  c->last_input = std::chrono::steady_clock::now();
  c->got_input = false;
  bump(c_.handshakes);
  std::uint64_t before;
  {
    std::lock_guard pl(p.mu);
    before = p.incarnation;
    p.incarnation = incarnation;
    p.ready = true;
    p.direct_fd = c->socket.native_handle();
    // From here on the channel is used under mu only.
    p.direct_tls = c->tls.get();
  }
  if (before != 0 && before != incarnation) {
    bump(c_.peer_restarts);
    log("node " + p.id + " restarted: incarnation " + hex(before) + " -> " + hex(incarnation));
  }
  std::string line = c->inbound ? "accepted " + p.id + " from " + c->remote : "connected to " + p.id + " at " + c->remote;
  if (p.failure_logged) line += " after " + std::to_string(p.failures) + " failed attempt(s)";
  log(line + " (incarnation " + hex(incarnation) + ")");
  p.failures = 0;
  p.failure_logged = false;
  arm(c, s_.keepalive_interval, &Impl::on_keepalive);
  if (peer_handler_) guarded("the peer handler", [&] { peer_handler_(p.id, true); });
  if (c->state == Connection::State::established) start_write(c);
}

// --- closing -------------------------------------------------------------------------

void Transport::Impl::close(ConnPtr c, std::string_view reason, std::optional<Bad> bad, bool quiet) {
  if (c->state == Connection::State::closed) return;
  const auto was = c->state;
  c->state = Connection::State::closed;
  uncount(*c);
  ++c->timer_gen;
  c->timer.cancel();
  if (c->resolver) c->resolver->cancel();
  PeerPtr p = c->peer;
  if (p && p->conn == c) {
    // Before the socket closes (its descriptor may be reused at once): no
    // sender writes to it from now on, and one that is writing holds mu.
    std::lock_guard pl(p->mu);
    p->direct = false;
    p->direct_fd = -1;
    p->direct_tls = nullptr;
    if (p->partial_rest > 0) {
      // Its start went out on this connection; alone it would garble the next.
      p->pending.erase(0, p->partial_rest);
      p->partial_rest = 0;
      --p->pending_frames;
      bump(c_.frames_dropped);
    }
  }
  std::error_code ignored;
  c->socket.close(ignored);
  live_.erase(c);

  if (was == Connection::State::connecting) {
    if (!p->failure_logged) {
      log("cannot connect to " + p->id + " at " + c->remote + ": " + std::string(reason) +
          "; retrying with back-off up to " + millis(s_.reconnect_max) + ", quietly until it works");
      p->failure_logged = true;
    }
  } else {
    bump(c_.connections_closed);
    std::string line = "closed " + describe(*c) + ": " + std::string(reason);
    if (bad) {
      bump(c_.bad[static_cast<int>(*bad)]);
      line += " [";
      line += tcp::kBadNames[static_cast<int>(*bad)];
      line += "]";
    }
    if (!quiet) log(line);
  }
  if (!p || p->conn != c) return;
  p->conn.reset();
  bool removed;
  {
    std::lock_guard pl(p->mu);
    p->ready = false;
    p->flush_owed = false;
    p->in_flight = 0;
    removed = p->removed;
  }
  if (c->writing) bump(c_.frames_dropped, c->data_writing_frames);
  c->data_writing_frames = 0;
  if (was == Connection::State::established && peer_handler_)
    guarded("the peer handler", [&] { peer_handler_(p->id, false); });
  if (p->dials && !removed && !stopped_.load()) {
    if (was != Connection::State::established) ++p->failures;
    schedule_redial(p);
  }
}

}  // namespace troupe::cluster
