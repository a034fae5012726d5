// One connection of the Boost.Beast HTTP server: Beast reads each request
// and writes each response; around it, the contract of http.hpp (answers in
// request order, bounded pipelining, timeouts, a draining close). See
// beast_server.hpp.

#include "beast_server.hpp"

#include <array>
#include <functional>

namespace troupe::http::detail {

namespace {

constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr std::size_t kReadRoom = 8u << 10;

}  // namespace

void ServerConnection::start() {
  beast::error_code ignored;
  socket_.tcp().set_option(asio::ip::tcp::no_delay(true), ignored);
  last_activity_ = Clock::now();
  arm(last_activity_ + tick());
  if (socket_.tls())
    handshake();
  else
    read();
}

// TLS: the handshake first, within tls_handshake_timeout (on_timer).
void ServerConnection::handshake() {
  handshaking_ = true;
  socket_.tls_stream().async_handshake(ssl::stream_base::server, [self = shared_from_this()](const beast::error_code& ec) {
    if (self->closed_) return;
    self->handshaking_ = false;
    if (ec) {
      bump(self->s_->c.tls_failed);
      if (log::enabled(log::Component::net, log::Level::debug))
        log::debug(log::Component::net, "TLS handshake failed",
                   {{"remote", self->remote()}, {"reason", tls_reason(ec)}});
      self->close();
      return;
    }
    self->last_activity_ = Clock::now();
    self->read();
  });
}

std::string ServerConnection::remote() const {
  beast::error_code ec;
  const auto ep = socket_.tcp().remote_endpoint(ec);
  if (ec) return "a closed connection";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

void ServerConnection::read() {
  if (reading_ || parsing_ || closed_ || read_stopped_) return;
  if (slots_.size() >= s_->settings.max_pipelined) {
    paused_ = true;
    return;
  }
  // What has arrived may hold the next requests already (pipelined).
  if (buffer_.size() > 0 && !parse()) return;
  reading_ = true;
  socket_.async_read_some(buffer_.prepare(kReadRoom),
                          [self = shared_from_this()](const beast::error_code& ec, std::size_t n) {
                            self->on_read(ec, n);
                          });
}

void ServerConnection::on_read(const beast::error_code& ec, std::size_t n) {
  reading_ = false;
  // Closed, lingering, or a read this connection cancelled itself (408).
  if (closed_ || lingering_ || (ec == asio::error::operation_aborted && read_stopped_)) return;
  if (ec) {
    if (ec != asio::error::eof) {  // aborted, reset, ...
      close();
      return;
    }
    if (buffer_.size() > 0 || (request_ && request_->parser.got_some())) {
      push_error(400, "the connection ended inside a request");
      return;
    }
    // The client half-closed: answer what it asked (flush() closes after
    // the last answer), then close.
    read_stopped_ = true;
    if (slots_.empty() && !writing_ && out_.empty())
      close();
    else if (slots_.empty())
      close_after_write_ = true;
    return;
  }
  buffer_.commit(n);
  bump(s_->c.bytes_received, n);
  last_activity_ = Clock::now();
  if (!in_request_ && n > 0) {
    in_request_ = true;
    request_started_ = last_activity_;
  }
  if (parse()) read();
}

// Feeds what has arrived to the parser (beast_messages.hpp) and dispatches
// each complete request. False when reading stops here (a refusal, a
// closing request, the pipelining limit).
bool ServerConnection::parse() {
  parsing_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{parsing_};
  for (;;) {
    if (!request_) {
      request_.emplace();
      limit(*request_, s_->settings);
    }
    Refusal refusal;
    switch (feed_request(*request_, buffer_, s_->settings.max_header_bytes, refusal)) {
      case Fed::need_more:
        return true;
      case Fed::refused:
        push_error(refusal.status, std::move(refusal.reason));
        return false;
      case Fed::header:
        if (expects_continue(request_->parser.get()) && slots_.empty() && !writing_ && !request_->parser.is_done()) {
          static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          beast::error_code ignored;
          asio::write(socket_, asio::buffer(kContinue), ignored);
        }
        continue;
      case Fed::done: {
        BeastRequest request = request_->parser.release();
        request_.reset();
        // The next request begins with the bytes already here, if any.
        in_request_ = buffer_.size() > 0;
        request_started_ = last_activity_;
        dispatch(std::move(request));
        if (closed_ || read_stopped_) return false;
        if (slots_.size() >= s_->settings.max_pipelined) {
          paused_ = true;
          return false;
        }
        continue;
      }
    }
  }
}

void ServerConnection::dispatch(BeastRequest&& breq) {
  const bool head = breq.method() == bhttp::verb::head;
  const bool keep_alive = breq.keep_alive();
  const unsigned version = breq.version();
  Request req;
  if (auto refused = to_request(std::move(breq), req)) {
    push_error(refused->status, std::move(refused->reason));
    return;
  }

  // Every request runs under a trace (SPEC X4): the caller's traceparent
  // with a span of this server's own, or a new trace when it sent none or
  // a malformed one (never an error to the client). The response carries
  // it back; the handler, and every message it sends, runs under it.
  const TraceContext trace = TraceContext::from_header(req.header("traceparent"));
  TraceScope trace_scope(trace);
  Slot slot;
  slot.trace = trace;
  slot.seq = next_seq_++;
  slot.head = head;
  slot.close = !keep_alive || draining_;
  slot.version = version;
  if (slot.close) read_stopped_ = true;
  const std::uint64_t seq = slot.seq;
  slots_.push_back(std::move(slot));
  bump(s_->c.requests);
  TROUPE_LOG(log::Component::net, log::Level::debug, "request", {{"method", req.method}, {"path", req.path}});
  dispatching_seq_ = seq;
  try {
    s_->router.dispatch(req, Responder(loop_ref_.lock(), weak_from_this(), seq));
  } catch (const std::exception& e) {
    bump(s_->c.handler_exceptions);
    s_->log("handler for " + req.method + " " + req.path + " threw: " + e.what());
    complete(seq,
             Response::error(500, "handler_failed", std::string("the request handler threw: ") + e.what()));
  } catch (...) {
    bump(s_->c.handler_exceptions);
    s_->log("handler for " + req.method + " " + req.path + " threw a non-standard exception");
    complete(seq,
             Response::error(500, "handler_failed", "the request handler threw a non-standard exception"));
  }
  dispatching_seq_ = 0;
}

bool ServerConnection::complete(std::uint64_t seq, Response&& r) {
  if (closed_ || slots_.empty() || seq < slots_.front().seq) return false;
  const std::uint64_t idx = seq - slots_.front().seq;
  if (idx >= slots_.size()) return false;
  Slot& slot = slots_[static_cast<std::size_t>(idx)];
  if (slot.done) return false;
  slot.done = true;
  const int status = r.status;
  if (slot.trace && log::enabled(log::Component::net, log::Level::debug)) {
    TraceScope scope(*slot.trace);
    log::debug(log::Component::net, "response", {{"status", status}});
  }
  slot.response = build(std::move(r), slot);
  if (!slot.response) {
    s_->log("a handler answered with an invalid status (" + std::to_string(status) +
            ") or a header that could break the response; answered 500 instead");
    slot.response = build(
        Response::error(500, "invalid_response", "the request handler produced an invalid status or header"), slot);
  }
  if (idx == 0) flush();
  return true;
}

void ServerConnection::dropped(std::uint64_t seq, bool unwinding) {
  if (unwinding && seq == dispatching_seq_) return;
  if (closed_ || slots_.empty() || seq < slots_.front().seq || seq - slots_.front().seq >= slots_.size())
    return;
  if (slots_[static_cast<std::size_t>(seq - slots_.front().seq)].done) return;
  bump(s_->c.responders_dropped);
  complete(seq,
           Response::error(500, "no_reply", "the request handler dropped its responder without responding"));
}

void ServerConnection::push_error(int status, std::string reason) {
  if (status == 408)
    bump(s_->c.timeouts);
  else
    bump(s_->c.bad_requests);
  s_->log("closing connection from " + remote() + ": " + std::to_string(status) + " " + reason);
  Slot slot;
  slot.seq = next_seq_++;
  slot.done = true;
  slot.close = true;
  slot.response = build(Response::error(status, error_code_for(status), reason), slot);
  slots_.push_back(std::move(slot));
  read_stopped_ = true;
  in_request_ = false;
  flush();
}

void ServerConnection::flush() {
  bool closing = false;
  while (!slots_.empty() && slots_.front().done) {
    Slot& front = slots_.front();
    out_.push_back(std::move(front.response));
    bump(s_->c.responses);
    closing = front.close;
    slots_.pop_front();
    if (closing) {
      slots_.clear();
      read_stopped_ = true;
      break;
    }
  }
  if (closing || (draining_ && slots_.empty())) close_after_write_ = true;
  if (read_stopped_ && slots_.empty() && !reading_) close_after_write_ = true;
  start_write();
  if (paused_ && !read_stopped_ && slots_.size() < s_->settings.max_pipelined) {
    paused_ = false;
    read();
  }
}

void ServerConnection::start_write() {
  if (writing_ || closed_) return;
  if (out_.empty()) {
    if (close_after_write_) finish_and_linger();
    return;
  }
  std::shared_ptr<BeastResponse> res = std::move(out_.front());
  out_.pop_front();
  writing_ = true;
  write_started_ = Clock::now();
  bhttp::async_write(socket_, *res,
                     [self = shared_from_this(), res](const beast::error_code& ec, std::size_t n) {
                       self->writing_ = false;
                       if (self->closed_) return;
                       if (ec) {
                         self->close();
                         return;
                       }
                       bump(self->s_->c.bytes_sent, n);
                       self->last_activity_ = Clock::now();
                       self->start_write();
                     });
}

void ServerConnection::finish_and_linger() {
  if (lingering_ || closed_) return;
  beast::error_code ignored;
  socket_.tcp().shutdown(asio::socket_base::shutdown_send, ignored);
  if (draining_) {
    close();
    return;
  }
  // Read (and drop) what the client still sends until it closes, so that
  // unread input does not turn the close into a reset (RFC 9112 9.6).
  lingering_ = true;
  arm(Clock::now() + kLingerTime);
  auto scratch = std::make_shared<std::array<char, 4096>>();
  auto drain_more = std::make_shared<std::function<void()>>();
  *drain_more = [self = shared_from_this(), scratch, drain_more] {
    if (self->closed_) return;
    self->socket_.async_read_some(asio::buffer(*scratch), [self, drain_more](const beast::error_code& ec, std::size_t) {
      if (ec || self->closed_) {
        self->close();
        *drain_more = nullptr;
        return;
      }
      (*drain_more)();
    });
  };
  if (reading_) {
    beast::error_code e;
    socket_.tcp().cancel(e);
  }
  (*drain_more)();
}

void ServerConnection::close() {
  if (closed_) return;
  closed_ = true;
  ++timer_gen_;
  timer_.cancel();
  beast::error_code ignored;
  socket_.tcp().close(ignored);
  slots_.clear();
  out_.clear();
  s_->c.open.fetch_sub(1, std::memory_order_relaxed);
  release_address();
  loop_.live.erase(shared_from_this());
}

void ServerConnection::drain() {
  if (closed_) return;
  draining_ = true;
  read_stopped_ = true;
  if (slots_.empty() && !writing_ && out_.empty()) {
    close();
    return;
  }
  if (!slots_.empty())
    slots_.back().close = true;
  else
    close_after_write_ = true;
}

void ServerConnection::abort() {
  if (closed_) return;
  s_->c.open.fetch_sub(1, std::memory_order_relaxed);
  release_address();
  closed_ = true;
  timer_.cancel();
  beast::error_code ignored;
  socket_.tcp().close(ignored);
  slots_.clear();
  out_.clear();
}

void ServerConnection::arm(Clock::time_point at) {
  const std::uint64_t gen = ++timer_gen_;
  timer_.expires_at(at);
  timer_.async_wait([self = shared_from_this(), gen](const beast::error_code& ec) {
    if (ec || gen != self->timer_gen_ || self->closed_) return;
    self->on_timer();
  });
}

// One timer per connection, armed at most every tick and never per
// request: it looks at the timestamps and decides.
void ServerConnection::on_timer() {
  if (lingering_) {
    close();
    return;
  }
  const auto now = Clock::now();
  const ServerSettings& st = s_->settings;
  Clock::time_point next = now + tick();
  if (handshaking_) {
    const auto due = last_activity_ + st.tls_handshake_timeout;  // last_activity_: the accept
    if (now >= due) {
      bump(s_->c.timeouts);
      bump(s_->c.tls_failed);
      close();
      return;
    }
    arm(std::min(next, due));
    return;
  }
  if (writing_) {
    const auto due = write_started_ + st.idle_timeout;
    if (now >= due) {
      bump(s_->c.timeouts);
      s_->log("closing connection from " + remote() + ": the client read nothing of a response for " +
              millis(st.idle_timeout));
      close();
      return;
    }
    next = std::min(next, due);
  }
  const bool partial = reading_ && in_request_;
  if (partial) {
    const auto due = request_started_ + st.request_read_timeout;
    if (now >= due) {
      timeout_request("the request did not arrive whole within " + millis(st.request_read_timeout));
      return;
    }
    next = std::min(next, due);
  }
  if (reading_ && slots_.empty() && !writing_) {
    const auto due = last_activity_ + st.idle_timeout;
    if (now >= due) {
      if (partial) {
        timeout_request("nothing arrived for " + millis(st.idle_timeout) + " in the middle of a request");
      } else {
        bump(s_->c.timeouts);
        close();
      }
      return;
    }
    next = std::min(next, due);
  }
  arm(next);
}

// Stops the read, then answers 408.
void ServerConnection::timeout_request(std::string why) {
  reading_ = false;
  read_stopped_ = true;
  beast::error_code ignored;
  socket_.tcp().cancel(ignored);
  push_error(408, std::move(why));
}

}  // namespace troupe::http::detail
