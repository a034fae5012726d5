#include "redis_connection.hpp"  // first: it includes Asio first

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace troupe::cluster::detail {

namespace {

TimePoint steady_now() { return TimePoint(std::chrono::steady_clock::now().time_since_epoch()); }

std::string millis(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

}  // namespace

// --- replies ---------------------------------------------------------------------

RedisReply RedisReply::from(const redisReply* r) {
  RedisReply out;
  if (r == nullptr) return out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = Type::string;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Type::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Type::error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Type::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(from(r->element[i]));
      break;
    default:
      out.type = Type::nil;
      break;
  }
  return out;
}

std::string RedisReply::describe() const {
  switch (type) {
    case Type::nil:
      return "nil";
    case Type::status:
      return "status '" + str.substr(0, 80) + "'";
    case Type::error:
      return "error '" + str.substr(0, 200) + "'";
    case Type::integer:
      return "integer " + std::to_string(integer);
    case Type::string:
      return "string '" + str.substr(0, 80) + "'";
    case Type::array:
      return "array of " + std::to_string(elements.size());
  }
  return "?";
}

bool is_auth_refusal(const Error& e) { return e.message().find(kAuthRefused) != std::string::npos; }

// --- the event-loop adapter ------------------------------------------------------

// hiredis asks for read and write readiness through these hooks; each is a
// one-shot async_wait on the socket, re-armed while hiredis still wants it.
// The adapter is shared with the waits in flight, so a wait that completes
// after hiredis freed the context finds `alive` false and does nothing.
struct RedisConnection::Adapter : std::enable_shared_from_this<Adapter> {
  Adapter(asio::io_context& io, int fd, RedisConnection* o, redisAsyncContext* c)
      : sd(io, fd), owner(o), ac(c) {}

  asio::posix::stream_descriptor sd;
  RedisConnection* owner;
  redisAsyncContext* ac;
  bool alive = true;
  bool want_read = false, want_write = false;
  bool reading = false, writing = false;

  static void add_read(void* p) {
    auto* a = static_cast<Adapter*>(p);
    a->want_read = true;
    a->arm_read();
  }
  static void del_read(void* p) { static_cast<Adapter*>(p)->want_read = false; }
  static void add_write(void* p) {
    auto* a = static_cast<Adapter*>(p);
    a->want_write = true;
    a->arm_write();
  }
  static void del_write(void* p) { static_cast<Adapter*>(p)->want_write = false; }
  static void cleanup(void* p) { static_cast<Adapter*>(p)->detach(); }

  // hiredis is about to free the context and close the socket: stop
  // watching it (release() cancels the waits without closing the fd, which
  // hiredis owns).
  void detach() {
    if (!alive) return;
    alive = false;
    want_read = want_write = false;
    (void)sd.release();
    owner->on_context_gone();
  }

  void arm_read() {
    if (!alive || reading) return;
    reading = true;
    sd.async_wait(asio::posix::stream_descriptor::wait_read,
                  [self = shared_from_this()](const asio::error_code& ec) {
                    self->reading = false;
                    if (ec || !self->alive || !self->want_read) return;
                    RedisConnection* o = self->owner;
                    ++o->depth_;
                    redisAsyncHandleRead(self->ac);
                    --o->depth_;
                    if (self->alive && self->want_read) self->arm_read();
                    o->after_hiredis();
                  });
  }
  void arm_write() {
    if (!alive || writing) return;
    writing = true;
    sd.async_wait(asio::posix::stream_descriptor::wait_write,
                  [self = shared_from_this()](const asio::error_code& ec) {
                    self->writing = false;
                    if (ec || !self->alive || !self->want_write) return;
                    RedisConnection* o = self->owner;
                    ++o->depth_;
                    redisAsyncHandleWrite(self->ac);
                    --o->depth_;
                    if (self->alive && self->want_write) self->arm_write();
                    o->after_hiredis();
                  });
  }
};

struct RedisConnection::Pending {
  ReplyHandler handler;
  TimePoint deadline;
};

// --- connection ------------------------------------------------------------------

RedisConnection::RedisConnection(asio::io_context& io, RedisEndpoint endpoint, std::string name,
                                 Duration command_timeout)
    : io_(io),
      endpoint_(std::move(endpoint)),
      name_(std::move(name)),
      command_timeout_(command_timeout),
      resolver_(io),
      timer_(io) {}

RedisConnection::~RedisConnection() {
  destroying_ = true;
  resolver_.cancel();
  timer_.cancel();
  if (ac_ != nullptr) {
    closing_by_owner_ = true;
    ready_ = false;
    ++depth_;
    redisAsyncFree(ac_);
    --depth_;
  }
  for (Pending* p : inflight_) delete p;
}

Error RedisConnection::error(const std::string& what) const {
  return Error(ErrorCode::coordination_failed,
               "Redis at " + endpoint_.describe() + " (" + name_ + "): " + what);
}

void RedisConnection::connect(DoneHandler done) {
  if (depth_ > 0) {
    // Never start a new hiredis context from inside a callback of the old one.
    asio::post(io_, [this, d = std::move(done)]() mutable { connect(std::move(d)); });
    return;
  }
  if (ac_ != nullptr || connecting_) {
    asio::post(io_, [d = std::move(done), e = error("already connected or connecting")]() mutable { d(e); });
    return;
  }
  ++generation_;
  adapter_.reset();
  connecting_ = true;
  closing_by_owner_ = false;
  close_requested_ = false;
  gone_reason_.clear();
  connect_done_ = std::move(done);
  connect_deadline_ = steady_now() + command_timeout_;
  arm_timeout();
  asio::error_code ec;
  auto addr = asio::ip::make_address(endpoint_.host, ec);
  if (!ec) {
    start_connect(addr.to_string());
    return;
  }
  // A name: resolve it here rather than let hiredis block the io thread in
  // getaddrinfo.
  resolver_.async_resolve(endpoint_.host, std::to_string(endpoint_.port),
                          [this, gen = generation_](const asio::error_code& rec,
                                                    const asio::ip::tcp::resolver::results_type& results) {
                            if (gen != generation_ || !connecting_ || destroying_) return;
                            if (rec || results.empty()) {
                              finish_connect(error("cannot resolve '" + endpoint_.host + "': " +
                                                   (rec ? rec.message() : std::string("no address"))));
                              return;
                            }
                            start_connect(results.begin()->endpoint().address().to_string());
                          });
}

void RedisConnection::start_connect(const std::string& ip) {
  redisAsyncContext* ac = redisAsyncConnect(ip.c_str(), endpoint_.port);
  if (ac == nullptr) {
    finish_connect(error("cannot allocate a hiredis context"));
    return;
  }
  if (ac->err != 0) {
    std::string why = ac->errstr != nullptr ? ac->errstr : "connect failed";
    redisAsyncFree(ac);
    finish_connect(error("cannot connect: " + why));
    return;
  }
  ac_ = ac;
  ac->data = this;
  adapter_ = std::make_shared<Adapter>(io_, ac->c.fd, this, ac);
  ac->ev.data = adapter_.get();
  ac->ev.addRead = &Adapter::add_read;
  ac->ev.delRead = &Adapter::del_read;
  ac->ev.addWrite = &Adapter::add_write;
  ac->ev.delWrite = &Adapter::del_write;
  ac->ev.cleanup = &Adapter::cleanup;
  redisAsyncSetConnectCallback(ac, &RedisConnection::hiredis_connected);  // arms the first write wait
  redisAsyncSetDisconnectCallback(ac, &RedisConnection::hiredis_disconnected);
}

void RedisConnection::hiredis_connected(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  if (status != REDIS_OK) {
    // hiredis frees the context when this returns; on_context_gone reports.
    self->gone_reason_ =
        std::string("cannot connect: ") + (ac->errstr != nullptr ? ac->errstr : "connect failed");
    return;
  }
  asio::post(self->io_, [self, gen = self->generation_] {
    if (gen == self->generation_ && !self->destroying_) self->on_connected();
  });
}

void RedisConnection::hiredis_disconnected(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  if (status != REDIS_OK && self->gone_reason_.empty() && ac->errstr != nullptr)
    self->gone_reason_ = ac->errstr;
}

void RedisConnection::on_connected() {
  if (ac_ == nullptr || !connecting_) return;
  if (endpoint_.password.empty()) {
    ready_ = true;
    finish_connect({});
    return;
  }
  std::vector<std::string> auth = {"AUTH"};
  if (!endpoint_.user.empty()) auth.push_back(endpoint_.user);
  auth.push_back(endpoint_.password);
  send(std::move(auth), [this](Result<RedisReply> r) {
    if (!r.ok()) {
      finish_connect(std::move(r).error());
      return;
    }
    if (r->is_error()) {
      // Redis' reply ("WRONGPASS invalid username-password pair or user is
      // disabled.") names neither; the user name is no secret.
      std::string as = endpoint_.user.empty() ? std::string() : " for user '" + endpoint_.user + "'";
      Error e = error(std::string(kAuthRefused) + as + ": " + r->str);
      closing_by_owner_ = true;
      free_context();
      finish_connect(std::move(e));
      return;
    }
    ready_ = true;
    finish_connect({});
  });
}

void RedisConnection::finish_connect(Result<void> r) {
  if (!connecting_) return;
  connecting_ = false;
  DoneHandler d = std::move(connect_done_);
  connect_done_ = DoneHandler();
  arm_timeout();
  if (!r.ok() && ac_ != nullptr) {
    closing_by_owner_ = true;
    free_context();
  }
  if (d) asio::post(io_, [d = std::move(d), r = std::move(r)]() mutable { d(r); });
}

void RedisConnection::on_context_gone() {
  ac_ = nullptr;
  bool was_ready = ready_;
  ready_ = false;
  if (destroying_) return;
  std::string why = gone_reason_.empty() ? std::string("the connection closed") : gone_reason_;
  if (connecting_) finish_connect(error(why));
  if (subscribe_done_) {
    DoneHandler d = std::move(subscribe_done_);
    subscribe_done_ = DoneHandler();
    asio::post(io_, [d = std::move(d), e = error(why)]() mutable { d(e); });
  }
  if (was_ready && !closing_by_owner_ && on_lost_) {
    asio::post(io_, [h = on_lost_, e = error(why)]() { h(e); });
  }
}

void RedisConnection::free_context() {
  if (ac_ == nullptr) return;
  ready_ = false;
  if (depth_ > 0) {
    close_requested_ = true;  // after_hiredis() does it once hiredis has returned
    return;
  }
  redisAsyncContext* ac = ac_;
  ++depth_;
  redisAsyncFree(ac);  // runs every pending callback with a null reply, then the cleanup hook
  --depth_;
}

void RedisConnection::after_hiredis() {
  if (depth_ == 0 && close_requested_) {
    close_requested_ = false;
    free_context();
  }
}

void RedisConnection::close() {
  closing_by_owner_ = true;
  connecting_ = false;
  connect_done_ = DoneHandler();
  subscribe_done_ = DoneHandler();
  on_message_ = nullptr;
  if (gone_reason_.empty()) gone_reason_ = "closed";
  resolver_.cancel();
  free_context();
  arm_timeout();
}

void RedisConnection::lost(const std::string& why) {
  gone_reason_ = why;
  free_context();
}

void RedisConnection::command(std::vector<std::string> argv, ReplyHandler h) {
  if (!ready_ || ac_ == nullptr) {
    asio::post(io_, [h = std::move(h),
                     e = error(connecting_ ? "still connecting" : "not connected")]() mutable { h(e); });
    return;
  }
  send(std::move(argv), std::move(h));
}

void RedisConnection::send(std::vector<std::string> argv, ReplyHandler h) {
  std::vector<const char*> av;
  std::vector<std::size_t> al;
  av.reserve(argv.size());
  al.reserve(argv.size());
  for (const auto& a : argv) {
    av.push_back(a.data());
    al.push_back(a.size());
  }
  auto* p = new Pending{std::move(h), steady_now() + command_timeout_};
  if (redisAsyncCommandArgv(ac_, &RedisConnection::hiredis_reply, p, static_cast<int>(av.size()), av.data(),
                            al.data()) != REDIS_OK) {
    ReplyHandler handler = std::move(p->handler);
    delete p;
    asio::post(io_, [handler = std::move(handler), e = error("the command could not be queued")]() mutable {
      handler(e);
    });
    return;
  }
  inflight_.push_back(p);
  arm_timeout();
}

void RedisConnection::hiredis_reply(redisAsyncContext* ac, void* reply, void* privdata) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  auto* p = static_cast<Pending*>(privdata);
  auto it = std::find(self->inflight_.begin(), self->inflight_.end(), p);
  if (it != self->inflight_.end()) self->inflight_.erase(it);
  ReplyHandler h = std::move(p->handler);
  delete p;
  if (self->destroying_ || !static_cast<bool>(h)) return;
  if (reply == nullptr) {
    std::string why = self->gone_reason_;
    if (why.empty()) why = ac->c.err != 0 ? std::string(ac->c.errstr) : std::string("the connection closed");
    h(self->error(why));
  } else {
    h(RedisReply::from(static_cast<redisReply*>(reply)));
  }
  self->arm_timeout();
}

void RedisConnection::subscribe(const std::string& channel, MessageHandler on_message, DoneHandler done) {
  if (!ready_ || ac_ == nullptr) {
    asio::post(io_, [d = std::move(done), e = error("not connected")]() mutable { d(e); });
    return;
  }
  on_message_ = std::move(on_message);
  subscribe_done_ = std::move(done);
  subscribe_deadline_ = steady_now() + command_timeout_;
  const char* av[] = {"SUBSCRIBE", channel.data()};
  std::size_t al[] = {9, channel.size()};
  if (redisAsyncCommandArgv(ac_, &RedisConnection::hiredis_message, this, 2, av, al) != REDIS_OK) {
    DoneHandler d = std::move(subscribe_done_);
    subscribe_done_ = DoneHandler();
    asio::post(io_, [d = std::move(d), e = error("SUBSCRIBE could not be queued")]() mutable { d(e); });
    return;
  }
  arm_timeout();
}

void RedisConnection::hiredis_message(redisAsyncContext* ac, void* reply, void* privdata) {
  (void)ac;
  auto* self = static_cast<RedisConnection*>(privdata);
  if (reply == nullptr || self->destroying_) return;  // the context is going; on_context_gone reports
  auto* r = static_cast<redisReply*>(reply);
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING) return;
  std::string_view kind(r->element[0]->str, r->element[0]->len);
  if (kind == "subscribe") {
    if (self->subscribe_done_) {
      DoneHandler d = std::move(self->subscribe_done_);
      self->subscribe_done_ = DoneHandler();
      asio::post(self->io_, [d = std::move(d)]() mutable { d({}); });
      self->arm_timeout();
    }
  } else if (kind == "message" && r->element[2]->type == REDIS_REPLY_STRING && self->on_message_) {
    self->on_message_(std::string_view(r->element[2]->str, r->element[2]->len));
  }
}

// One timer covers the earliest of: the connect deadline, the oldest
// command's deadline, the subscription's confirmation.
void RedisConnection::arm_timeout() {
  if (destroying_) return;
  TimePoint next = TimePoint::max();
  if (connecting_) next = std::min(next, connect_deadline_);
  if (!inflight_.empty()) next = std::min(next, inflight_.front()->deadline);
  if (subscribe_done_) next = std::min(next, subscribe_deadline_);
  if (next == TimePoint::max()) {
    if (timer_armed_) {
      timer_armed_ = false;
      timer_.cancel();
    }
    return;
  }
  if (timer_armed_ && timer_at_ <= next) return;
  timer_armed_ = true;
  timer_at_ = next;
  timer_.expires_at(std::chrono::steady_clock::time_point(next.time_since_epoch()));
  timer_.async_wait([this](const asio::error_code& ec) {
    if (ec || destroying_) return;
    timer_armed_ = false;
    on_timeout_check();
  });
}

void RedisConnection::on_timeout_check() {
  TimePoint now = steady_now();
  if (connecting_ && now >= connect_deadline_) {
    gone_reason_ = "no connection within " + millis(command_timeout_);
    finish_connect(error(gone_reason_));
    return;
  }
  if (!inflight_.empty() && now >= inflight_.front()->deadline) {
    lost("no reply within " + millis(command_timeout_));
    return;
  }
  if (subscribe_done_ && now >= subscribe_deadline_) {
    lost("SUBSCRIBE not confirmed within " + millis(command_timeout_));
    return;
  }
  arm_timeout();
}

}  // namespace troupe::cluster::detail
