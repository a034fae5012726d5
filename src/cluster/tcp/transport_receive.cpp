// The TCP transport's inbound path, on the io thread: reading into a
// connection's decoder, delivering every complete frame (DATA to the
// Handler, HELLO to the handshake, PING answered), allowing the next send()
// a direct write, and the keepalive that closes a silent connection.

#include "transport_impl.hpp"  // first: it includes Asio first

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>

#include "tls.hpp"

namespace troupe::cluster {

namespace {

// A read asks the decoder for at least kReadMinFree bytes of room; the
// decoder's buffer starts at kReadBuffer, so a read usually takes whatever
// the kernel holds, up to that.
constexpr std::size_t kReadMinFree = 16u << 10;

}  // namespace

// Every keepalive_interval: PING if nothing arrived during the last one,
// close if nothing arrived for keepalive_timeout (measured from the tick
// that last saw input, so the close comes within one interval after it).
void Transport::Impl::on_keepalive(const ConnPtr& c) {
  if (c->state != Connection::State::established) return;
  const auto now = std::chrono::steady_clock::now();
  if (c->got_input) {
    c->got_input = false;
    c->last_input = now;
  } else if (now - c->last_input >= s_.keepalive_timeout) {
    bump(c_.keepalive_timeouts);
    close(c, "nothing received for " + millis(now - c->last_input) + " (keepalive_timeout " +
                 millis(s_.keepalive_timeout) + ")");
    return;
  } else {
    tcp::append_ping(c->control);
    bump(c_.pings_sent);
    start_write(c);
  }
  arm(c, s_.keepalive_interval, &Impl::on_keepalive);
}

// allow_direct() and deliver() run on every read, called only by on_read():
// inline, defined before it, deliver() always, so that both are compiled
// into it (the compiler would not inline deliver(), large and of external
// linkage, on its own).

// Input arrived: if nothing of ours is on its way out, the next send() may
// write to the socket itself (see transport_send.cpp).
inline void Transport::Impl::allow_direct(const ConnPtr& c) {
  if (c->state != Connection::State::established || c->writing || !c->control.empty()) return;
  Peer& p = *c->peer;
  std::lock_guard pl(p.mu);
  if (p.pending.empty() && p.direct_fd >= 0 && (!p.direct_tls || p.direct_tls->out.empty())) p.direct = true;
}

// Decodes and handles every complete frame read so far. False when the
// connection was closed or the transport stopped meanwhile.
[[gnu::always_inline]] inline bool Transport::Impl::deliver(const ConnPtr& c) {
  Frame f;
  std::uint64_t delivered = 0;
  bool pong = false;
  bool open = true;
  while (open) {
    const FrameDecoder::Status st = c->decoder.next(f);
    if (st == FrameDecoder::Status::need_more) break;
    if (st == FrameDecoder::Status::error) {
      close(c, c->decoder.error_message(), tcp::bad_from(c->decoder.error()));
      open = false;
      break;
    }
    const bool handshaking = c->state == Connection::State::handshaking;
    if (handshaking && f.kind != FrameKind::hello) {
      close(c, "first frame is " + std::string(tcp::to_string(f.kind)) + ", not HELLO", Bad::missing_hello);
      open = false;
      break;
    }
    switch (f.kind) {
      case FrameKind::hello:
        if (!handshaking) {
          close(c, "second HELLO on an established connection", Bad::second_hello);
          open = false;
        } else {
          open = on_hello(c, f);
        }
        break;
      case FrameKind::data:
        ++delivered;
        guarded("the frame handler", [&] { handler_(c->peer->id, f.type, f.payload); });
        // The handler may have stopped the transport; nothing more is delivered.
        if (stopped_.load(std::memory_order_relaxed)) open = false;
        break;
      case FrameKind::ping:
        tcp::append_pong(c->control);
        pong = true;
        break;
      case FrameKind::pong:
        break;
    }
  }
  bump(c_.frames_received, delivered);
  if (!open || c->state == Connection::State::closed) return false;
  if (c->state == Connection::State::handshaking) {
    // Refuse a first frame that is not a HELLO by its header, before making
    // room for a body that may be as large as max_frame_bytes.
    const int kind = c->decoder.pending_kind();
    if (kind >= 0 && kind != static_cast<int>(FrameKind::hello)) {
      close(c, "first frame is of kind " + std::to_string(kind) + ", not HELLO", Bad::missing_hello);
      return false;
    }
  }
  if (pong) start_write(c);
  return true;
}

void Transport::Impl::start_read(const ConnPtr& c) {
  auto done = [this, c](const std::error_code& ec, std::size_t n) { on_read(c, ec, n); };
  if (c->tls) {
    c->socket.async_read_some(asio::buffer(c->tls->in), std::move(done));
    return;
  }
  std::span<char> room = c->decoder.prepare(kReadMinFree);
  c->socket.async_read_some(asio::buffer(room.data(), room.size()), std::move(done));
}

// With TLS: feeds the n bytes of ciphertext read to the channel, advances
// the handshake, and decrypts what it can into the decoder. False when the
// connection was closed.
bool Transport::Impl::tls_input(const ConnPtr& c, std::size_t n) {
  tcp::TlsChannel& t = *c->tls;
  if (!t.done) {
    // Not yet shared with senders: no lock.
    BIO_write(t.rbio, t.in.data(), static_cast<int>(n));
    if (!tls_handshake(c)) return false;
    if (!t.done) return true;
    n = 0;
  }
  std::string failure;
  bool ended = false;
  bool answer;
  {
    std::unique_lock<std::mutex> pl;
    if (c->state == Connection::State::established) pl = std::unique_lock(c->peer->mu);
    ERR_clear_error();
    if (n > 0) BIO_write(t.rbio, t.in.data(), static_cast<int>(n));
    for (;;) {
      std::span<char> room = c->decoder.prepare(kReadMinFree);
      const int got = SSL_read(t.ssl, room.data(), static_cast<int>(std::min<std::size_t>(room.size(), 1u << 30)));
      if (got > 0) {
        c->decoder.commit(static_cast<std::size_t>(got));
        continue;
      }
      const int e = SSL_get_error(t.ssl, got);
      if (e == SSL_ERROR_ZERO_RETURN) ended = true;
      else if (e != SSL_ERROR_WANT_READ) failure = tcp::openssl_reason();
      break;
    }
    // What reading made OpenSSL say (a key update's answer) goes out in order.
    t.drain();
    answer = !t.out.empty();
  }
  if (!failure.empty()) {
    close(c, "read failed: " + failure);
    return false;
  }
  if (answer) start_write(c);
  if (ended) {
    // The peer said close_notify: whatever follows it is not read.
    if (deliver(c)) on_read(c, asio::error::eof, 0);
    return false;
  }
  return true;
}

void Transport::Impl::on_read(const ConnPtr& c, const std::error_code& ec, std::size_t n) {
  if (c->state == Connection::State::closed || stopped_.load()) return;
  if (ec) {
    if (c->tls && !c->tls->done) {
      refuse(c, tcp::Refused::tls_handshake, "TLS handshake failed: " + ec.message());
      return;
    }
    // A TLS peer closes without close_notify (this transport never sends
    // one): the stream ends as a plain one would.
    if (ec == asio::error::eof) {
      if (c->decoder.buffered() > 0) {
        close(c, "stream ended inside a frame (" + std::to_string(c->decoder.buffered()) + " bytes of it received)",
              Bad::truncated);
      } else {
        close(c, "closed by the peer");
      }
    } else {
      close(c, "read failed: " + ec.message());
    }
    return;
  }
  bump(c_.reads);
  bump(c_.bytes_received, n);
  if (!c->tls)
    c->decoder.commit(n);
  else if (!tls_input(c, n))
    return;
  c->got_input = true;
  // Before the handler runs: what it delivers may be answered at once, from
  // this thread or another.
  allow_direct(c);
  if (deliver(c)) start_read(c);
}

}  // namespace troupe::cluster
