// The TCP transport: one io thread (an asio::io_context) runs every socket,
// timer and handler; send() only touches a peer's outbound buffer under that
// peer's mutex. See transport.hpp for the contract and doc/wire.md for the
// protocol.
//
// Threads and locks:
//   - peers_mu_ (shared) guards the address book map. send() takes it shared;
//     set_peer/remove_peer take it exclusively. Order: peers_mu_, then a
//     Peer's mu.
//   - Peer::mu guards what send() and the io thread share: the outbound
//     buffer and its accounting, `ready`, `flush_owed`, `removed`, the
//     address and the incarnation, and the direct-write state (`direct`,
//     `direct_fd`, `partial_rest`). It is also held across a sender's own
//     write to the socket (below), so the io thread never closes or writes
//     to that socket meanwhile.
//   - Everything else (connections, timers, Peer::conn, back-off state) is
//     touched only on the io thread, or after it has been joined.
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

#include "../asio_headers.hpp"  // first: see there

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "frame.hpp"
#include "troupe/cluster/node_id.hpp"
#include "troupe/cluster/transport.hpp"

namespace troupe::cluster {

namespace {

using Socket = asio::ip::tcp::socket;
using Endpoint = asio::ip::tcp::endpoint;
using tcp::Frame;
using tcp::FrameDecoder;
using tcp::FrameError;
using tcp::FrameKind;

// A read asks the decoder for at least kReadMinFree bytes of room; the
// decoder's buffer starts at kReadBuffer, so a read usually takes whatever
// the kernel holds, up to that.
constexpr std::size_t kReadBuffer = 128u << 10;
constexpr std::size_t kReadMinFree = 16u << 10;
// A write buffer larger than this is released after its write instead of
// being kept for the next batch.
constexpr std::size_t kKeepWriteCapacity = 4u << 20;
// The largest HELLO, which every max_frame_bytes must admit.
constexpr std::size_t kMinFrameLimit = 2 + tcp::hello_fixed_bytes + max_node_id_length;

// Why a connection was closed for bad input: the index into the counters,
// in the order of BadInputCounts.
enum class Bad : int {
  undersized,
  oversized,
  bad_version,
  unknown_kind,
  short_body,
  bad_body,
  truncated,
  missing_hello,
  second_hello,
  invalid_node_id,
  own_node_id,
  wrong_direction,
  unknown_node,
  unexpected_node,
  handshake_timeout,
  count_,
};

constexpr std::array<const char*, static_cast<int>(Bad::count_)> kBadNames = {
    "undersized",   "oversized",       "bad_version",  "unknown_kind",    "short_body",
    "bad_body",     "truncated",       "missing_hello", "second_hello",   "invalid_node_id",
    "own_node_id",  "wrong_direction", "unknown_node", "unexpected_node", "handshake_timeout",
};

Bad bad_from(FrameError e) {
  switch (e) {
    case FrameError::undersized: return Bad::undersized;
    case FrameError::oversized: return Bad::oversized;
    case FrameError::bad_version: return Bad::bad_version;
    case FrameError::unknown_kind: return Bad::unknown_kind;
    case FrameError::short_body: return Bad::short_body;
    case FrameError::bad_body:
    case FrameError::none: break;
  }
  return Bad::bad_body;
}

std::string millis(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

std::string hex(std::uint64_t v) {
  char b[19];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct Counters {
  std::atomic<std::uint64_t> frames_sent{0}, bytes_sent{0}, frames_received{0}, bytes_received{0};
  std::atomic<std::uint64_t> write_batches{0}, direct_writes{0}, reads{0};
  std::atomic<std::uint64_t> connections_opened{0}, connections_accepted{0}, handshakes{0};
  std::atomic<std::uint64_t> connections_closed{0}, reconnects{0}, peer_restarts{0};
  std::atomic<std::uint64_t> keepalive_timeouts{0}, pings_sent{0};
  std::atomic<std::uint64_t> refused_full{0}, refused_unknown{0}, refused_too_large{0}, frames_dropped{0};
  std::array<std::atomic<std::uint64_t>, static_cast<int>(Bad::count_)> bad{};
};

// Counters order nothing: relaxed.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

struct Connection;

// A node in the address book. Shared by the map, its connection and the io
// thread's pending work; see the file comment for which thread touches what.
struct Peer {
  Peer(asio::io_context& io, std::string node, bool we_dial) : id(std::move(node)), dials(we_dial), redial(io) {}

  const std::string id;
  const bool dials;  // this node's id is the smaller: it dials, the peer accepts

  std::mutex mu;
  std::string host;                 // guarded by mu
  std::uint16_t port = 0;           // guarded by mu
  std::string pending;              // guarded by mu: encoded frames not yet handed to a write
  std::uint64_t pending_frames = 0; // guarded by mu
  std::size_t in_flight = 0;        // guarded by mu: bytes of the write in progress
  std::uint64_t incarnation = 0;    // guarded by mu: from the last HELLO
  bool ready = false;               // guarded by mu: an established connection drains `pending`
  bool flush_owed = false;          // guarded by mu: the io thread will look at `pending` again
  bool removed = false;             // guarded by mu
  // Guarded by mu: the next send() may write to direct_fd itself (see the
  // file comment). Implies ready, an empty `pending` and no write in
  // progress.
  bool direct = false;
  int direct_fd = -1;               // guarded by mu: the established connection's socket, or -1
  std::size_t partial_rest = 0;     // guarded by mu: bytes at the head of `pending` ending a frame begun directly

  // io thread only.
  std::shared_ptr<Connection> conn;  // being dialled, handshaking or established
  asio::steady_timer redial;
  std::uint64_t redial_gen = 0;
  bool redial_armed = false;
  int failures = 0;                  // attempts failed since the last handshake
  bool failure_logged = false;
};

// One TCP connection. io thread only.
struct Connection {
  enum class State { connecting, handshaking, established, closed };

  Connection(Socket s, bool in, std::size_t max_frame)
      : socket(std::move(s)), timer(socket.get_executor()), decoder(max_frame, kReadBuffer), inbound(in) {}

  Socket socket;
  asio::steady_timer timer;  // connect timeout, then handshake deadline, then keepalive ticks
  std::uint64_t timer_gen = 0;
  std::unique_ptr<asio::ip::tcp::resolver> resolver;
  FrameDecoder decoder;
  const bool inbound;
  State state = State::connecting;
  std::string remote;            // host:port, for logs
  std::shared_ptr<Peer> peer;    // dialled: from the start; accepted: from its HELLO
  std::string control;           // HELLO, PING and PONG frames waiting for the next write
  std::string control_writing;
  std::string data_writing;      // the batch being written, swapped with Peer::pending
  std::uint64_t data_writing_frames = 0;
  bool writing = false;
  bool got_input = false;        // something arrived since the last keepalive tick
  std::chrono::steady_clock::time_point last_input;
};

}  // namespace

class Transport::Impl {
 public:
  Impl(TransportSettings settings, Handler handler, PeerHandler peer_handler)
      : s_(std::move(settings)),
        handler_(std::move(handler)),
        peer_handler_(std::move(peer_handler)),
        work_(asio::make_work_guard(io_)),
        acceptor_(io_),
        accept_retry_(io_) {
    std::random_device rd;
    std::seed_seq seed{rd(), rd(), rd(), rd()};
    rng_.seed(seed);
    while (incarnation_ == 0) incarnation_ = (std::uint64_t{rd()} << 32) ^ rd() ^ rng_();
  }

  ~Impl() { stop(); }

  bool on_io_thread() const noexcept { return std::this_thread::get_id() == io_id_.load(); }
  Result<void> listen();
  void start_thread();
  void stop();

  void set_peer(std::string node, std::string host, std::uint16_t port);
  void remove_peer(std::string_view node);
  Result<void> send(std::string_view to, std::uint32_t type, std::string_view payload);
  Result<void> send_encoded(std::string_view to, std::string_view frames);
  bool connected(std::string_view node) const;
  std::vector<PeerStatus> peers() const;
  TransportStats stats() const;

  const TransportSettings& settings() const noexcept { return s_; }
  std::uint16_t port() const noexcept { return port_; }
  std::uint64_t incarnation() const noexcept { return incarnation_; }

 private:
  using ConnPtr = std::shared_ptr<Connection>;
  using PeerPtr = std::shared_ptr<Peer>;
  PeerPtr add_unaddressed(std::string node);

  void log(std::string_view line) noexcept;
  template <class Fn>
  void guarded(std::string_view what, Fn&& fn) noexcept;

  Result<void> enqueue(std::string_view to, std::size_t bytes, std::uint64_t frames,
                       const std::function<void(std::string&)>& append);
  bool queued(Peer& p, std::uint64_t frames) noexcept;
  bool write_direct(Peer& p, std::uint64_t frames) noexcept;

  // io thread
  void accept();
  void dial(const PeerPtr& p);
  void on_connected(const ConnPtr& c, const std::error_code& ec);
  void begin(const ConnPtr& c);
  void arm(const ConnPtr& c, Duration after, void (Impl::*fire)(const ConnPtr&));
  void on_connect_timeout(const ConnPtr& c);
  void on_handshake_timeout(const ConnPtr& c);
  void on_keepalive(const ConnPtr& c);
  void start_read(const ConnPtr& c);
  void on_read(const ConnPtr& c, const std::error_code& ec, std::size_t n);
  bool deliver(const ConnPtr& c);
  bool on_hello(const ConnPtr& c, const Frame& f);
  void establish(const ConnPtr& c, std::uint64_t incarnation);
  void flush(const PeerPtr& p);
  void allow_direct(const ConnPtr& c);
  void start_write(const ConnPtr& c);
  void on_written(const ConnPtr& c, const std::error_code& ec, std::size_t n);
  // By value: callers pass p->conn, which this resets.
  void close(ConnPtr c, std::string_view reason, std::optional<Bad> bad = std::nullopt);
  void schedule_redial(const PeerPtr& p);
  void on_address(const PeerPtr& p);
  void forget(const PeerPtr& p);
  void cleanup();
  static std::string describe(const Connection& c);
  PeerPtr find(std::string_view node) const;

  TransportSettings s_;
  Handler handler_;
  PeerHandler peer_handler_;
  std::uint64_t incarnation_ = 0;
  std::uint16_t port_ = 0;

  // Declared before every object that uses it, so it is destroyed last.
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  std::thread thread_;
  std::atomic<std::thread::id> io_id_{};
  std::atomic<bool> stopped_{false};
  std::mutex stop_mu_;

  mutable std::shared_mutex peers_mu_;
  std::unordered_map<std::string, PeerPtr, StringHash, std::equal_to<>> peers_;

  std::unordered_set<ConnPtr> live_;  // io thread: connections not yet closed
  std::mt19937_64 rng_;                   // io thread: back-off jitter
  Counters c_;
};

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
  asio::post(io_, [this] { accept(); });
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
  for (const ConnPtr& c : live_) {
    if (c->peer) {
      // A sender may be writing to this socket itself; it holds mu while it does.
      std::lock_guard pl(c->peer->mu);
      c->peer->direct = false;
      c->peer->direct_fd = -1;
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

template <class Fn>
void Transport::Impl::guarded(std::string_view what, Fn&& fn) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    log(std::string(what) + " threw: " + e.what());
  } catch (...) {
    log(std::string(what) + " threw a non-standard exception");
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

// --- address book ----------------------------------------------------------------

void Transport::Impl::set_peer(std::string node, std::string host, std::uint16_t port) {
  if (stopped_.load()) return;
  if (auto valid = validate_node_id(node); !valid.ok()) {
    log("set_peer ignored: " + valid.error().message());
    return;
  }
  if (node == s_.node_id) {
    log("set_peer ignored: '" + node + "' is this node");
    return;
  }
  PeerPtr p;
  bool changed = false;
  {
    std::unique_lock lk(peers_mu_);
    auto it = peers_.find(node);
    if (it == peers_.end()) {
      const bool dials = s_.node_id < node;
      p = std::make_shared<Peer>(io_, node, dials);
      p->host = std::move(host);
      p->port = port;
      peers_.emplace(std::move(node), p);
      changed = true;
    } else {
      p = it->second;
      std::lock_guard pl(p->mu);
      if (p->host != host || p->port != port) {
        p->host = std::move(host);
        p->port = port;
        changed = true;
      }
    }
  }
  if (changed && p->dials) asio::post(io_, [this, p] { on_address(p); });
}

// A node that dialled us before anyone gave its address: a peer we answer
// but never dial (its id is the smaller one: it dials us).
Transport::Impl::PeerPtr Transport::Impl::add_unaddressed(std::string node) {
  std::unique_lock lk(peers_mu_);
  auto it = peers_.find(node);
  if (it != peers_.end()) return it->second;
  auto p = std::make_shared<Peer>(io_, node, false);
  peers_.emplace(std::move(node), p);
  return p;
}

// A new peer, or a new address: dial now unless a connection is already
// being made or up (a moved node drops its old connection, which redials).
void Transport::Impl::on_address(const PeerPtr& p) {
  if (stopped_.load() || p->conn) return;
  ++p->redial_gen;
  if (p->redial_armed) {
    p->redial_armed = false;
    p->redial.cancel();
  }
  dial(p);
}

void Transport::Impl::remove_peer(std::string_view node) {
  PeerPtr p;
  {
    std::unique_lock lk(peers_mu_);
    auto it = peers_.find(node);
    if (it == peers_.end()) return;
    p = it->second;
    peers_.erase(it);
  }
  std::uint64_t dropped = 0;
  {
    std::lock_guard pl(p->mu);
    p->removed = true;
    p->ready = false;
    p->direct = false;
    p->partial_rest = 0;
    dropped = p->pending_frames;
    p->pending_frames = 0;
    std::string().swap(p->pending);
  }
  bump(c_.frames_dropped, dropped);
  asio::post(io_, [this, p] { forget(p); });
}

void Transport::Impl::forget(const PeerPtr& p) {
  ++p->redial_gen;
  p->redial_armed = false;
  p->redial.cancel();
  if (p->conn) close(p->conn, "node removed from the address book");
}

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
      post = queued(p, frames);
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

// With p.mu held, after `frames` frames were appended to p.pending: writes
// them at once if the connection allows a direct write, else leaves them for
// the io thread. True when the io thread must be woken to flush.
bool Transport::Impl::queued(Peer& p, std::uint64_t frames) noexcept {
  p.pending_frames += frames;
  if (p.direct) return write_direct(p, frames);
  const bool post = p.ready && !p.flush_owed;
  if (post) p.flush_owed = true;
  return post;
}

// With p.mu held and p.direct set: p.pending holds exactly the `frames` just
// appended (direct implies it was empty). Writes what the socket takes now,
// without blocking; whatever it does not take (a full socket buffer, or an
// error the io thread's write will meet and close the connection for) stays
// at the head of `pending` for the io thread. True when it must be woken.
bool Transport::Impl::write_direct(Peer& p, std::uint64_t frames) noexcept {
  // One direct write per arrival: the next send() queues, so a stream of
  // sends is batched by the io thread.
  p.direct = false;
  const ssize_t n = ::send(p.direct_fd, p.pending.data(), p.pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(p.pending.size())) {
    bump(c_.write_batches);
    bump(c_.direct_writes);
    bump(c_.bytes_sent, p.pending.size());
    bump(c_.frames_sent, frames);
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
    bump(c_.bytes_sent, written);
    bump(c_.frames_sent, whole);
    p.pending_frames -= whole;
    p.pending.erase(0, written);
  }
  p.flush_owed = true;
  return true;
}

Result<void> Transport::Impl::send(std::string_view to, std::uint32_t type, std::string_view payload) {
  if (stopped_.load(std::memory_order_relaxed))
    return Error(ErrorCode::shutting_down, "transport of node '" + s_.node_id + "' is stopped");
  const std::size_t bytes = data_frame_size(payload.size());
  if (bytes - frame_length_bytes > s_.max_frame_bytes) {
    bump(c_.refused_too_large);
    return Error(ErrorCode::invalid_argument, "a " + std::to_string(payload.size()) +
                                                  "-byte payload exceeds max_frame_bytes " +
                                                  std::to_string(s_.max_frame_bytes) + " with its 6-byte header");
  }
  // The common case inline: a std::function per frame (enqueue) would cost
  // an indirect call. Refusals take the slow path, which builds the error.
  {
    std::shared_lock lk(peers_mu_);
    auto it = peers_.find(to);
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
          post = queued(p, 1);
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

Result<void> Transport::Impl::send_encoded(std::string_view to, std::string_view frames) {
  if (stopped_.load(std::memory_order_relaxed))
    return Error(ErrorCode::shutting_down, "transport of node '" + s_.node_id + "' is stopped");
  std::size_t count = 0;
  std::string why;
  if (!tcp::count_data_frames(frames, s_.max_frame_bytes, count, why)) {
    bump(c_.refused_too_large);
    return Error(ErrorCode::invalid_argument, "send_encoded: " + why);
  }
  if (count == 0) return {};
  return enqueue(to, frames.size(), count, [&](std::string& out) { out.append(frames.data(), frames.size()); });
}

bool Transport::Impl::connected(std::string_view node) const {
  PeerPtr p = find(node);
  if (!p) return false;
  std::lock_guard pl(p->mu);
  return p->ready;
}

std::vector<PeerStatus> Transport::Impl::peers() const {
  std::vector<PeerStatus> out;
  std::shared_lock lk(peers_mu_);
  out.reserve(peers_.size());
  for (const auto& [id, p] : peers_) {
    std::lock_guard pl(p->mu);
    out.push_back(PeerStatus{.node_id = id,
                             .host = p->host,
                             .port = p->port,
                             .dials = p->dials,
                             .connected = p->ready,
                             .incarnation = p->incarnation,
                             .outbound_bytes = p->pending.size() + p->in_flight});
  }
  return out;
}

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
  return s;
}

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
    c->remote = remote.address().to_string() + ":" + std::to_string(remote.port());
    live_.insert(c);
    begin(c);
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

// A TCP connection is up. The dialer says HELLO at once; the acceptor
// answers only a HELLO it accepts, so a dialer that gets the answer knows
// it was accepted.
void Transport::Impl::begin(const ConnPtr& c) {
  std::error_code ignored;
  // Batching is ours; Nagle would only delay the first frame of a batch.
  c->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  c->state = Connection::State::handshaking;
  arm(c, s_.handshake_timeout, &Impl::on_handshake_timeout);
  if (!c->inbound) {
    tcp::append_hello(c->control, incarnation_, s_.node_id);
    start_write(c);
  }
  start_read(c);
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
  if (c->state == Connection::State::handshaking)
    close(c, "no HELLO within " + millis(s_.handshake_timeout), Bad::handshake_timeout);
}

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

void Transport::Impl::start_read(const ConnPtr& c) {
  std::span<char> room = c->decoder.prepare(kReadMinFree);
  c->socket.async_read_some(asio::buffer(room.data(), room.size()),
                            [this, c](const std::error_code& ec, std::size_t n) { on_read(c, ec, n); });
}

void Transport::Impl::on_read(const ConnPtr& c, const std::error_code& ec, std::size_t n) {
  if (c->state == Connection::State::closed || stopped_.load()) return;
  if (ec) {
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
  c->decoder.commit(n);
  c->got_input = true;
  // Before the handler runs: what it delivers may be answered at once, from
  // this thread or another.
  allow_direct(c);
  if (deliver(c)) start_read(c);
}

// Input arrived: if nothing of ours is on its way out, the next send() may
// write to the socket itself (see the file comment).
void Transport::Impl::allow_direct(const ConnPtr& c) {
  if (c->state != Connection::State::established || c->writing || !c->control.empty()) return;
  Peer& p = *c->peer;
  std::lock_guard pl(p.mu);
  if (p.pending.empty() && p.direct_fd >= 0) p.direct = true;
}

// Decodes and handles every complete frame read so far. False when the
// connection was closed or the transport stopped meanwhile.
bool Transport::Impl::deliver(const ConnPtr& c) {
  Frame f;
  std::uint64_t delivered = 0;
  bool pong = false;
  bool open = true;
  while (open) {
    const FrameDecoder::Status st = c->decoder.next(f);
    if (st == FrameDecoder::Status::need_more) break;
    if (st == FrameDecoder::Status::error) {
      close(c, c->decoder.error_message(), bad_from(c->decoder.error()));
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

bool Transport::Impl::on_hello(const ConnPtr& c, const Frame& f) {
  if (auto valid = validate_node_id(f.node_id); !valid.ok()) {
    close(c, "HELLO carries an invalid node id: " + valid.error().message(), Bad::invalid_node_id);
    return false;
  }
  if (f.node_id == s_.node_id) {
    close(c, "HELLO claims this node's own id '" + s_.node_id + "'", Bad::own_node_id);
    return false;
  }
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

void Transport::Impl::close(ConnPtr c, std::string_view reason, std::optional<Bad> bad) {
  if (c->state == Connection::State::closed) return;
  const auto was = c->state;
  c->state = Connection::State::closed;
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
      line += kBadNames[static_cast<int>(*bad)];
      line += "]";
    }
    log(line);
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

void Transport::Impl::schedule_redial(const PeerPtr& p) {
  if (p->redial_armed || p->conn) return;
  // reconnect_min doubled per failure since the last handshake, capped;
  // the first redial after a working connection waits reconnect_min.
  Duration base = s_.reconnect_min;
  for (int i = 1; i < p->failures && base < s_.reconnect_max; ++i) base *= 2;
  base = std::min(base, s_.reconnect_max);
  // Jitter: somewhere in [base/2, base], so nodes that lost each other at
  // the same moment do not redial in lockstep.
  const auto half = base.count() / 2;
  std::uniform_int_distribution<Duration::rep> jitter(0, half);
  const Duration delay(base.count() - jitter(rng_));
  const std::uint64_t gen = ++p->redial_gen;
  p->redial_armed = true;
  p->redial.expires_after(delay);
  p->redial.async_wait([this, p, gen](const std::error_code& ec) {
    if (ec || gen != p->redial_gen) return;
    p->redial_armed = false;
    if (stopped_.load()) return;
    bump(c_.reconnects);
    dial(p);
  });
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
  if (!settings.log) {
    settings.log = [prefix = "[" + settings.node_id + "] "](std::string_view line) {
      std::string out;
      out.reserve(prefix.size() + line.size() + 1);
      out.append(prefix).append(line).push_back('\n');
      std::fwrite(out.data(), 1, out.size(), stderr);
    };
  }
  auto impl = std::make_unique<Impl>(std::move(settings), std::move(handler), std::move(peer_handler));
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

Result<void> Transport::send(std::string_view to, std::uint32_t type, std::string_view payload) {
  return impl_->send(to, type, payload);
}
Result<void> Transport::send_encoded(std::string_view to, std::string_view frames) {
  return impl_->send_encoded(to, frames);
}

bool Transport::connected(std::string_view node) const { return impl_->connected(node); }
std::vector<PeerStatus> Transport::peers() const { return impl_->peers(); }
TransportStats Transport::stats() const { return impl_->stats(); }
void Transport::stop() { impl_->stop(); }

}  // namespace troupe::cluster
