// The TCP transport's outbound path: send() and send_encoded() append
// encoded frames to a peer's buffer, and the io thread writes them.
//
// Write path (double buffering): send() appends to Peer::pending and posts a
// flush only when the peer is ready and no flush is owed. The io thread
// swaps `pending` with the connection's empty `data_writing` and hands it,
// with any PING/PONG/HELLO bytes, to one async_write; when that completes it
// swaps again. Both strings keep their capacity, so a busy connection
// allocates nothing and one writev carries everything queued meanwhile.
//
// Direct writes (a request answered on a quiet connection): posting a flush
// costs a wake-up of the io thread and a context switch each way, which is
// most of a round trip's latency on loopback. So when input has just
// arrived on an established connection that has nothing queued and no write
// in progress, the io thread sets Peer::direct, and the next send() writes
// its frame to the socket itself (non-blocking, under Peer::mu) instead of
// waking the io thread. Each arrival allows one such write: a thread that
// streams frames writes the first one itself and queues the rest for the io
// thread, so under load frames are still batched, one writev for many. A
// write that the socket takes only in part leaves the rest at the head of
// `pending` (`partial_rest` bytes) and wakes the io thread, which writes
// that rest before anything else, control frames included; if the
// connection closes first, the rest is dropped with it, since its start
// went out on that connection.
//
// With TLS the same, one layer down: a direct writer encrypts its frame
// into the channel's ciphertext buffer (TlsChannel::out, empty when direct
// is set) and writes what the socket takes; the rest stays there, and the
// io thread writes it before it encrypts anything newer behind it. Frames
// are whole in the TLS stream, so `partial_rest` stays 0.

#include "transport_impl.hpp"  // first: it includes Asio first

#include "tls.hpp"

#include <openssl/err.h>
#include <sys/socket.h>
#include <sys/types.h>

namespace troupe::cluster {

namespace {

// A write buffer larger than this is released after its write instead of
// being kept for the next batch.
constexpr std::size_t kKeepWriteCapacity = 4u << 20;

using tcp::Counters;
using tcp::Peer;
using tcp::PeerMap;

// The helpers of send() below are free functions of this file, not members
// of Impl, and shaped for the compiler: what runs per frame is inlined into
// send(), what builds a refusal stays out of its way. Internal linkage lets
// the compiler inline a function into its few callers; the address book's
// lookup, a library template of external linkage since its types are shared
// between files, is inlined whole by `flatten`.

[[gnu::flatten]] PeerMap::iterator find_peer(PeerMap& peers, std::string_view node) { return peers.find(node); }

[[gnu::cold]] [[gnu::noinline]] Error stopped_error(const std::string& node) {
  return Error(ErrorCode::shutting_down, "transport of node '" + node + "' is stopped");
}

[[gnu::cold]] [[gnu::noinline]] Error too_large_error(std::size_t payload, std::size_t max_frame_bytes) {
  return Error(ErrorCode::invalid_argument, "a " + std::to_string(payload) + "-byte payload exceeds max_frame_bytes " +
                                                std::to_string(max_frame_bytes) + " with its 6-byte header");
}

// With p.mu held and p.direct set: p.pending holds exactly the `frames` just
// appended (direct implies it was empty). Writes what the socket takes now,
// without blocking; whatever it does not take (a full socket buffer, or an
// error the io thread's write will meet and close the connection for) stays
// at the head of `pending` for the io thread. True when it must be woken.
bool write_direct_tls(Counters& c, Peer& p, std::uint64_t frames) noexcept {
  tcp::TlsChannel& t = *p.direct_tls;
  // A failure leaves the frame to the io thread, which meets it too and closes.
  if (!t.encrypt(p.pending)) {
    ERR_clear_error();  // this thread's; the io thread reports the failure
    p.flush_owed = true;
    return true;
  }
  bump(c.direct_writes);
  bump(c.frames_sent, frames);
  p.pending.clear();
  p.pending_frames = 0;
  const ssize_t n = ::send(p.direct_fd, t.out.data(), t.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(t.out.size())) {
    bump(c.write_batches);
    bump(c.bytes_sent, t.out.size());
    t.out.clear();
    return false;
  }
  if (n > 0) {
    bump(c.bytes_sent, static_cast<std::size_t>(n));
    t.out.erase(0, static_cast<std::size_t>(n));
  }
  p.in_flight = t.out.size();
  p.flush_owed = true;
  return true;
}

bool write_direct(Counters& c, Peer& p, std::uint64_t frames) noexcept {
  // One direct write per arrival: the next send() queues, so a stream of
  // sends is batched by the io thread.
  p.direct = false;
  if (p.direct_tls) return write_direct_tls(c, p, frames);
  const ssize_t n = ::send(p.direct_fd, p.pending.data(), p.pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(p.pending.size())) {
    bump(c.write_batches);
    bump(c.direct_writes);
    bump(c.bytes_sent, p.pending.size());
    bump(c.frames_sent, frames);
    p.pending.clear();
    p.pending_frames = 0;
    return false;
  }
  if (n > 0) {
    // Frames the socket took whole are sent; the rest of the one it cut
    // must be the next bytes on this connection.
    const auto written = static_cast<std::size_t>(n);
    std::size_t whole_end = 0;
    std::uint64_t whole = 0;
    for (;;) {
      const std::size_t end = whole_end + tcp::encoded_frame_size(p.pending.data() + whole_end);
      if (end > written) {
        p.partial_rest = end - written;
        break;
      }
      whole_end = end;
      ++whole;
      if (whole_end == written) break;
    }
    bump(c.bytes_sent, written);
    bump(c.frames_sent, whole);
    p.pending_frames -= whole;
    p.pending.erase(0, written);
  }
  p.flush_owed = true;
  return true;
}

// With p.mu held, after `frames` frames were appended to p.pending: writes
// them at once if the connection allows a direct write, else leaves them for
// the io thread. True when the io thread must be woken to flush.
bool queued(Counters& c, Peer& p, std::uint64_t frames) noexcept {
  p.pending_frames += frames;
  if (p.direct) return write_direct(c, p, frames);
  const bool post = p.ready && !p.flush_owed;
  if (post) p.flush_owed = true;
  return post;
}

}  // namespace

// --- send ------------------------------------------------------------------------

Result<void> Transport::Impl::enqueue(std::string_view to, std::size_t bytes, std::uint64_t frames,
                                      const std::function<void(std::string&)>& append) {
  std::shared_lock lk(peers_mu_);
  auto it = peers_.find(to);
  if (it == peers_.end()) {
    lk.unlock();
    bump(c_.refused_unknown);
    return Error(ErrorCode::unreachable, "node '" + std::string(to) + "' is not in the address book");
  }
  Peer& p = *it->second;
  bool fits;
  bool post = false;
  std::size_t held;
  {
    std::lock_guard pl(p.mu);
    held = p.pending.size() + p.in_flight;
    fits = bytes <= s_.max_outbound_bytes && held <= s_.max_outbound_bytes - bytes;
    if (fits) {
      append(p.pending);
      post = queued(c_, p, frames);
    }
  }
  if (!fits) {
    lk.unlock();
    bump(c_.refused_full);
    return Error(ErrorCode::buffer_overflow, "outbound buffer for node '" + std::string(to) + "' is full: " +
                                                 std::to_string(held) + " bytes held, " + std::to_string(bytes) +
                                                 " more would pass max_outbound_bytes " +
                                                 std::to_string(s_.max_outbound_bytes));
  }
  if (post) asio::post(io_, [this, peer = it->second] { flush(peer); });
  return {};
}

Result<void> Transport::Impl::send(std::string_view to, std::uint32_t type, std::string_view payload) {
  if (stopped_.load(std::memory_order_relaxed))
    return stopped_error(s_.node_id);
  const std::size_t bytes = data_frame_size(payload.size());
  if (bytes - frame_length_bytes > s_.max_frame_bytes) {
    bump(c_.refused_too_large);
    return too_large_error(payload.size(), s_.max_frame_bytes);
  }
  // The common case inline: a std::function per frame (enqueue) would cost
  // an indirect call. Refusals take the slow path, which builds the error.
  {
    std::shared_lock lk(peers_mu_);
    auto it = find_peer(peers_, to);
    if (it != peers_.end()) {
      Peer& p = *it->second;
      bool fits;
      bool post = false;
      {
        std::lock_guard pl(p.mu);
        const std::size_t held = p.pending.size() + p.in_flight;
        fits = bytes <= s_.max_outbound_bytes && held <= s_.max_outbound_bytes - bytes;
        if (fits) {
          append_data_frame(p.pending, type, payload);
          post = queued(c_, p, 1);
        }
      }
      if (fits) {
        if (post) asio::post(io_, [this, peer = it->second] { flush(peer); });
        return {};
      }
    }
  }
  return enqueue(to, bytes, 1, [&](std::string& out) { append_data_frame(out, type, payload); });
}

// In this file rather than with the rest of the facade (transport.cpp), so
// that the per-message call can be inlined into it.
Result<void> Transport::send(std::string_view to, std::uint32_t type, std::string_view payload) {
  return impl_->send(to, type, payload);
}
Result<void> Transport::send_encoded(std::string_view to, std::string_view frames) {
  return impl_->send_encoded(to, frames);
}

Result<void> Transport::Impl::send_encoded(std::string_view to, std::string_view frames) {
  if (stopped_.load(std::memory_order_relaxed))
    return stopped_error(s_.node_id);
  std::size_t count = 0;
  std::string why;
  if (!tcp::count_data_frames(frames, s_.max_frame_bytes, count, why)) {
    bump(c_.refused_too_large);
    return Error(ErrorCode::invalid_argument, "send_encoded: " + why);
  }
  if (count == 0) return {};
  return enqueue(to, frames.size(), count, [&](std::string& out) { out.append(frames.data(), frames.size()); });
}

// --- writing (io thread) ------------------------------------------------------------

void Transport::Impl::flush(const PeerPtr& p) {
  const ConnPtr c = p->conn;
  if (c && c->state == Connection::State::established) {
    // A write in progress looks at `pending` again when it completes.
    if (!c->writing) start_write(c);
    return;
  }
  std::lock_guard pl(p->mu);
  if (!p->ready) p->flush_owed = false;
}

void Transport::Impl::start_write(const ConnPtr& c) {
  if (c->writing || c->state == Connection::State::closed || c->state == Connection::State::connecting) return;
  if (c->tls) {
    start_tls_write(c);
    return;
  }
  c->data_writing.clear();
  c->data_writing_frames = 0;
  bool control_waits = false;
  if (c->state == Connection::State::established) {
    Peer& p = *c->peer;
    std::lock_guard pl(p.mu);
    // From here until a read allows it again, only this thread writes.
    p.direct = false;
    // The rest of a frame a sender began writing itself must be the next
    // bytes on the wire: control frames wait for the write after this one.
    control_waits = std::exchange(p.partial_rest, 0) > 0;
    if (!p.pending.empty()) {
      c->data_writing.swap(p.pending);
      c->data_writing_frames = p.pending_frames;
      p.pending_frames = 0;
    }
    p.in_flight = c->data_writing.size();
    p.flush_owed = !c->data_writing.empty() || !c->control.empty();
  }
  c->control_writing.clear();
  if (!control_waits) c->control_writing.swap(c->control);
  if (c->control_writing.empty() && c->data_writing.empty()) return;
  c->writing = true;
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(c->control_writing), asio::buffer(c->data_writing)};
  asio::async_write(c->socket, buffers,
                    [this, c](const std::error_code& ec, std::size_t n) { on_written(c, ec, n); });
}

// With TLS: control frames and `pending` are encrypted behind what the
// channel holds already, and all of it is written in one go.
void Transport::Impl::start_tls_write(const ConnPtr& c) {
  tcp::TlsChannel& t = *c->tls;
  bool ok = true;
  c->data_writing.clear();
  c->data_writing_frames = 0;
  {
    Peer* p = c->state == Connection::State::established ? c->peer.get() : nullptr;
    std::unique_lock<std::mutex> pl;
    if (p) {
      pl = std::unique_lock(p->mu);
      // From here until a read allows it again, only this thread writes.
      p->direct = false;
    }
    if (t.done && !c->control.empty()) {
      ok = t.encrypt(c->control);
      c->control.clear();
    }
    if (ok && p && !p->pending.empty()) {
      ok = t.encrypt(p->pending);
      // Encrypted or lost with the connection: never sent twice.
      if (ok)
        c->data_writing_frames = p->pending_frames;
      else
        bump(c_.frames_dropped, p->pending_frames);
      p->pending_frames = 0;
      if (p->pending.capacity() > kKeepWriteCapacity)
        std::string().swap(p->pending);
      else
        p->pending.clear();
    }
    c->data_writing.swap(t.out);
    if (p) {
      p->in_flight = c->data_writing.size();
      p->flush_owed = !c->data_writing.empty();
    }
  }
  if (!ok) {
    close(c, "write failed: " + tcp::openssl_reason());
    return;
  }
  if (c->data_writing.empty()) return;
  c->writing = true;
  asio::async_write(c->socket, asio::buffer(c->data_writing),
                    [this, c](const std::error_code& ec, std::size_t n) { on_written(c, ec, n); });
}

void Transport::Impl::on_written(const ConnPtr& c, const std::error_code& ec, std::size_t n) {
  c->writing = false;
  if (c->state == Connection::State::closed || stopped_.load()) return;
  if (ec) {
    bump(c_.frames_dropped, c->data_writing_frames);
    c->data_writing_frames = 0;
    close(c, "write failed: " + ec.message());
    return;
  }
  bump(c_.write_batches);
  bump(c_.bytes_sent, n);
  bump(c_.frames_sent, c->data_writing_frames);
  c->data_writing_frames = 0;
  if (c->data_writing.capacity() > kKeepWriteCapacity) std::string().swap(c->data_writing);
  start_write(c);
}

}  // namespace troupe::cluster
