// One pooled connection of the HTTP client: connects, writes a request's
// bytes, feeds what arrives to Beast's response parser, and goes back to
// its loop's idle list or closes. See client_parts.hpp.

#include <algorithm>

#include "client_parts.hpp"

#include <openssl/x509v3.h>

namespace troupe::http::detail {

namespace {

constexpr std::size_t kReadRoom = 4u << 10;
// A buffer grown past this by a large response header is not kept idle.
constexpr std::size_t kKeepCapacity = 256u << 10;

}  // namespace

ClientConnection::ClientConnection(ClientLoop& loop, ClientShared& shared)
    : loop_(loop), s_(shared), socket_(Socket(loop.io)), timer_(loop.io) {}

void ClientConnection::connect() {
  connect_deadline_ = deadline_in(s_.settings.connect_timeout);
  arm(connect_deadline_);
  asio::async_connect(socket_.tcp(), s_.endpoints,
                      [self = shared_from_this()](const beast::error_code& ec, const asio::ip::tcp::endpoint&) {
                        self->on_connected(ec);
                      });
}

void ClientConnection::connect_failed(std::string why) {
  --loop_.connecting_;
  count(s_.c.connect_failures);
  state_ = State::closed;
  beast::error_code ignored;
  socket_.tcp().close(ignored);
  ++timer_gen_;
  timer_.cancel();
  loop_.on_closed(shared_from_this());
  loop_.on_connect_failed(why);
}

void ClientConnection::on_connected(const beast::error_code& ec) {
  if (state_ != State::connecting) return;  // timed out meanwhile, or shut down
  if (ec) return connect_failed("cannot connect to " + s_.where + ": " + ec.message());
  beast::error_code ignored;
  // A request goes out in one write; Nagle would only delay it.
  socket_.tcp().set_option(asio::ip::tcp::no_delay(true), ignored);
  if (!s_.tls) return on_handshake({});
  // TLS: the server's name for SNI and the certificate check, within what
  // is left of connect_timeout.
  socket_ = Stream(std::move(socket_.tcp()), s_.tls);
  SSL* ssl = socket_.tls_stream().native_handle();
  const std::string& name = s_.settings.tls_server_name.empty() ? s_.settings.host : s_.settings.tls_server_name;
  boost::system::error_code not_ip;
  (void)asio::ip::make_address(name, not_ip);
  bool named = false;
  if (!not_ip) {
    named = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) == 1;
  } else {
    // SSL_set_tlsext_host_name, without its macro's C cast.
    named = SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, const_cast<char*>(name.c_str())) == 1 &&
            SSL_set1_host(ssl, name.c_str()) == 1;
  }
  if (!named) return connect_failed("TLS to " + s_.where + ": cannot check the server's name '" + name + "'");
  socket_.tls_stream().async_handshake(ssl::stream_base::client, [self = shared_from_this()](const beast::error_code& e) {
    self->on_handshake(e);
  });
}

void ClientConnection::on_handshake(const beast::error_code& ec) {
  if (state_ != State::connecting) return;  // timed out meanwhile, or shut down
  if (ec) {
    std::string why = tls_reason(ec);
    const long verify = SSL_get_verify_result(socket_.tls_stream().native_handle());
    if (verify != X509_V_OK) why += ": " + std::string(X509_verify_cert_error_string(verify));
    return connect_failed("TLS handshake with " + s_.where + " failed: " + why);
  }
  --loop_.connecting_;
  count(s_.c.opened);
  state_ = State::idle;
  read();
  loop_.on_idle(shared_from_this());
}

void ClientConnection::send(PendingRequest&& p) {
  state_ = State::busy;
  current_.emplace(std::move(p));
  response_.emplace();
  limit(*response_, s_.settings, current_->head);
  got_bytes_ = false;
  if (!timer_armed_ || armed_at_ > current_->deadline) arm(current_->deadline);
  asio::async_write(socket_, asio::buffer(current_->wire),
                    [self = shared_from_this()](const beast::error_code& ec, std::size_t) {
                      if (ec && self->state_ == State::busy) self->on_lost("write failed: " + ec.message());
                    });
}

// Reads whenever the connection is open, idle ones included: that is how
// a keep-alive connection the server closed is noticed.
void ClientConnection::read() {
  if (reading_ || state_ == State::closed) return;
  reading_ = true;
  socket_.async_read_some(in_.prepare(kReadRoom), [self = shared_from_this()](const beast::error_code& ec,
                                                                               std::size_t n) {
    self->on_read(ec, n);
  });
}

void ClientConnection::on_read(const beast::error_code& ec, std::size_t n) {
  reading_ = false;
  if (state_ == State::closed) return;
  if (ec) {
    if (state_ != State::busy) {
      close();  // the server closed an idle keep-alive connection: normal
      return;
    }
    if (ec == asio::error::eof) {
      on_eof();
      return;
    }
    on_lost("the connection failed: " + ec.message());
    return;
  }
  in_.commit(n);
  if (state_ != State::busy) {
    close();  // bytes nobody asked for: the stream is out of step
    return;
  }
  got_bytes_ = got_bytes_ || n > 0;
  parse();
}

// Feeds what has arrived to the parser (beast_messages.hpp); delivers a
// complete response.
void ClientConnection::parse() {
  beast::error_code ec;
  switch (feed_response(response_, in_, s_.settings, current_->head, ec)) {
    case Fed::need_more:
    case Fed::header:  // (a request's step: not for responses)
      read();
      return;
    case Fed::refused:
      fail_and_close(malformed(ec));
      return;
    case Fed::done:
      // Anything after the response is not ours to read: close rather than
      // misread the next one.
      deliver_and_continue(response_->parser.get().keep_alive() && in_.size() == 0);
      return;
  }
}

// The server closed the connection while a request was on it.
void ClientConnection::on_eof() {
  BeastResponseParser& parser = response_->parser;
  if (parser.is_header_done()) {
    // A body that runs to the end of the stream ends here; any other is cut short.
    beast::error_code ec;
    parser.put_eof(ec);
    if (!ec && parser.is_done()) {
      deliver_and_continue(false);
      return;
    }
    fail_and_close(malformed(ec ? ec : bhttp::error::partial_message));
    return;
  }
  if (got_bytes_) {
    fail_and_close(malformed(bhttp::error::partial_message));
    return;
  }
  on_lost("the server closed the connection before responding");
}

Error ClientConnection::malformed(const beast::error_code& ec) const {
  return Error(ErrorCode::protocol_error, "malformed response from " + s_.where + ": " + ec.message());
}

void ClientConnection::deliver_and_continue(bool keep) {
  PendingRequest p = std::move(*current_);
  current_.reset();
  Response r = to_response(response_->parser.release());
  response_.reset();
  reused_ = true;
  if (keep) {
    state_ = State::idle;
    if (in_.capacity() > kKeepCapacity) in_ = beast::flat_buffer();
    read();
  } else {
    close();
  }
  auto self = shared_from_this();
  // The connection goes back to the pool before `done` runs, so a request
  // made from `done` can take it.
  if (keep) loop_.on_idle(self);
  count(s_.c.responses);
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
  const bool stale = reused_ && !got_bytes_;
  close();
  // A keep-alive connection the server closed just as the request went
  // out: the request was not processed if it is safe to say so (GET, HEAD).
  if (stale && p.idempotent && !p.retried) {
    p.retried = true;
    count(s_.c.retries);
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
  beast::error_code ignored;
  socket_.tcp().close(ignored);
  loop_.on_closed(shared_from_this());
}

void ClientConnection::arm(Clock::time_point at) {
  const std::uint64_t gen = ++timer_gen_;
  timer_armed_ = true;
  armed_at_ = at;
  timer_.expires_at(at);
  timer_.async_wait([self = shared_from_this(), gen](const beast::error_code& ec) {
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
      count(s_.c.connect_failures);
      close();
      loop_.on_connect_failed("cannot connect to " + s_.where + ": no connection within " +
                              millis(s_.settings.connect_timeout));
      return;
    case State::busy:
      if (now < current_->deadline) {
        arm(current_->deadline);
        return;
      }
      count(s_.c.timeouts);
      // The response may still come: this connection is out of step for good.
      fail_and_close(
          Error(ErrorCode::timeout, "no response from " + s_.where + " within " + millis(current_->timeout)));
      return;
    case State::idle:
    case State::closed:
      return;
  }
}

}  // namespace troupe::http::detail
