// Device connections on one Asio io thread (device_link.hpp).

#include "../../src/cluster/asio_headers.hpp"  // first: see there

#include "device_link.hpp"

#include <deque>
#include <thread>

namespace devices {

using asio::ip::tcp;

namespace {

class Link final : public DeviceLink, public std::enable_shared_from_this<Link> {
 public:
  Link(asio::io_context& io, std::string device, std::string worker, std::function<void(LinkEvent)> on_event,
       std::atomic<std::uint64_t>& readings)
      : io_(io),
        socket_(io),
        device_(std::move(device)),
        worker_(std::move(worker)),
        on_event_(std::move(on_event)),
        readings_(readings) {}

  void connect(const tcp::endpoint& ep) {
    socket_.async_connect(ep, [self = shared_from_this()](std::error_code ec) {
      if (ec || self->done_) return self->finish();
      asio::error_code ignored;
      self->socket_.set_option(tcp::no_delay(true), ignored);
      self->connected_ = true;
      self->send("HELLO " + self->device_ + " " + self->worker_ + "\n");
      if (self->bye_wanted_) self->send("BYE\n");
      self->read();
    });
  }

  void bye() override {
    asio::post(io_, [self = shared_from_this()] {
      if (self->done_ || self->bye_wanted_) return;
      self->bye_wanted_ = true;
      // Not connected yet: the HELLO and the BYE go out together, so the
      // device never counts a worker it was not told had left.
      if (self->connected_) self->send("BYE\n");
    });
  }

  void close() override {
    asio::post(io_, [self = shared_from_this()] { self->finish(); });
  }

 private:
  void read() {
    asio::async_read_until(socket_, asio::dynamic_buffer(in_, 4096), '\n',
                           [self = shared_from_this()](std::error_code ec, std::size_t n) {
                             if (ec) return self->finish();
                             std::string line = self->in_.substr(0, n - 1);
                             self->in_.erase(0, n);
                             if (line.starts_with("R ")) {
                               self->readings_.fetch_add(1, std::memory_order_relaxed);
                             } else if (line == "OK") {
                               self->on_event_(LinkEvent::attached);
                             } else if (line == "GONE") {
                               self->on_event_(LinkEvent::gone);
                               return self->finish();
                             } else if (line == "BYE") {
                               return self->finish();
                             }
                             self->read();
                           });
  }

  void send(std::string line) {
    out_.push_back(std::move(line));
    if (out_.size() == 1) write_next();
  }

  void write_next() {
    asio::async_write(socket_, asio::buffer(out_.front()), [self = shared_from_this()](std::error_code ec, std::size_t) {
      if (ec) return self->finish();
      self->out_.pop_front();
      if (!self->out_.empty()) self->write_next();
    });
  }

  // Once: closes the socket and tells the worker.
  void finish() {
    if (done_) return;
    done_ = true;
    asio::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    on_event_(LinkEvent::closed);
  }

  asio::io_context& io_;
  tcp::socket socket_;
  std::string device_, worker_;
  std::function<void(LinkEvent)> on_event_;
  std::atomic<std::uint64_t>& readings_;
  std::string in_;
  std::deque<std::string> out_;
  bool connected_ = false, bye_wanted_ = false, done_ = false;
};

}  // namespace

struct Links::Impl {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  tcp::endpoint server;
  std::thread thread;
};

Links::Links(std::string host, std::uint16_t port) : impl_(std::make_unique<Impl>()) {
  impl_->server = tcp::endpoint(asio::ip::make_address(host), port);
  impl_->thread = std::thread([io = &impl_->io] { io->run(); });
}

Links::~Links() {
  impl_->work.reset();
  impl_->io.stop();
  impl_->thread.join();
}

std::shared_ptr<DeviceLink> Links::open(std::string device, std::string worker,
                                        std::function<void(LinkEvent)> on_event) {
  auto link = std::make_shared<Link>(impl_->io, std::move(device), std::move(worker), std::move(on_event), readings_);
  asio::post(impl_->io, [link, ep = impl_->server] { link->connect(ep); });
  return link;
}

}  // namespace devices
