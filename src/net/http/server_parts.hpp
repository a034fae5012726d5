#pragma once
// The HTTP server's parts that do not touch a socket: the counters behind
// ServerStats, the checks of ServerSettings, the error codes of refusals,
// and how a Responder reaches its connection. Internal to src/net/http/.
//
// The Responder helpers are templates over the implementation's own loop
// and connection types, which provide:
//   Loop:       bool on_thread() const; bool post(F&&)   (false once closed)
//   Connection: bool complete(std::uint64_t seq, Response&&);
//               void dropped(std::uint64_t seq, bool unwinding)
// Thread safety: the counters are atomics (relaxed: they order nothing);
// the rest are functions over values.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "syntax.hpp"
#include "tls.hpp"
#include "troupe/core/log.hpp"
#include "troupe/net/http.hpp"

namespace troupe::http::detail {

// The "code" of the JSON error body a refusal with this status carries.
inline std::string_view error_code_for(int status) noexcept {
  switch (status) {
    case 408:
      return "request_timeout";
    case 413:
      return "payload_too_large";
    case 414:
      return "uri_too_long";
    case 417:
      return "expectation_failed";
    case 431:
      return "header_too_large";
    case 501:
      return "not_implemented";
    case 503:
      return "unavailable";
    case 505:
      return "version_not_supported";
    default:
      return "bad_request";
  }
}

struct Counters {
  std::atomic<std::uint64_t> accepted{0}, refused{0}, open{0}, requests{0}, responses{0}, bad_requests{0};
  std::atomic<std::uint64_t> timeouts{0}, handler_exceptions{0}, responders_dropped{0}, refused_per_address{0};
  std::atomic<std::uint64_t> tls_failed{0};
  std::atomic<std::uint64_t> bytes_received{0}, bytes_sent{0};
};

// Counters order nothing: relaxed.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

inline ServerStats stats_of(const Counters& c) {
  auto v = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  ServerStats s;
  s.connections_accepted = v(c.accepted);
  s.connections_refused = v(c.refused);
  s.connections_refused_per_address = v(c.refused_per_address);
  s.connections_open = v(c.open);
  s.requests = v(c.requests);
  s.responses = v(c.responses);
  s.bad_requests = v(c.bad_requests);
  s.timeouts = v(c.timeouts);
  s.tls_handshakes_failed = v(c.tls_failed);
  s.handler_exceptions = v(c.handler_exceptions);
  s.responders_dropped = v(c.responders_dropped);
  s.bytes_received = v(c.bytes_received);
  s.bytes_sent = v(c.bytes_sent);
  return s;
}

// Connections open per remote address (max_connections_per_address).
// Thread safety: a mutex; touched once when a connection opens and once
// when it closes.
class AddressCounts {
 public:
  // Counts one more connection from `address` unless `limit` are open.
  bool take(const std::string& address, std::size_t limit) {
    std::lock_guard lk(mu_);
    std::size_t& n = open_[address];
    if (n >= limit) return false;
    ++n;
    return true;
  }
  void release(const std::string& address) {
    std::lock_guard lk(mu_);
    auto it = open_.find(address);
    if (it != open_.end() && --it->second == 0) open_.erase(it);
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::size_t> open_;
};

// What every connection of a server shares with it. Immutable after start
// but for the counters.
struct Shared {
  ServerSettings settings;
  Router router;
  Counters c;
  AddressCounts per_address;
  std::unique_ptr<TlsFiles> tls;  // null: plain HTTP
  Duration tick{};  // min(idle_timeout, request_read_timeout): how often a connection's timer looks

  void log(std::string_view line) const noexcept {
    try {
      if (settings.log) settings.log(line);
    } catch (...) {
      // A failing log sink must not take a connection down.
    }
  }
};

// Server::start()'s checks; fills in the default log. invalid_argument for
// unusable settings.
inline Result<std::shared_ptr<Shared>> make_shared_state(ServerSettings settings, Router router) {
  auto bad = [](std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); };
  if (settings.io_threads < 1 || settings.io_threads > 256) return bad("io_threads must be between 1 and 256");
  if (settings.max_header_bytes < 64) return bad("max_header_bytes must be at least 64");
  if (settings.max_connections == 0) return bad("max_connections must be positive");
  if (settings.max_pipelined == 0) return bad("max_pipelined must be positive");
  if (settings.idle_timeout <= Duration::zero() || settings.request_read_timeout <= Duration::zero())
    return bad("idle_timeout and request_read_timeout must be positive");
  if (settings.drain_timeout < Duration::zero()) return bad("drain_timeout must not be negative");
  if (settings.tls_handshake_timeout <= Duration::zero()) return bad("tls_handshake_timeout must be positive");
  if (settings.tls_cert_file.empty() != settings.tls_key_file.empty())
    return bad("TLS needs both a certificate and a key file");
  std::unique_ptr<TlsFiles> tls;
  if (!settings.tls_cert_file.empty()) {
    auto files = TlsFiles::open(settings.tls_cert_file, settings.tls_key_file);
    if (!files.ok()) return std::move(files).error();
    tls = std::move(*files);
  }
  if (!settings.log) {
    settings.log = [](std::string_view line) { log::warn(log::Component::net, line); };
  }
  auto shared = std::make_shared<Shared>();
  shared->tick = std::min(settings.idle_timeout, settings.request_read_timeout);
  if (tls) shared->tick = std::min(shared->tick, settings.tls_handshake_timeout);
  shared->tls = std::move(tls);
  shared->settings = std::move(settings);
  shared->router = std::move(router);
  return shared;
}

// Responder::respond(): inline on the loop's io thread, posted otherwise.
template <class Loop, class Connection>
void respond_through(std::shared_ptr<Loop> loop, std::weak_ptr<Connection> conn, std::uint64_t seq,
                     Response response) {
  if (!loop) return;
  if (loop->on_thread()) {
    if (auto c = conn.lock()) c->complete(seq, std::move(response));
    return;
  }
  loop->post([conn = std::move(conn), seq, r = std::move(response)]() mutable {
    if (auto c = conn.lock()) c->complete(seq, std::move(r));
  });
}

// Responder::drop(): the request is answered 500 no_reply (unless a handler
// is unwinding, whose exception answers it).
template <class Loop, class Connection>
void drop_through(std::shared_ptr<Loop> loop, std::weak_ptr<Connection> conn, std::uint64_t seq) noexcept {
  if (!loop) return;
  try {
    if (loop->on_thread()) {
      if (auto c = conn.lock()) c->dropped(seq, std::uncaught_exceptions() > 0);
      return;
    }
    loop->post([conn = std::move(conn), seq] {
      if (auto c = conn.lock()) c->dropped(seq, false);
    });
  } catch (...) {
    // Out of memory while answering a dropped request: the client's own
    // timeout ends its wait.
  }
}

}  // namespace troupe::http::detail
