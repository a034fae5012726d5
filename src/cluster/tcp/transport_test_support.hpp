#pragma once
// Shared by the transport tests: a node that records what reaches it, a log
// capture, and raw sockets (plain POSIX, so the tests share no code with the
// transport's Asio) that speak or break the wire protocol by hand.
//
// Every wait is bounded in real time and generous: the bound only turns a
// hang into a failure, it never decides an outcome.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "frame.hpp"
#include "troupe/cluster/transport.hpp"

namespace troupe::cluster::testing {

using namespace std::chrono_literals;

inline constexpr Duration kWait = std::chrono::seconds(30);

// Polls `done` until it holds or `timeout` passes.
template <class Pred>
bool eventually(Pred&& done, Duration timeout = kWait) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

struct Received {
  std::string from;
  std::uint32_t type = 0;
  std::string payload;
};

// What a node's handlers saw. Thread-safe.
class Inbox {
 public:
  void add(std::string_view from, std::uint32_t type, std::string_view payload) {
    std::lock_guard lk(mu_);
    frames_.push_back(Received{std::string(from), type, std::string(payload)});
  }
  void peer(std::string_view node, bool up) {
    std::lock_guard lk(mu_);
    events_.push_back(std::string(node) + (up ? " up" : " down"));
  }
  std::size_t count() const {
    std::lock_guard lk(mu_);
    return frames_.size();
  }
  std::vector<Received> frames() const {
    std::lock_guard lk(mu_);
    return frames_;
  }
  std::vector<std::string> events() const {
    std::lock_guard lk(mu_);
    return events_;
  }
  bool wait_count(std::size_t n, Duration timeout = kWait) const {
    return eventually([&] { return count() >= n; }, timeout);
  }
  // Waits for a frame carrying `payload`.
  bool wait_payload(std::string_view payload, Duration timeout = kWait) const {
    return eventually(
        [&] {
          std::lock_guard lk(mu_);
          for (const auto& f : frames_)
            if (f.payload == payload) return true;
          return false;
        },
        timeout);
  }

 private:
  mutable std::mutex mu_;
  std::vector<Received> frames_;
  std::vector<std::string> events_;
};

// Log lines of one transport. Thread-safe.
class LogCapture {
 public:
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view line) {
      std::lock_guard lk(mu_);
      lines_.emplace_back(line);
    };
  }
  bool contains(std::string_view text) const {
    std::lock_guard lk(mu_);
    for (const auto& l : lines_)
      if (l.find(text) != std::string::npos) return true;
    return false;
  }
  bool wait_for(std::string_view text, Duration timeout = kWait) const {
    return eventually([&] { return contains(text); }, timeout);
  }
  std::string all() const {
    std::lock_guard lk(mu_);
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Quick reconnects so tests do not wait on back-off.
inline TransportSettings test_settings(std::string id) {
  TransportSettings s;
  s.node_id = std::move(id);
  s.insecure = true;
  s.reconnect_min = std::chrono::milliseconds(10);
  s.reconnect_max = std::chrono::milliseconds(200);
  s.log = [](std::string_view) {};
  return s;
}

// A started transport recording into an Inbox and a LogCapture. The inbox
// and log outlive the transport (declared first), so its handlers never
// touch freed memory.
struct Node {
  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>();
  std::shared_ptr<LogCapture> log = std::make_shared<LogCapture>();
  std::unique_ptr<Transport> t;

  static Node start(TransportSettings s) {
    Node n;
    s.log = n.log->sink();
    auto r = Transport::start(
        std::move(s),
        [inbox = n.inbox](std::string_view from, std::uint32_t type, std::string_view payload) {
          inbox->add(from, type, payload);
        },
        [inbox = n.inbox](std::string_view node, bool up) { inbox->peer(node, up); });
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    if (r.ok()) n.t = std::move(r).value();
    return n;
  }
  static Node start(std::string id) { return start(test_settings(std::move(id))); }

  Transport* operator->() const { return t.get(); }
  std::uint16_t port() const { return t->port(); }
};

// Tells both nodes about each other, the accepting one (larger id) first,
// so that the dialer's first HELLO finds itself in the address book.
inline void introduce(const Node& x, const Node& y) {
  const Node& dialer = x->node_id() < y->node_id() ? x : y;
  const Node& acceptor = &dialer == &x ? y : x;
  acceptor->set_peer(dialer->node_id(), "127.0.0.1", dialer.port());
  dialer->set_peer(acceptor->node_id(), "127.0.0.1", acceptor.port());
}

inline bool both_connected(const Node& x, const Node& y, Duration timeout = kWait) {
  return eventually([&] { return x->connected(y->node_id()) && y->connected(x->node_id()); }, timeout);
}

// A port nothing listens on right now (bound, then released), for a peer
// that is started later.
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// --- raw frames, byte by byte -------------------------------------------------------

inline std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}
// A frame with any length field, version and kind, followed by `body`.
inline std::string raw_frame(std::uint32_t length, std::uint8_t version, std::uint8_t kind, std::string_view body) {
  std::string out = be32(length);
  out.push_back(static_cast<char>(version));
  out.push_back(static_cast<char>(kind));
  out.append(body);
  return out;
}
inline std::string hello(std::string_view id, std::uint64_t incarnation = 0x1122334455667788ull) {
  std::string out;
  tcp::append_hello(out, incarnation, id);
  return out;
}
inline std::string data(std::uint32_t type, std::string_view payload) {
  std::string out;
  append_data_frame(out, type, payload);
  return out;
}

// A decoded frame, its views copied.
struct RawFrame {
  tcp::FrameKind kind;
  std::string node_id;
  std::uint64_t incarnation = 0;
  std::uint32_t type = 0;
  std::string payload;
};

// One end of a TCP connection driven by hand, with plain blocking POSIX
// calls bounded by poll(). Not thread-safe.
class RawConn {
 public:
  explicit RawConn(int fd) : fd_(fd) {
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawConn() { ::close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  static std::unique_ptr<RawConn> connect(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    return std::make_unique<RawConn>(fd);
  }

  void write(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      ASSERT_GT(n, 0) << std::strerror(errno);
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  void shutdown_send() { ::shutdown(fd_, SHUT_WR); }

  // Reads until the other end closes (EOF or reset); true if it did in time.
  bool wait_closed(Duration timeout = kWait) {
    read_until([] { return false; }, timeout);
    return closed_;
  }
  // Reads until the bytes received decode to at least `n` frames.
  bool wait_frames(std::size_t n, Duration timeout = kWait) {
    read_until([&] { return frames().size() >= n; }, timeout);
    return frames().size() >= n;
  }
  bool closed() const { return closed_; }
  const std::string& received() const { return got_; }

  // The frames received so far, decoded.
  std::vector<RawFrame> frames() const {
    tcp::FrameDecoder d(16u << 20);
    d.feed(got_);
    std::vector<RawFrame> out;
    tcp::Frame f;
    while (d.next(f) == tcp::FrameDecoder::Status::frame)
      out.push_back(RawFrame{f.kind, std::string(f.node_id), f.incarnation, f.type, std::string(f.payload)});
    return out;
  }
  std::size_t count(tcp::FrameKind kind) const {
    std::size_t n = 0;
    for (const auto& f : frames()) n += f.kind == kind;
    return n;
  }

 private:
  template <class Pred>
  void read_until(Pred&& done, Duration timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!closed_ && !done()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 50)));
      if (r <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        got_.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        closed_ = true;  // EOF, or a reset
      }
    }
  }

  int fd_;
  std::string got_;
  bool closed_ = false;
};

// A listening socket driven by hand, for playing the accepting node.
class RawServer {
 public:
  RawServer() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~RawServer() { ::close(fd_); }
  RawServer(const RawServer&) = delete;
  RawServer& operator=(const RawServer&) = delete;

  std::uint16_t port() const { return port_; }

  // The next incoming connection, or null if none came in time.
  std::unique_ptr<RawConn> accept(Duration timeout = kWait) {
    pollfd p{fd_, POLLIN, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
    if (::poll(&p, 1, static_cast<int>(ms)) <= 0) return nullptr;
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return nullptr;
    return std::make_unique<RawConn>(fd);
  }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

// Sequence numbers as payloads: 8 bytes, host order.
inline std::string u64_bytes(std::uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}
inline std::uint64_t u64_of(std::string_view s) {
  std::uint64_t v = 0;
  std::memcpy(&v, s.data(), std::min<std::size_t>(8, s.size()));
  return v;
}

// Node "a" sends `rounds` numbered requests to "b" one at a time, each
// echoed by b's handler from its io thread. Each side has just received
// something when it sends, so each frame may be written by its sender
// itself. Whether every answer came back, in order; the stats at the end.
struct EchoedRounds {
  bool in_order = false;
  TransportStats a, b;
};
inline EchoedRounds echo_rounds(TransportSettings sa, TransportSettings sb, std::uint64_t rounds) {
  EchoedRounds out;
  Node b;
  Transport* bt = nullptr;
  b.t = Transport::start(std::move(sb), [&](std::string_view from, std::uint32_t type, std::string_view p) {
          (void)bt->send(from, type, p);  // from b's io thread
        }).value();
  bt = b.t.get();
  Node a = Node::start(std::move(sa));
  introduce(a, b);
  std::uint64_t i = 0;
  for (; i < rounds; ++i)
    if (!a->send("b", 1, u64_bytes(i)).ok() || !a.inbox->wait_count(static_cast<std::size_t>(i + 1))) break;
  const auto got = a.inbox->frames();
  out.in_order = i == rounds && got.size() == rounds;
  for (std::uint64_t k = 0; out.in_order && k < rounds; ++k) out.in_order = u64_of(got[k].payload) == k;
  out.a = a->stats();
  out.b = b->stats();
  return out;
}

// What stream_with_answers() saw.
struct StreamsWithAnswers {
  bool all_arrived = false;   // b received every frame
  std::uint64_t disorder = 0; // frames b received out of their thread's order, or not whole
  TransportStats a, b;        // at the end
};

// Node "a" sends to "b" from four threads at once: three stream numbered
// frames of their own type (1..3), `per_stream` each, and one sends
// `rounds` requests (type 0) one at a time, each answered by b's handler at
// once with the same payload, every hundredth with a 4 MiB tail (more than
// a socket takes at once, so some direct writes are cut short both ways). Frames written directly, in
// the io thread's batches, and the rest of a cut one must keep each
// thread's order; a's answers must come back in order too.
inline StreamsWithAnswers stream_with_answers(TransportSettings sa, TransportSettings sb, std::uint64_t per_stream,
                                              std::uint64_t rounds) {
  constexpr std::uint32_t kStreams = 3;
  const std::string big(4u << 20, 'x');
  std::atomic<std::uint64_t> disorder{0};
  std::atomic<std::uint64_t> total{0};
  std::uint64_t next[kStreams + 1] = {};  // b's io thread only
  StreamsWithAnswers out;
  Node b;
  Transport* bt = nullptr;
  b.t = Transport::start(std::move(sb), [&](std::string_view from, std::uint32_t type, std::string_view p) {
          const std::uint64_t seq = u64_of(p);
          if (type > kStreams || seq != next[type]) disorder.fetch_add(1);
          if (type <= kStreams) next[type] = seq + 1;
          if (type == 0 && seq % 100 == 0 && p.substr(8) != big) disorder.fetch_add(1);
          if (type == 0) (void)bt->send(from, 0, p);  // answered at once
          total.fetch_add(1);
        }).value();
  bt = b.t.get();
  Node a = Node::start(std::move(sa));
  introduce(a, b);
  std::vector<std::thread> senders;
  senders.emplace_back([&] {
    for (std::uint64_t i = 0; i < rounds; ++i) {
      std::string payload = u64_bytes(i);
      if (i % 100 == 0) payload += big;
      if (!a->send("b", 0, payload).ok()) return;
      if (!a.inbox->wait_count(static_cast<std::size_t>(i + 1))) return;
    }
  });
  for (std::uint32_t t = 1; t <= kStreams; ++t) {
    senders.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < per_stream; ++i) (void)a->send("b", t, u64_bytes(i));
    });
  }
  for (auto& s : senders) s.join();
  out.all_arrived = eventually([&] { return total.load() == rounds + kStreams * per_stream; });
  const auto answers = a.inbox->frames();
  if (answers.size() != rounds) disorder.fetch_add(1);
  for (std::uint64_t i = 0; i < answers.size(); ++i)
    if (u64_of(answers[i].payload) != i) disorder.fetch_add(1);
  out.disorder = disorder.load();
  out.a = a->stats();
  out.b = b->stats();
  return out;
}

}  // namespace troupe::cluster::testing
