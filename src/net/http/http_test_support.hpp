#pragma once
// Test support for the HTTP stack: a raw client socket that sends exact
// bytes and reads what comes back, a scripted raw server for the client's
// tests, a captured log, and a server started on a free port.
// Plain POSIX sockets with poll() deadlines, so that nothing here shares
// code with what it tests.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/net/http.hpp"

namespace troupe::http::testing {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// Polls `pred` until it holds or `limit` passes.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  const auto until = SteadyClock::now() + limit;
  while (SteadyClock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

// Log lines, captured from any thread.
class LogSink {
 public:
  std::function<void(std::string_view)> fn() {
    return [this](std::string_view line) {
      std::lock_guard lk(mu_);
      lines_.emplace_back(line);
    };
  }
  bool contains(std::string_view part) const {
    std::lock_guard lk(mu_);
    for (const auto& l : lines_)
      if (l.find(part) != std::string::npos) return true;
    return false;
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

// A client socket that speaks whatever bytes a test gives it.
class RawConn {
 public:
  // `from`: the local address to connect from ("127.0.0.2"); default: any.
  static std::unique_ptr<RawConn> connect(std::uint16_t port, const char* from = nullptr) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return nullptr;
    if (from) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &local.sin_addr);
      if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
        ::close(fd);
        return nullptr;
      }
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return nullptr;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return std::unique_ptr<RawConn>(new RawConn(fd));
  }
  ~RawConn() { ::close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  // Writes all of `bytes`; false if the connection refused them.
  bool write(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  void shutdown_send() { ::shutdown(fd_, SHUT_WR); }

  // Reads one response (skipping interim 1xx ones), or nullopt if none
  // arrives whole within `limit` or what arrives is not a response.
  std::optional<Response> read_response(std::chrono::milliseconds limit = 5000ms, bool head = false) {
    const auto until = SteadyClock::now() + limit;
    for (bool eof = false;;) {
      Response r;
      std::size_t used = 0;
      switch (parse_response(buf_, head, eof, r, used, last_keep_alive_)) {
        case Parse::complete:
          buf_.erase(0, used);
          return r;
        case Parse::error:
          return std::nullopt;
        case Parse::need_more:
          if (eof) return std::nullopt;
          break;
      }
      const int got = fill(until);
      if (got < 0) return std::nullopt;
      eof = got == 0;
    }
  }

  // Reads until the server closes (true) or `limit` passes (false).
  bool wait_closed(std::chrono::milliseconds limit = 5000ms) {
    const auto until = SteadyClock::now() + limit;
    for (;;) {
      const int got = fill(until);
      if (got == 0) return true;
      if (got < 0) return closed_;
    }
  }

  // Everything received and not yet parsed as a response.
  const std::string& received() const { return buf_; }
  bool last_keep_alive() const { return last_keep_alive_; }
  int fd() const { return fd_; }

  enum class Parse { need_more, complete, error };

  // A deliberately small reader of one response (status line, fields,
  // Content-Length, chunked or close-delimited body), independent of the
  // code under test.
  static Parse parse_response(std::string_view buf, bool head, bool eof, Response& out, std::size_t& used,
                              bool& keep_alive) {
    used = 0;
    for (;;) {
      const std::size_t end = buf.find("\r\n\r\n", used);
      if (end == std::string_view::npos) return eof ? Parse::error : Parse::need_more;
      std::string_view block = buf.substr(used, end - used);
      const std::size_t eol = block.find("\r\n");
      const std::string_view line = block.substr(0, eol);
      if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || line[8] != ' ') return Parse::error;
      int status = 0;
      if (std::from_chars(line.data() + 9, line.data() + 12, status).ec != std::errc()) return Parse::error;
      out = Response{};
      out.status = status;
      out.content_type.clear();
      if (eol != std::string_view::npos) block.remove_prefix(eol + 2); else block = {};
      while (!block.empty()) {
        const std::size_t next = block.find("\r\n");
        const std::string_view field = block.substr(0, next);
        const std::size_t colon = field.find(':');
        if (colon == std::string_view::npos) return Parse::error;
        std::string_view value = field.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        out.headers.emplace_back(std::string(field.substr(0, colon)), std::string(value));
        block = next == std::string_view::npos ? std::string_view() : block.substr(next + 2);
      }
      out.content_type = std::string(out.header("Content-Type"));
      used = end + 4;
      if (status / 100 == 1) continue;  // interim: the answer follows
      const std::string_view connection = out.header("Connection");
      keep_alive = line[7] == '1' ? connection.find("close") == std::string_view::npos
                                  : connection.find("keep-alive") != std::string_view::npos;
      if (head || status == 204 || status == 304) return Parse::complete;
      if (const std::string_view cl = out.header("Content-Length"); !cl.empty()) {
        std::size_t n = 0;
        if (std::from_chars(cl.data(), cl.data() + cl.size(), n).ec != std::errc()) return Parse::error;
        if (buf.size() - used < n) return eof ? Parse::error : Parse::need_more;
        out.body.assign(buf.substr(used, n));
        used += n;
        return Parse::complete;
      }
      if (out.header("Transfer-Encoding").find("chunked") != std::string_view::npos) {
        for (;;) {
          const std::size_t size_end = buf.find("\r\n", used);
          if (size_end == std::string_view::npos) return eof ? Parse::error : Parse::need_more;
          std::size_t n = 0;
          if (std::from_chars(buf.data() + used, buf.data() + size_end, n, 16).ec != std::errc()) return Parse::error;
          if (n == 0) {
            const std::size_t trailer_end = buf.find("\r\n", size_end + 2);
            if (trailer_end == std::string_view::npos) return eof ? Parse::error : Parse::need_more;
            used = trailer_end + 2;
            return Parse::complete;
          }
          if (buf.size() < size_end + 2 + n + 2) return eof ? Parse::error : Parse::need_more;
          out.body.append(buf.substr(size_end + 2, n));
          used = size_end + 2 + n + 2;
        }
      }
      if (!eof) return Parse::need_more;  // close-delimited: complete at the end of the stream
      out.body.assign(buf.substr(used));
      used = buf.size();
      keep_alive = false;
      return Parse::complete;
    }
  }

 private:
  explicit RawConn(int fd) : fd_(fd) {}

  // 1: read something; 0: end of stream (or reset); -1: timed out.
  int fill(SteadyClock::time_point until) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now()).count();
    if (left <= 0) return -1;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return -1;
    char tmp[16384];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
      closed_ = true;
      return 0;
    }
    buf_.append(tmp, static_cast<std::size_t>(n));
    return 1;
  }

  int fd_;
  std::string buf_;
  bool closed_ = false;
  bool last_keep_alive_ = true;
};

// A raw TCP server for the client's tests: every accepted connection runs
// `script(fd, index)` on its own thread; the fd is closed after it returns.
class ScriptedServer {
 public:
  using Script = std::function<void(int fd, int index)>;

  explicit ScriptedServer(Script script) : script_(std::move(script)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 128);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { run(); });
  }
  ~ScriptedServer() {
    stop_.store(true);
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    std::vector<std::thread> threads;
    {
      std::lock_guard lk(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  std::uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }
  bool stopping() const { return stop_.load(); }

  // Reads one request's header block (to the empty line) and its
  // Content-Length body; false if the stream ended first.
  static bool read_request(int fd, std::string* head = nullptr) {
    std::string buf;
    char c;
    while (buf.size() < 4 || buf.compare(buf.size() - 4, 4, "\r\n\r\n") != 0) {
      if (::recv(fd, &c, 1, 0) != 1) return false;
      buf.push_back(c);
    }
    std::size_t length = 0;
    const auto cl = buf.find("Content-Length: ");
    if (cl != std::string::npos) length = std::stoul(buf.substr(cl + 16));
    for (std::size_t i = 0; i < length; ++i)
      if (::recv(fd, &c, 1, 0) != 1) return false;
    if (head) *head = buf;
    return true;
  }
  static void write_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

 private:
  void run() {
    for (int index = 0;; ++index) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0 || stop_.load()) {
        if (fd >= 0) ::close(fd);
        return;
      }
      accepted_.fetch_add(1);
      std::lock_guard lk(mu_);
      fds_.push_back(fd);
      threads_.emplace_back([this, fd, index] {
        script_(fd, index);
        ::shutdown(fd, SHUT_RDWR);
      });
    }
  }

  Script script_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// A server on a free port with its log captured.
struct TestServer {
  std::shared_ptr<LogSink> log = std::make_shared<LogSink>();  // first: outlives the server
  std::unique_ptr<Server> server;

  static TestServer start(Router router, ServerSettings settings = {}) {
    TestServer t;
    settings.port = 0;
    settings.log = t.log->fn();
    auto s = Server::start(std::move(settings), std::move(router));
    if (s.ok()) t.server = std::move(*s);
    return t;
  }
  Server* operator->() const { return server.get(); }
  std::uint16_t port() const { return server->port(); }
};

inline std::unique_ptr<Client> make_client(std::uint16_t port, ClientSettings settings = {}) {
  settings.host = "127.0.0.1";
  settings.port = port;
  auto c = Client::create(std::move(settings));
  return c.ok() ? std::move(*c) : nullptr;
}

// "GET /x HTTP/1.1" with a Host header and anything else given.
inline std::string get(std::string_view target, std::string_view extra = {}) {
  std::string out = "GET ";
  out.append(target).append(" HTTP/1.1\r\nHost: test\r\n").append(extra).append("\r\n");
  return out;
}

}  // namespace troupe::http::testing
