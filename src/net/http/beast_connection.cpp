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

// The status a Beast parse error answers, and why.
std::pair<int, std::string> refusal(const beast::error_code& ec) {
  const std::string what = ec.message();
  if (ec == bhttp::error::header_limit) return {431, "header block too large (" + what + ")"};
  if (ec == bhttp::error::body_limit) return {413, "body too large (" + what + ")"};
  // Beast reads any HTTP/d.d (a major other than 1 is answered 505 once the
  // header is in): bad_version is a malformed line, a bare LF included.
  if (ec == bhttp::error::bad_version) return {400, "malformed HTTP version or line end (" + what + ")"};
  if (ec == bhttp::error::bad_transfer_encoding) return {501, "transfer coding not supported (" + what + ")"};
  if (ec == bhttp::error::partial_message) return {400, "the connection ended inside a request"};
  return {400, what};
}

// A request line "METHOD target HTTP/d.d" whose version Beast refused as
// other than 1.x (a malformed line is a 400, this a 505).
bool well_formed_other_version(std::string_view data) {
  const std::size_t eol = data.find("\r\n");
  if (eol == std::string_view::npos || eol < 8) return false;
  const std::string_view v = data.substr(eol - 8, 8);
  return v.substr(0, 5) == "HTTP/" && v[5] >= '0' && v[5] <= '9' && v[6] == '.' && v[7] >= '0' && v[7] <= '9' &&
         v[5] != '1';
}

// The items of a comma-separated header value, blanks trimmed.
std::vector<std::string_view> split_list(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

bool field_ok(std::string_view name, std::string_view value) {
  if (!is_token(name)) return false;
  return value.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

}  // namespace

void ServerConnection::start() {
  beast::error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  last_activity_ = Clock::now();
  arm(last_activity_ + tick());
  read();
}

std::string ServerConnection::remote() const {
  beast::error_code ec;
  const auto ep = socket_.remote_endpoint(ec);
  if (ec) return "a closed connection";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

void ServerConnection::read() {
  if (reading_ || closed_ || read_stopped_) return;
  if (slots_.size() >= s_->settings.max_pipelined) {
    paused_ = true;
    return;
  }
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(s_->settings.max_header_bytes, UINT32_MAX)));
  parser_->body_limit(s_->settings.max_body_bytes);
  reading_ = true;
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           [self = shared_from_this()](const beast::error_code& ec, std::size_t n) {
                             bump(self->s_->c.bytes_received, n);
                             self->last_activity_ = Clock::now();
                             self->on_header(ec);
                           });
}

void ServerConnection::on_header(const beast::error_code& ec) {
  reading_ = false;
  // Closed, lingering, or a read this connection cancelled itself (408).
  if (closed_ || lingering_ || (ec == asio::error::operation_aborted && read_stopped_)) return;
  if (ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof) {
      read_stopped_ = true;
      if (slots_.empty() && !writing_ && out_.empty())
        close();
      else
        close_after_write_ = true;
      return;
    }
    if (ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      close();
      return;
    }
    const auto data = buffer_.cdata();
    const std::string_view seen(static_cast<const char*>(data.data()), data.size());
    if (ec == bhttp::error::bad_version && well_formed_other_version(seen)) {
      push_error(505, "HTTP version is not supported (HTTP/1.1 is)");
      return;
    }
    if (ec == bhttp::error::header_limit) {
      // The request line alone past the limit is a 414, as with the
      // hand-written parser. Beast drops each line from the buffer once it
      // has parsed it, so what is left is the line it stopped in: a
      // request line has no ':' before its first space, a field has.
      const std::size_t space = seen.find(' ');
      if (seen.find("\r\n") == std::string_view::npos && space != std::string_view::npos &&
          seen.substr(0, space).find(':') == std::string_view::npos) {
        push_error(414, "request line longer than " + std::to_string(s_->settings.max_header_bytes) + " bytes");
        return;
      }
    }
    auto [status, why] = refusal(ec);
    push_error(status, std::move(why));
    return;
  }
  const BeastRequest& req = parser_->get();
  if (req.version() != 10 && req.version() != 11) {
    push_error(505, "HTTP version not supported");
    return;
  }
  if (req.version() == 11 && req.count(bhttp::field::host) == 0) {
    push_error(400, "an HTTP/1.1 request without a Host header");
    return;
  }
  if (req.count(bhttp::field::host) > 1) {
    push_error(400, "more than one Host header");
    return;
  }
  std::size_t fields = 0;
  for (auto it = req.begin(); it != req.end(); ++it) ++fields;
  if (fields > kMaxFields) {
    push_error(431, "more than " + std::to_string(kMaxFields) + " header fields");
    return;
  }
  if (req.count(bhttp::field::transfer_encoding) > 0 && req.count(bhttp::field::content_length) > 0) {
    push_error(400, "both Transfer-Encoding and Content-Length");
    return;
  }
  if (req.count(bhttp::field::transfer_encoding) > 0) {
    // Beast decodes chunked and hands any other coding through as it is.
    const auto te = req[bhttp::field::transfer_encoding];
    for (std::string_view coding : split_list(std::string_view(te.data(), te.size())))
      if (!iequals(coding, "chunked")) {
        push_error(501, "transfer coding '" + std::string(coding.substr(0, 32)) + "' is not supported (only chunked is)");
        return;
      }
  }
  if (req.version() == 11 && req.count(bhttp::field::expect) > 0) {
    const auto expect = req[bhttp::field::expect];
    if (!iequals(std::string_view(expect.data(), expect.size()), "100-continue")) {
      push_error(417, "Expect is not supported (only 100-continue is)");
      return;
    }
    if (slots_.empty() && !writing_ && !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      beast::error_code ignored;
      asio::write(socket_, asio::buffer(kContinue), ignored);
    }
  }
  if (parser_->is_done()) {
    on_body({});
    return;
  }
  in_request_ = true;
  request_started_ = last_activity_;
  reading_ = true;
  bhttp::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](const beast::error_code& e, std::size_t n) {
    bump(self->s_->c.bytes_received, n);
    self->last_activity_ = Clock::now();
    self->on_body(e);
  });
}

void ServerConnection::on_body(const beast::error_code& ec) {
  reading_ = false;
  in_request_ = false;
  if (closed_ || lingering_ || (ec == asio::error::operation_aborted && read_stopped_)) return;
  if (ec) {
    if (ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      close();
      return;
    }
    auto [status, why] = refusal(ec);
    push_error(status, std::move(why));
    return;
  }
  dispatch(parser_->release());
  read();
}

void ServerConnection::dispatch(BeastRequest&& breq) {
  Request req;
  req.method.assign(breq.method_string().data(), breq.method_string().size());
  req.target.assign(breq.target().data(), breq.target().size());
  const std::optional<std::string_view> raw_path = target_path(req.target);
  if (!raw_path) {
    push_error(400, "the request target must be a path ('/...') or an absolute http URL");
    return;
  }
  if (!percent_decode(*raw_path, req.path, false)) {
    push_error(400, "malformed percent-encoding in the path (or an encoded NUL)");
    return;
  }
  if (const std::size_t q = req.target.find('?'); q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& f : breq)
    req.headers.emplace_back(std::string(f.name_string().data(), f.name_string().size()),
                             std::string(f.value().data(), f.value().size()));
  req.body = std::move(breq.body());

  Slot slot;
  slot.seq = next_seq_++;
  slot.head = breq.method() == bhttp::verb::head;
  slot.close = !breq.keep_alive() || draining_;
  slot.version = breq.version();
  if (slot.close) read_stopped_ = true;
  const std::uint64_t seq = slot.seq;
  slots_.push_back(std::move(slot));
  bump(s_->c.requests);
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

std::shared_ptr<BeastResponse> ServerConnection::build(Response&& r, const Slot& slot) {
  auto res = std::make_shared<BeastResponse>();
  res->version(slot.version);
  res->result(static_cast<unsigned>(r.status));
  res->reason(beast::string_view(reason_phrase(r.status).data(), reason_phrase(r.status).size()));
  for (const auto& [name, value] : r.headers) {
    if (!field_ok(name, value)) return nullptr;
    res->insert(beast::string_view(name.data(), name.size()), beast::string_view(value.data(), value.size()));
  }
  if (!r.content_type.empty()) {
    if (!field_ok("Content-Type", r.content_type)) return nullptr;
    res->set(bhttp::field::content_type, r.content_type);
  }
  res->set(bhttp::field::date, loop_.date_now());
  res->keep_alive(!slot.close);
  res->body() = std::move(r.body);
  res->prepare_payload();
  if (slot.head) res->body().clear();  // Content-Length stays that of the GET
  return res;
}

bool ServerConnection::complete(std::uint64_t seq, Response&& r) {
  if (closed_ || slots_.empty() || seq < slots_.front().seq) return false;
  const std::uint64_t idx = seq - slots_.front().seq;
  if (idx >= slots_.size()) return false;
  Slot& slot = slots_[static_cast<std::size_t>(idx)];
  if (slot.done) return false;
  slot.done = true;
  if (r.status >= 200 && r.status <= 999) slot.response = build(std::move(r), slot);
  if (!slot.response) {
    s_->log("a handler answered with an invalid status (" + std::to_string(r.status) +
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
  socket_.shutdown(asio::socket_base::shutdown_send, ignored);
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
    socket_.cancel(e);
  }
  (*drain_more)();
}

void ServerConnection::close() {
  if (closed_) return;
  closed_ = true;
  ++timer_gen_;
  timer_.cancel();
  beast::error_code ignored;
  socket_.close(ignored);
  slots_.clear();
  out_.clear();
  s_->c.open.fetch_sub(1, std::memory_order_relaxed);
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
  closed_ = true;
  timer_.cancel();
  beast::error_code ignored;
  socket_.close(ignored);
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
  const bool partial = reading_ && (in_request_ || buffer_.size() > 0 || (parser_ && parser_->got_some()));
  if (partial && in_request_) {
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
  socket_.cancel(ignored);
  push_error(408, std::move(why));
}

}  // namespace troupe::http::detail
