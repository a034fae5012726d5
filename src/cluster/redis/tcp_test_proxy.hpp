#pragma once
// A TCP proxy for tests that cuts one node off from Redis while the others
// keep it: the node connects to the proxy, which forwards to the real port.
// cut() is a network partition: forwarding stops, connections stay open and
// silent (the client notices only through its own timeouts), and new
// connections are accepted but never answered. heal() drops the silent
// connections (so clients reconnect) and forwards again. stall_all_but(i)
// stalls every connection but the i-th accepted (counting from 0), the way
// a peer busy on other connections stalls them; heal() ends that too.
//
// Ownership: owns its listening socket, the connections and one thread.
// Thread safety: cut(), stall_all_but(), heal() and port() may be called
// from any thread.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

class TcpTestProxy {
 public:
  explicit TcpTestProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("tcp test proxy: cannot listen");
    port_ = ntohs(a.sin_port);
    if (::pipe2(wake_, O_CLOEXEC) != 0) throw std::runtime_error("tcp test proxy: pipe failed");
    thread_ = std::thread([this] { run(); });
  }
  ~TcpTestProxy() {
    stop_ = true;
    poke();
    thread_.join();
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  TcpTestProxy(const TcpTestProxy&) = delete;
  TcpTestProxy& operator=(const TcpTestProxy&) = delete;

  int port() const { return port_; }
  void cut() {
    cut_ = true;
    poke();
  }
  void stall_all_but(long index) {
    keep_ = index;
    poke();
  }
  void heal() {
    cut_ = false;
    keep_ = -1;
    poke();
  }

 private:
  struct Pair {
    int client = -1;
    int server = -1;  // -1: accepted during a cut, never forwarded
    long index = 0;   // in accept order
  };

  void poke() {
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
  }

  static void close_pair(Pair& p) {
    if (p.client >= 0) ::close(p.client);
    if (p.server >= 0) ::close(p.server);
    p.client = p.server = -1;
  }

  int dial() const {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(target_port_));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // Copies what is readable on `from` to `to`; false when the pair is done.
  static bool pump(int from, int to) {
    char buf[65536];
    ssize_t n = ::read(from, buf, sizeof buf);
    if (n <= 0) return false;
    ssize_t off = 0;
    while (off < n) {
      ssize_t w = ::write(to, buf + off, static_cast<std::size_t>(n - off));
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }

  void run() {
    bool was_cut = false;
    long accepted = 0;
    while (!stop_) {
      long keep = keep_;
      bool cut = cut_ || keep >= 0;
      if (was_cut && !cut) {
        // Healing: the connections that went silent are dropped, so the
        // clients notice and reconnect.
        for (auto& p : pairs_) close_pair(p);
        pairs_.clear();
      }
      was_cut = cut;
      auto forwarded = [&](const Pair& p) { return p.server >= 0 && (!cut || p.index == keep); };
      std::vector<pollfd> fds;
      std::vector<std::size_t> polled_pairs;
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (std::size_t i = 0; i < pairs_.size(); ++i) {
        if (!forwarded(pairs_[i])) continue;
        polled_pairs.push_back(i);
        fds.push_back({pairs_[i].client, POLLIN, 0});
        fds.push_back({pairs_[i].server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 200) < 0) continue;
      if (fds[0].revents & POLLIN) {
        char buf[64];
        (void)!::read(wake_[0], buf, sizeof buf);
      }
      if (fds[1].revents & POLLIN) {
        int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          Pair p;
          p.client = c;
          p.index = accepted++;
          if (!cut || p.index == keep) {
            p.server = dial();
            if (p.server < 0) {
              ::close(c);
              continue;
            }
          }
          pairs_.push_back(p);
        }
      }
      for (std::size_t j = 0; j < polled_pairs.size(); ++j) {
        Pair& p = pairs_[polled_pairs[j]];
        pollfd& pc = fds[2 + 2 * j];
        pollfd& ps = fds[3 + 2 * j];
        bool ok = true;
        if (pc.revents & (POLLIN | POLLHUP | POLLERR)) ok = pump(p.client, p.server);
        if (ok && (ps.revents & (POLLIN | POLLHUP | POLLERR))) ok = pump(p.server, p.client);
        if (!ok) close_pair(p);
      }
      std::vector<Pair> live;
      for (auto& p : pairs_)
        if (p.client >= 0) live.push_back(p);
      pairs_.swap(live);
    }
    for (auto& p : pairs_) close_pair(p);
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> cut_{false};
  std::atomic<long> keep_{-1};  // >= 0: stall every connection but this one
  std::atomic<bool> stop_{false};
  std::vector<Pair> pairs_;  // proxy thread only
  std::thread thread_;
};

}  // namespace troupe::test
