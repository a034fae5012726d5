#pragma once
// The TCP transport between cluster nodes.
//
// Every pair of nodes shares one TCP connection. The node whose id is
// smaller (byte-wise) dials the other: at once when set_peer() introduces
// the peer, and again with exponential back-off after any loss; the other
// node only accepts. The first frame each way is a HELLO carrying the node
// id and a random 64-bit incarnation drawn when the Transport starts, so a
// restarted peer is recognised. After that, frames are DATA (a u32 message
// type plus payload bytes, handed to the Handler) and PING/PONG (keepalive).
// doc/wire.md gives the format byte by byte and every rule below.
//
//   auto t = troupe::cluster::Transport::start(
//       {.node_id = "node-a", .listen_port = 7100,
//        .tls = {.cert_file = "node-a.crt", .key_file = "node-a.key", .ca_file = "ca.crt"}},
//       [](std::string_view from, std::uint32_t type, std::string_view payload) { ... });
//   (*t)->set_peer("node-b", "10.0.0.2", 7100);
//   (*t)->send("node-b", kMyMessage, bytes);   // queued at once; written by the io thread
//
// What it guarantees:
//   - Frames from one node arrive in the order that node's send() calls
//     returned (from one thread: its call order). A frame is delivered at
//     most once. Frames handed to a connection that breaks may be lost; the
//     PeerHandler then reports the peer down, so the layer above fails what
//     waits for an answer. Frames queued while no connection is up wait,
//     bounded, and go out on the next connection.
//   - send() never blocks and never allocates per frame in the steady state:
//     it appends the encoded frame to the peer's outbound buffer under a
//     short lock and wakes the io thread only if no write is pending. The io
//     thread writes everything accumulated with one writev, so under load
//     one syscall carries many frames; reads decode many frames per recv.
//     One exception saves a round trip its two thread switches: when input
//     has just arrived on a connection with nothing queued and no write in
//     progress (a request to answer, an answer to follow up), the next
//     send() writes its frame to the socket itself, without waiting (a
//     non-blocking write; what the socket does not take goes to the io
//     thread). Only one frame per arrival goes that way, so a stream of
//     sends is still batched (stats(): direct_writes).
//   - Back-pressure is explicit: a peer's outbound bytes (queued plus being
//     written) never exceed max_outbound_bytes; past it send() answers
//     buffer_overflow and queues nothing.
//   - Bad input (garbage, an oversized length, an unknown version or kind, a
//     body too short for its kind, a truncated frame, a missing or wrong
//     HELLO, a late HELLO) closes only that connection, with a logged reason
//     and a counter in stats(); the node keeps serving the others (SPEC X1).
//   - A connection on which nothing arrives for keepalive_timeout is closed
//     (and redialled if this node dials), so a silently dead peer is noticed;
//     PINGs keep an idle but healthy connection alive.
//   - With TLS (settings.tls), every connection is TLS 1.3 with mutual
//     authentication: a peer is accepted only if its certificate chains to
//     settings.tls.ca_file and names (a DNS SAN, or the CN when it has no
//     DNS SAN) the node id of its HELLO; the dialler also checks that the
//     node it reached is the one it meant to dial. Nothing from a peer is
//     delivered before both checks pass. A refused peer is counted
//     (TransportStats::refused_peers) and logged at most once per remote
//     address per minute. There is no default: start() refuses settings
//     with neither TLS files nor `insecure = true` (plain TCP, for one
//     machine or a network that is private by other means).
//   - A stranger cannot hold the port: connections still in their
//     handshake (TCP accepted, HELLO not yet accepted) are bounded per
//     remote address and in total; past either bound a new connection is
//     closed at once (counted); handshake_timeout covers the TLS handshake
//     and the HELLO together.
//
// Ownership: start() returns the only owner. The Transport owns its sockets
// and its one io thread, which runs every handler. Thread safety: every
// member function may be called from any thread, including from inside a
// handler (stop() from a handler stops delivery at once; the destructor must
// then run on another thread). The Transport must outlive every concurrent
// call to it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"

namespace troupe::cluster {

// --- wire format (doc/wire.md) ---------------------------------------------------

inline constexpr std::uint8_t wire_version = 1;
// A frame: u32 big-endian length of what follows, u8 version, u8 kind, body.
inline constexpr std::size_t frame_length_bytes = 4;
inline constexpr std::size_t frame_header_bytes = 6;  // length + version + kind
// A DATA frame adds a u32 message type before its payload.
inline constexpr std::size_t data_frame_overhead = 10;

// The encoded size of a DATA frame carrying `payload_bytes`.
constexpr std::size_t data_frame_size(std::size_t payload_bytes) noexcept {
  return data_frame_overhead + payload_bytes;
}

// Appends one DATA frame (type, payload) to `out`, exactly as send() queues
// it. For a layer that builds its own batches (the same bytes broadcast to
// several peers, several messages for one peer) and hands them to
// send_encoded(). The payload must fit a u32 length; send_encoded() checks
// the configured max_frame_bytes.
void append_data_frame(std::string& out, std::uint32_t type, std::string_view payload);

// --- settings and counters -------------------------------------------------------
// Plain values: copy them freely; no thread safety of their own.

// TLS for every connection (doc/wire.md, "TLS"): paths of PEM files, read by
// start() and again by Transport::reload_tls().
struct TransportTls {
  std::string cert_file;  // this node's certificate chain, its own first; names its node id
  std::string key_file;   // the private key of that certificate
  std::string ca_file;    // the CA certificate(s) a peer's certificate must chain to
  bool configured() const noexcept { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// How a Transport listens, dials and bounds its buffers; read once by start().
struct TransportSettings {
  std::string node_id;                         // this node; checked by validate_node_id
  std::string listen_host = "127.0.0.1";      // an address or a name; "0.0.0.0" for every interface
  std::uint16_t listen_port = 0;               // 0: any free port; Transport::port() tells which
  // Bound on a frame's length field (version, kind and body): a DATA payload
  // may hold max_frame_bytes - 6 bytes. Larger frames are refused by send()
  // with invalid_argument and, when they arrive, close the connection.
  std::size_t max_frame_bytes = 16u << 20;
  // Per peer: bytes queued and being written. Past it send() answers
  // buffer_overflow and queues nothing.
  std::size_t max_outbound_bytes = 64u << 20;
  Duration connect_timeout = std::chrono::seconds(2);
  Duration handshake_timeout = std::chrono::seconds(2);   // from TCP connect to the peer's HELLO
  Duration reconnect_min = std::chrono::milliseconds(50);  // back-off: doubles per failed attempt,
  Duration reconnect_max = std::chrono::seconds(2);        // capped, each delay jittered down by up to half
  // A connection that received nothing for keepalive_interval sends a PING
  // (answered by a PONG); one that received nothing for keepalive_timeout
  // is closed.
  Duration keepalive_interval = std::chrono::seconds(1);
  Duration keepalive_timeout = std::chrono::seconds(5);
  // Accept a HELLO from a node not in the address book (it becomes a peer
  // that can be answered while its connection is up, but is never dialled).
  // Membership reaches nodes at different times, and clients (a test
  // driver, a command-line tool) need not be members; false refuses them
  // (unknown_node).
  bool accept_unknown_nodes = true;
  // Exactly one of the two: TLS with these files, or plain TCP when
  // insecure is true. Neither, or both: start() answers invalid_argument.
  TransportTls tls;
  bool insecure = false;
  // With TLS: the files' modification times are checked this often, and a
  // change reloads them as reload_tls() does. Zero: never.
  Duration tls_poll_interval = std::chrono::seconds(5);
  // Accepted connections still in their handshake: at most this many from
  // one remote address, and this many in all. Past either, a new connection
  // is closed at once (refused_peers.over_address_limit / over_total_limit).
  std::size_t max_handshakes_per_address = 16;
  std::size_t max_handshakes = 256;
  // Where the transport's log lines go (connections made and lost, bad
  // input, peer restarts), one line per call. Called on the io thread, and
  // on the calling thread by a set_peer() it refuses: must be thread-safe.
  // Default: the log facade (info, component cluster, troupe/core/log.hpp),
  // with the node id as field `transport`.
  std::function<void(std::string_view)> log;
};

// Connections closed because of what the peer sent, by reason (SPEC X1).
// doc/wire.md lists what each one means.
struct BadInputCounts {
  std::uint64_t undersized = 0;         // length field below 2 (no room for version and kind)
  std::uint64_t oversized = 0;          // length field above max_frame_bytes
  std::uint64_t bad_version = 0;        // version byte other than wire_version
  std::uint64_t unknown_kind = 0;       // kind byte not HELLO, DATA, PING or PONG
  std::uint64_t short_body = 0;         // body shorter than its kind's fixed part (DATA type, HELLO fields)
  std::uint64_t bad_body = 0;           // body that contradicts its kind (HELLO id length, PING with bytes)
  std::uint64_t truncated = 0;          // the stream ended inside a frame
  std::uint64_t missing_hello = 0;      // first frame not a HELLO
  std::uint64_t second_hello = 0;       // a HELLO after the handshake
  std::uint64_t invalid_node_id = 0;    // HELLO id fails validate_node_id
  std::uint64_t own_node_id = 0;        // HELLO claims this node's id
  std::uint64_t wrong_direction = 0;    // HELLO from a node that should accept our dial, not dial us
  std::uint64_t unknown_node = 0;       // HELLO from a node not given by set_peer
  std::uint64_t unexpected_node = 0;    // the node we dialled answered with another id
  std::uint64_t handshake_timeout = 0;  // no HELLO within handshake_timeout

  std::uint64_t total() const noexcept {
    return undersized + oversized + bad_version + unknown_kind + short_body + bad_body + truncated +
           missing_hello + second_hello + invalid_node_id + own_node_id + wrong_direction + unknown_node +
           unexpected_node + handshake_timeout;
  }
};

// The settings above that face strangers, as the layers that own a
// Transport (Remoting, Cluster) take them from their users: TLS or plain
// TCP, and the limits on what a connection may hold before and after its
// handshake. apply() copies them into TransportSettings.
struct TransportSecurity {
  TransportTls tls;
  bool insecure = false;
  std::size_t max_handshakes_per_address = 16;
  std::size_t max_handshakes = 256;
  Duration handshake_timeout = std::chrono::seconds(2);
  Duration idle_timeout = std::chrono::seconds(5);  // TransportSettings::keepalive_timeout

  void apply(TransportSettings& s) const {
    s.tls = tls;
    s.insecure = insecure;
    s.max_handshakes_per_address = max_handshakes_per_address;
    s.max_handshakes = max_handshakes;
    s.handshake_timeout = handshake_timeout;
    s.keepalive_timeout = idle_timeout;
  }
};

// Peers refused before their HELLO was accepted, by reason (doc/wire.md).
struct RefusedPeerCounts {
  std::uint64_t tls_handshake = 0;          // the TLS handshake failed (not TLS, no shared version or cipher...)
  std::uint64_t no_certificate = 0;         // the peer sent no certificate
  std::uint64_t untrusted_certificate = 0;  // its certificate does not chain to the CA (or has expired)
  std::uint64_t name_mismatch = 0;          // its certificate does not name the node id it claims or was dialled as
  std::uint64_t over_address_limit = 0;     // max_handshakes_per_address connections from its address in handshake
  std::uint64_t over_total_limit = 0;       // max_handshakes connections in handshake

  std::uint64_t total() const noexcept {
    return tls_handshake + no_certificate + untrusted_certificate + name_mismatch + over_address_limit +
           over_total_limit;
  }
};

// A snapshot of the transport's counters, all since start().
struct TransportStats {
  std::uint64_t frames_sent = 0;       // DATA frames written to a socket
  std::uint64_t bytes_sent = 0;        // bytes written, every kind and header included (TLS: ciphertext)
  std::uint64_t frames_received = 0;   // DATA frames handed to the Handler
  std::uint64_t bytes_received = 0;    // bytes read (TLS: ciphertext)
  std::uint64_t write_batches = 0;     // writes completed: one writev each unless the socket was full
  std::uint64_t direct_writes = 0;     // of those, frames written whole by the sending thread itself
  std::uint64_t reads = 0;             // reads completed: one recv each
  std::uint64_t connections_opened = 0;    // outgoing TCP connections made
  std::uint64_t connections_accepted = 0;  // incoming TCP connections accepted
  std::uint64_t handshakes = 0;            // connections that exchanged valid HELLOs
  std::uint64_t connections_closed = 0;    // every close, whatever the reason
  std::uint64_t reconnects = 0;            // dial attempts after a failed attempt or a lost connection
  std::uint64_t peer_restarts = 0;         // HELLOs carrying a new incarnation of a node seen before
  std::uint64_t keepalive_timeouts = 0;    // connections closed because nothing arrived
  std::uint64_t pings_sent = 0;
  std::uint64_t refused_full = 0;          // send() answered buffer_overflow
  std::uint64_t refused_unknown = 0;       // send() answered unreachable
  std::uint64_t refused_too_large = 0;     // send() answered invalid_argument for the frame size
  // DATA frames given up: queued for a removed peer, or in a write that
  // failed when its connection broke (they may or may not have arrived).
  std::uint64_t frames_dropped = 0;
  BadInputCounts closed_for_bad_input;
  RefusedPeerCounts refused_peers;
  std::uint64_t tls_reloads = 0;          // certificate reloads that took effect
  std::uint64_t tls_reload_failures = 0;  // reloads refused (unreadable or inconsistent files)
};

// One entry of the address book, as peers() reports it.
struct PeerStatus {
  std::string node_id;
  std::string host;
  std::uint16_t port = 0;
  bool dials = false;              // this node dials it (our id is the smaller)
  bool connected = false;          // a connection is up and past its handshake
  std::uint64_t incarnation = 0;   // from its last HELLO; 0 before the first
  std::size_t outbound_bytes = 0;  // queued and being written
};

// --- the transport ---------------------------------------------------------------

// Frames to and from the other nodes of a cluster over TCP (see the top of
// this file for the guarantees). Ownership: owned by the caller of start();
// owns its io thread, sockets and buffers. Thread safety: every member is
// safe to call from any thread; handlers run on the io thread only.
class Transport {
 public:
  // Called on the io thread for every DATA frame, in order per sending node.
  // The views are valid only during the call. Must not block: it delays
  // every connection. An exception it throws is logged and the frame counts
  // as delivered.
  using Handler = std::function<void(std::string_view from_node, std::uint32_t type, std::string_view payload)>;
  // Called on the io thread when a peer's connection comes up (after the
  // handshake) and when it goes down (closed, lost, replaced by a newer
  // connection, or removed). Every `true` is followed by one `false` unless
  // stop() comes first.
  using PeerHandler = std::function<void(std::string_view node, bool connected)>;

  // Listens on settings.listen_host:listen_port and starts the io thread.
  // Errors: invalid_argument for an invalid node id, unusable sizes or
  // durations, or an address that cannot be listened on.
  static Result<std::unique_ptr<Transport>> start(TransportSettings settings, Handler handler,
                                                  PeerHandler peer_handler = {});

  ~Transport();  // stop()
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  std::uint16_t port() const noexcept;
  const std::string& node_id() const noexcept;
  std::uint64_t incarnation() const noexcept;

  // Adds or updates a peer in the address book (from membership). If this
  // node dials it and no connection is up, dials now. An invalid id or this
  // node's own id is logged and ignored.
  void set_peer(std::string node_id, std::string host, std::uint16_t port);
  // Forgets a peer: closes its connection, drops what is queued for it, and
  // refuses its connections until set_peer() names it again.
  void remove_peer(std::string_view node_id);

  // Queues one DATA frame for `to`, or writes it at once (see the top of
  // this file). Never blocks. Errors: unreachable if `to`
  // was never given by set_peer (or was removed); invalid_argument if the
  // frame exceeds max_frame_bytes; buffer_overflow if it would take the
  // peer's outbound bytes past max_outbound_bytes (nothing is queued);
  // shutting_down after stop().
  Result<void> send(std::string_view to, std::uint32_t type, std::string_view payload);
  // Queues DATA frames already encoded with append_data_frame(), as one
  // unit: all of them or none. invalid_argument if `frames` is not a whole
  // number of DATA frames within max_frame_bytes; otherwise as send().
  Result<void> send_encoded(std::string_view to, std::string_view frames);

  // Reads the TLS files again (the paths of settings.tls): connections made
  // from now on use the new certificate, key and CA; established ones stay
  // up. Errors: invalid_argument when the transport has no TLS, or when the
  // files cannot be read or do not fit together (the old ones stay in use).
  Result<void> reload_tls();

  // Whether a connection to `node` is up and past its handshake.
  bool connected(std::string_view node) const;
  std::vector<PeerStatus> peers() const;
  TransportStats stats() const;

  // Closes every connection and the listener and joins the io thread.
  // Idempotent. No handler runs after it returns (when called from a
  // handler: after that handler returns). Frames still queued are dropped.
  void stop();

 private:
  class Impl;
  explicit Transport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::cluster
