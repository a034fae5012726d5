#pragma once
// One asynchronous connection to Redis: hiredis' async API driven by an
// asio::io_context through asio::posix::stream_descriptor (hiredis ships
// adapters for libevent, libuv and others, not for Asio).
//
// Everything here runs on the io_context's thread: the hiredis context is
// not thread-safe and is touched nowhere else. Ownership: the owner of a
// RedisConnection keeps it for its whole life and reuses it across
// reconnects (close(), then connect() again); the hiredis context belongs to
// it and is freed by close() or the destructor. Handlers given to it run on
// the io thread, may call command() and close() on it, and must not destroy
// it.

// clang-format off
#include "../asio_headers.hpp"  // first: see there
// clang-format on

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"

struct redisAsyncContext;
struct redisReply;

namespace troupe::cluster::detail {

// A Redis reply copied out of hiredis, so it outlives the callback.
struct RedisReply {
  enum class Type { nil, status, error, integer, string, array };
  Type type = Type::nil;
  long long integer = 0;
  std::string str;  // status, error and string replies
  std::vector<RedisReply> elements;

  bool is_error() const noexcept { return type == Type::error; }
  bool is_array() const noexcept { return type == Type::array; }
  bool is_text() const noexcept { return type == Type::string || type == Type::status; }
  static RedisReply from(const redisReply* r);
  // A short rendering for error messages ("array of 3", "error 'NOSCRIPT ...'").
  std::string describe() const;
};

struct RedisEndpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string user;      // a Redis 6+ ACL user: AUTH <user> <password>; empty: AUTH <password>
  std::string password;  // empty: no AUTH (then `user` must be empty too)
  std::string describe() const { return host + ":" + std::to_string(port); }
};

// Every connect() failure caused by Redis refusing AUTH carries this in its
// message (never the password): the coordinator logs those apart.
inline constexpr std::string_view kAuthRefused = "AUTH refused";
bool is_auth_refusal(const Error& e);

class RedisConnection {
 public:
  // Move-only, so a handler may own a Promise.
  using ReplyHandler = troupe::detail::UniqueFunction<void(Result<RedisReply>)>;
  using DoneHandler = troupe::detail::UniqueFunction<void(Result<void>)>;
  // A message on the subscribed channel: its payload.
  using MessageHandler = std::function<void(std::string_view payload)>;
  // The connection went away after it was up (I/O error, server closed it,
  // a command timed out). Not called for close().
  using LostHandler = std::function<void(const Error&)>;

  RedisConnection(asio::io_context& io, RedisEndpoint endpoint, std::string name, Duration command_timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  void set_lost_handler(LostHandler h) { on_lost_ = std::move(h); }

  // Connects and authenticates; `done` runs once, later, on the io thread
  // with Ok or coordination_failed naming host:port. Connecting, the TCP
  // handshake and AUTH together are bounded by the command timeout.
  void connect(DoneHandler done);
  bool ready() const noexcept { return ready_; }

  // Sends one command. `h` runs once on the io thread with the reply (a
  // Redis error reply is a value here, not an Error), or coordination_failed
  // when the connection is not ready, breaks, or the reply does not arrive
  // within the command timeout (which also closes the connection: replies
  // come in order, so nothing behind a stuck one can arrive).
  void command(std::vector<std::string> argv, ReplyHandler h);

  // Subscribes to one channel (the connection is then in pub/sub mode and
  // takes no other command). `done` runs once when Redis confirms.
  void subscribe(const std::string& channel, MessageHandler on_message, DoneHandler done);

  // Frees the hiredis context now (or as soon as hiredis returns, when
  // called from one of its callbacks). Pending handlers get
  // coordination_failed. Idempotent.
  void close();

  const RedisEndpoint& endpoint() const noexcept { return endpoint_; }

 private:
  struct Adapter;
  struct Pending;

  void start_connect(const std::string& ip);
  void on_connected();
  void finish_connect(Result<void> r);
  void on_context_gone();
  void lost(const std::string& why);
  void free_context();
  void after_hiredis();
  void arm_timeout();
  void on_timeout_check();
  void send(std::vector<std::string> argv, ReplyHandler h);
  Error error(const std::string& what) const;

  static void hiredis_connected(const redisAsyncContext* ac, int status);
  static void hiredis_disconnected(const redisAsyncContext* ac, int status);
  static void hiredis_reply(redisAsyncContext* ac, void* reply, void* privdata);
  static void hiredis_message(redisAsyncContext* ac, void* reply, void* privdata);

  friend struct Adapter;

  asio::io_context& io_;
  RedisEndpoint endpoint_;
  std::string name_;
  Duration command_timeout_;
  asio::ip::tcp::resolver resolver_;
  asio::steady_timer timer_;
  LostHandler on_lost_;

  redisAsyncContext* ac_ = nullptr;
  std::shared_ptr<Adapter> adapter_;
  std::uint64_t generation_ = 0;  // one per connect(): stale resolver and timer handlers compare it
  bool ready_ = false;
  bool connecting_ = false;
  DoneHandler connect_done_;
  TimePoint connect_deadline_{};
  std::string gone_reason_;  // why hiredis dropped the context, for the pending handlers

  // Commands sent and not answered, oldest first (Redis answers in order).
  std::deque<Pending*> inflight_;

  MessageHandler on_message_;
  DoneHandler subscribe_done_;
  TimePoint subscribe_deadline_{};

  bool timer_armed_ = false;
  TimePoint timer_at_{};

  int depth_ = 0;                  // > 0 while inside hiredis (its callbacks may run)
  bool close_requested_ = false;   // free the context once hiredis has returned
  bool closing_by_owner_ = false;  // close() or a failed connect: no lost handler
  bool destroying_ = false;        // in the destructor: handlers are dropped, not called
};

}  // namespace troupe::cluster::detail
