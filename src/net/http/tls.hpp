#pragma once
// TLS for the HTTP server and client (OpenSSL through Boost.Asio's ssl
// stream): the contexts they build from PEM files, the server's context
// read again when its files change, and Stream, the TCP socket or TLS
// over one that a connection reads and writes. Internal to src/net/http/.
//
// Thread safety: a context is immutable once built and shared by the
// connections made with it (each keeps its own reference); TlsFiles is
// locked inside; a Stream belongs to one connection on its io thread.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "beast_headers.hpp"
#include "troupe/core/result.hpp"

namespace troupe::http::detail {

namespace ssl = boost::asio::ssl;
using TlsContext = std::shared_ptr<ssl::context>;

// A server context: TLS 1.2 or newer (1.3 preferred by OpenSSL's own
// order), the certificate chain and private key of `cert` and `key` (PEM).
// invalid_argument naming the file that does not load or a key that does
// not match the certificate.
Result<TlsContext> server_context(const std::string& cert, const std::string& key);

// A client context: TLS 1.2 or newer; the peer's certificate must chain to
// `ca` (PEM; empty: the system's trusted roots).
Result<TlsContext> client_context(const std::string& ca);

// The server's certificate and key files and the context built from them,
// built again when either file changes (size, time or inode), looked at
// no more than once a second. A change that does not load keeps the last
// context and is logged once.
class TlsFiles {
 public:
  static Result<std::unique_ptr<TlsFiles>> open(std::string cert, std::string key);
  // The context for a new connection.
  TlsContext current();

 private:
  struct Stamp {
    bool operator==(const Stamp&) const = default;
    std::int64_t size = 0, mtime_ns = 0;
    std::uint64_t inode = 0;
  };
  TlsFiles(std::string cert, std::string key) : cert_(std::move(cert)), key_(std::move(key)) {}
  std::pair<std::optional<Stamp>, std::optional<Stamp>> stamps() const;

  const std::string cert_, key_;
  std::mutex mu_;
  TlsContext ctx_;
  std::pair<std::optional<Stamp>, std::optional<Stamp>> seen_;
  std::chrono::steady_clock::time_point next_look_{};
  bool warned_ = false;
};

// A TCP socket, or TLS over one. Reads and writes like either (Beast's
// AsyncReadStream and AsyncWriteStream); handshake() is for TLS only.
class Stream {
 public:
  using executor_type = Socket::executor_type;

  explicit Stream(Socket socket) : tcp_(std::move(socket)) {}
  Stream(Socket socket, TlsContext ctx)
      : ctx_(std::move(ctx)), tcp_(socket.get_executor()),
        tls_(std::make_unique<ssl::stream<Socket>>(std::move(socket), *ctx_)) {}

  bool tls() const noexcept { return tls_ != nullptr; }
  Socket& tcp() noexcept { return tls_ ? tls_->next_layer() : tcp_; }
  const Socket& tcp() const noexcept { return tls_ ? tls_->next_layer() : tcp_; }
  ssl::stream<Socket>& tls_stream() noexcept { return *tls_; }
  executor_type get_executor() noexcept { return tcp_.get_executor(); }

  template <class Buffers, class Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    else
      tcp_.async_read_some(buffers, std::forward<Handler>(handler));
  }
  template <class Buffers, class Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    else
      tcp_.async_write_some(buffers, std::forward<Handler>(handler));
  }
  template <class Buffers>
  std::size_t write_some(const Buffers& buffers, beast::error_code& ec) {
    return tls_ ? tls_->write_some(buffers, ec) : tcp_.write_some(buffers, ec);
  }

 private:
  TlsContext ctx_;  // outlives tls_ (declared first)
  Socket tcp_;      // the socket itself without TLS; unused with it
  std::unique_ptr<ssl::stream<Socket>> tls_;
};

// What OpenSSL said went wrong in a handshake, for a log line.
std::string tls_reason(const beast::error_code& ec);

}  // namespace troupe::http::detail
