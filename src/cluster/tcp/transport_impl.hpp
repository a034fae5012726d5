#pragma once
// What the files of the TCP transport share: the address book's Peer, the
// Connection, the counters, the reasons for closing on bad input, and the
// declaration of Transport::Impl, whose members are defined by
//   transport.cpp             the public facade, start-up, shutdown, stats
//   transport_peers.cpp       the address book and the redial back-off
//   transport_send.cpp        send() and the write side of a connection
//   transport_connection.cpp  accepting, dialling, the HELLO handshake, closing
//   transport_receive.cpp     reading, delivering frames, keepalive
//   transport_tls.cpp         the TLS channel and handshake, the name check,
//                             refusals, the handshake limits and certificate reload
//   tls.cpp                   TLS contexts and certificate names (tls.hpp)
// Private to src/cluster/tcp. See transport.hpp for the contract and
// doc/wire.md for the protocol.
//
// One io thread (an asio::io_context) runs every socket, timer and handler;
// send() only touches a peer's outbound buffer under that peer's mutex.
//
// Threads and locks:
//   - peers_mu_ (shared) guards the address book map. send() takes it shared;
//     set_peer/remove_peer take it exclusively. Order: peers_mu_, then a
//     Peer's mu.
//   - Peer::mu guards what send() and the io thread share: the outbound
//     buffer and its accounting, `ready`, `flush_owed`, `removed`, the
//     address and the incarnation, and the direct-write state (`direct`,
//     `direct_fd`, `direct_tls`, `partial_rest`). It is also held across a
//     sender's own write to the socket (transport_send.cpp), so the io thread
//     never closes or writes to that socket meanwhile.
//   - tls_mu_ guards tls_ctx_, the context new connections take (replaced
//     by reload_tls() from any thread).
//   - Everything else (connections, timers, Peer::conn, back-off state) is
//     touched only on the io thread, or after it has been joined.
//
// TLS: a connection's OpenSSL object is driven by hand over memory BIOs
// (TlsChannel): the io thread reads ciphertext from the socket and feeds it
// in, and every byte OpenSSL produces goes to one ordered ciphertext buffer
// (TlsChannel::out), written before anything newer. Until the connection is
// established only the io thread touches the channel; from then on (it is
// Peer::direct_tls) every use of it, the io thread's too, holds Peer::mu, so
// a sender may encrypt and write its frame itself as on a plain connection.

#define TROUPE_ASIO_SSL 1
#include "../asio_headers.hpp"  // first: see there

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "frame.hpp"
#include "troupe/cluster/transport.hpp"

namespace troupe::cluster::tcp {

using Socket = asio::ip::tcp::socket;
using Endpoint = asio::ip::tcp::endpoint;

// The decoder's buffer starts at kReadBuffer (see transport_receive.cpp).
constexpr std::size_t kReadBuffer = 128u << 10;

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

inline constexpr std::array<const char*, static_cast<int>(Bad::count_)> kBadNames = {
    "undersized",   "oversized",       "bad_version",  "unknown_kind",    "short_body",
    "bad_body",     "truncated",       "missing_hello", "second_hello",   "invalid_node_id",
    "own_node_id",  "wrong_direction", "unknown_node", "unexpected_node", "handshake_timeout",
};

inline Bad bad_from(FrameError e) {
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

inline std::string millis(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

inline std::string hex(std::uint64_t v) {
  char b[19];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct Peer;
// The address book: node id -> Peer, looked up by string_view.
using PeerMap = std::unordered_map<std::string, std::shared_ptr<Peer>, StringHash, std::equal_to<>>;

struct Counters {
  std::atomic<std::uint64_t> frames_sent{0}, bytes_sent{0}, frames_received{0}, bytes_received{0};
  std::atomic<std::uint64_t> write_batches{0}, direct_writes{0}, reads{0};
  std::atomic<std::uint64_t> connections_opened{0}, connections_accepted{0}, handshakes{0};
  std::atomic<std::uint64_t> connections_closed{0}, reconnects{0}, peer_restarts{0};
  std::atomic<std::uint64_t> keepalive_timeouts{0}, pings_sent{0};
  std::atomic<std::uint64_t> refused_full{0}, refused_unknown{0}, refused_too_large{0}, frames_dropped{0};
  std::array<std::atomic<std::uint64_t>, static_cast<int>(Bad::count_)> bad{};
  std::array<std::atomic<std::uint64_t>, 6> refused{};  // by Refused
  std::atomic<std::uint64_t> tls_reloads{0}, tls_reload_failures{0};
};

// Why a peer was refused before its HELLO was accepted: the index into
// Counters::refused, in the order of RefusedPeerCounts.
enum class Refused : int {
  tls_handshake,
  no_certificate,
  untrusted_certificate,
  name_mismatch,
  over_address_limit,
  over_total_limit,
};

// Counters order nothing: relaxed.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

struct Connection;

// A TLS connection's OpenSSL object over two memory BIOs, driven by hand
// (transport_tls.cpp). Owned by its Connection; see the top of this file
// for who may touch it when.
struct TlsChannel {
  TlsChannel(SSL_CTX* ctx, bool server);
  ~TlsChannel();
  TlsChannel(const TlsChannel&) = delete;
  TlsChannel& operator=(const TlsChannel&) = delete;

  // Encrypts `plain` into `out`. False when the connection's TLS failed.
  bool encrypt(std::string_view plain);
  // Moves what OpenSSL produced to the end of `out`.
  void drain();

  SSL* ssl = nullptr;
  BIO* rbio = nullptr;  // owned by ssl: ciphertext read, not yet consumed
  BIO* wbio = nullptr;  // owned by ssl: ciphertext produced, not yet in `out`
  bool done = false;    // the TLS handshake is complete
  std::string out;      // ciphertext produced and not yet handed to a write, in order
  std::vector<char> in; // io thread: what one read of the socket takes
};

// A node in the address book. Shared by the map, its connection and the io
// thread's pending work; see the top of this file for which thread touches what.
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
  // Guarded by mu: the next send() may write to direct_fd itself (see
  // transport_send.cpp). Implies ready, an empty `pending` and no write in
  // progress.
  bool direct = false;
  int direct_fd = -1;               // guarded by mu: the established connection's socket, or -1
  TlsChannel* direct_tls = nullptr; // guarded by mu: with TLS, the established connection's channel
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
  // With TLS: the context the channel was made with (kept alive here: a
  // reload replaces the transport's), and the channel.
  std::shared_ptr<asio::ssl::context> tls_ctx;
  std::unique_ptr<TlsChannel> tls;
  std::vector<std::string> cert_names;  // what the peer's certificate names, after the TLS handshake
  std::string remote_ip;              // accepted: the peer's address, the key of the handshake limits
  bool counted = false;               // accepted: counted in the handshake limits until its HELLO
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

}  // namespace troupe::cluster::tcp

namespace troupe::cluster {

// For the member definitions of Transport::Impl.
using tcp::bump;
using tcp::hex;
using tcp::millis;

// The transport itself; Transport forwards to it. Owned by its Transport;
// see the top of this file for which thread touches which member.
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
  Result<void> reload_tls();
  Result<void> init_tls();
  bool connected(std::string_view node) const;
  std::vector<PeerStatus> peers() const;
  TransportStats stats() const;

  const TransportSettings& settings() const noexcept { return s_; }
  std::uint16_t port() const noexcept { return port_; }
  std::uint64_t incarnation() const noexcept { return incarnation_; }

 private:
  using Bad = tcp::Bad;
  using Connection = tcp::Connection;
  using Endpoint = tcp::Endpoint;
  using Frame = tcp::Frame;
  using FrameDecoder = tcp::FrameDecoder;
  using FrameKind = tcp::FrameKind;
  using Peer = tcp::Peer;
  using Socket = tcp::Socket;
  using ConnPtr = std::shared_ptr<Connection>;
  using PeerPtr = std::shared_ptr<Peer>;
  PeerPtr add_unaddressed(std::string node);

  void log(std::string_view line) noexcept;
  template <class Fn>
  void guarded(std::string_view what, Fn&& fn) noexcept;

  Result<void> enqueue(std::string_view to, std::size_t bytes, std::uint64_t frames,
                       const std::function<void(std::string&)>& append);

  // io thread
  void accept();
  void dial(const PeerPtr& p);
  void on_connected(const ConnPtr& c, const std::error_code& ec);
  void begin(const ConnPtr& c);
  void arm(const ConnPtr& c, Duration after, void (Impl::*fire)(const ConnPtr&));
  void on_connect_timeout(const ConnPtr& c);
  void on_handshake_timeout(const ConnPtr& c);
  bool admit(const ConnPtr& c);
  void uncount(Connection& c);
  bool tls_handshake(const ConnPtr& c);
  bool tls_input(const ConnPtr& c, std::size_t n);
  void start_tls_write(const ConnPtr& c);
  void say_hello(const ConnPtr& c);
  bool names_match(const ConnPtr& c, std::string_view node);
  void refuse(const ConnPtr& c, tcp::Refused why, std::string_view reason);
  bool log_refusal(const Connection& c);
  void poll_tls_files();
  Result<void> reload_tls_files();
  void on_keepalive(const ConnPtr& c);
  void with_tls(const ConnPtr& c);
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
  void close(ConnPtr c, std::string_view reason, std::optional<Bad> bad = std::nullopt, bool quiet = false);
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
  tcp::PeerMap peers_;

  std::unordered_set<ConnPtr> live_;  // io thread: connections not yet closed

  mutable std::mutex tls_mu_;
  std::shared_ptr<asio::ssl::context> tls_ctx_;  // guarded by tls_mu_; null: plain TCP
  std::vector<long long> tls_times_;              // io thread (after start): the files as last loaded
  asio::steady_timer tls_poll_{io_};              // io thread
  // io thread: connections in handshake per remote address, and in all.
  std::unordered_map<std::string, std::size_t> handshaking_;
  std::size_t handshaking_total_ = 0;
  // io thread: when a refusal from an address was last logged.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> refusal_logged_;
  std::chrono::steady_clock::time_point refusal_swept_{};  // io thread: the last sweep of refusal_logged_
  std::mt19937_64 rng_;                   // io thread: back-off jitter
  tcp::Counters c_;
};

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

}  // namespace troupe::cluster
