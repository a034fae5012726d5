// device_server: a simulated fleet of devices, as its own process. Each
// device is reached over TCP, as an obniz-like device is reached over its
// cloud connection, and counts the connections it has, so that two workers
// for one device are seen the moment the second one attaches.
//
// The device protocol (lines, '\n'-terminated):
//   worker -> server  HELLO <device> <worker>     worker: who it is, e.g. "node-2/epoch-17"
//   server -> worker  OK                           attached; then, every interval:
//   server -> worker  R <device> <seq> <value>     a reading
//   server -> worker  GONE                         the device is not (or no longer) in the
//                                                  fleet; the server closes the connection
//   worker -> server  BYE                          detach (a worker that stops)
//   server -> worker  BYE                          detached; the server closes the connection
// A worker that stops says BYE and waits for the answer, so its device has
// let it go before its unit is released to the next owner; a killed
// worker's kernel closes its connection at once, which detaches it too. A
// first line that is not a HELLO, or a line over 600 bytes, closes the
// connection; other lines are ignored.
//
// The control API (HTTP):
//   GET  /devices                  the fleet as a desired set (placement_source.hpp's format)
//   POST /devices/add?count=N      N new devices (1..100000)      {"added":[...],"devices":n}
//   POST /devices/remove?count=N   the N lowest ids leave; their workers get GONE
//   GET  /stats                    fleet.hpp's stats and `readings`
//   POST /stats/mark               gaps and waits counted afresh from now
//   GET  /health
//
// On start it prints "device_server: devices on tcp://HOST:PORT, control on
// http://HOST:PORT, N devices"; SIGINT or SIGTERM stop it (exit 0), printing
// the stats.

#include "../../src/cluster/asio_headers.hpp"  // first: see there

#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fleet.hpp"
#include "troupe/net/http.hpp"

namespace {

using asio::ip::tcp;
using devices::Fleet;
using devices::Steady;
using json = nlohmann::json;

struct Options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::uint16_t http_port = 0;
  std::size_t devices = 2000;
  unsigned interval_ms = 500;
};

// Owns the TCP side: the acceptor, every device connection and the
// reading timer, all on one io thread. Other threads reach it through
// post().
class DeviceServer {
 public:
  DeviceServer(Fleet& fleet, const Options& o)
      : fleet_(fleet), acceptor_(io_), tick_(io_), interval_(o.interval_ms) {
    tcp::endpoint ep(asio::ip::make_address(o.host), o.port);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
  }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::uint64_t readings() const { return readings_.load(std::memory_order_relaxed); }

  void run() {
    accept();
    schedule_tick();
    thread_ = std::thread([this] { io_.run(); });
  }
  void stop() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  // The devices left the fleet: their workers are told and disconnected.
  void evict(std::vector<std::string> ids) {
    asio::post(io_, [this, ids = std::move(ids)] {
      for (const auto& id : ids) {
        auto it = by_device_.find(id);
        if (it == by_device_.end()) continue;
        for (const auto& c : std::vector<std::shared_ptr<Conn>>(it->second.begin(), it->second.end())) {
          c->closing = true;
          send(c, "GONE\n");
        }
      }
    });
  }

 private:
  struct Conn {
    explicit Conn(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    std::string in;
    std::string device, worker;
    bool attached = false;
    bool closing = false;  // close once what is queued is written
    bool closed = false;
    std::deque<std::string> out;
    std::uint64_t seq = 0;
  };

  void accept() {
    auto c = std::make_shared<Conn>(io_);
    acceptor_.async_accept(c->socket, [this, c](std::error_code ec) {
      if (ec) {
        if (ec != asio::error::operation_aborted) accept();
        return;
      }
      asio::error_code ignored;
      c->socket.set_option(tcp::no_delay(true), ignored);
      read_hello(c);
      accept();
    });
  }

  void read_hello(const std::shared_ptr<Conn>& c) {
    asio::async_read_until(c->socket, asio::dynamic_buffer(c->in, 600), '\n',
                           [this, c](std::error_code ec, std::size_t n) {
                             if (ec) return close(c);
                             std::string line = c->in.substr(0, n - 1);
                             c->in.erase(0, n);
                             if (!line.empty() && line.back() == '\r') line.pop_back();
                             hello(c, line);
                           });
  }

  void hello(const std::shared_ptr<Conn>& c, const std::string& line) {
    // HELLO <device> <worker>
    auto a = line.find(' ');
    auto b = a == std::string::npos ? a : line.find(' ', a + 1);
    if (line.compare(0, a, "HELLO") != 0 || b == std::string::npos || b == a + 1 || b + 1 >= line.size())
      return close(c);
    c->device = line.substr(a + 1, b - a - 1);
    c->worker = line.substr(b + 1);
    if (!fleet_.attach(c->device, c->worker, Steady::now())) {
      c->closing = true;
      return send(c, "GONE\n");
    }
    c->attached = true;
    by_device_[c->device].insert(c);
    send(c, "OK\n");
    watch(c);
  }

  // Reads the worker's lines until it says BYE or closes.
  void watch(const std::shared_ptr<Conn>& c) {
    asio::async_read_until(c->socket, asio::dynamic_buffer(c->in, 600), '\n',
                           [this, c](std::error_code ec, std::size_t n) {
                             if (ec) return close(c);
                             const std::string line = c->in.substr(0, n);
                             c->in.erase(0, n);
                             if (line != "BYE\n" && line != "BYE\r\n") return watch(c);
                             detach(c);
                             c->closing = true;
                             send(c, "BYE\n");
                           });
  }

  void detach(const std::shared_ptr<Conn>& c) {
    if (!c->attached) return;
    c->attached = false;
    fleet_.detach(c->device, c->worker, Steady::now());
    auto it = by_device_.find(c->device);
    if (it == by_device_.end()) return;
    it->second.erase(c);
    if (it->second.empty()) by_device_.erase(it);
  }

  void send(const std::shared_ptr<Conn>& c, std::string line) {
    if (c->closed) return;
    c->out.push_back(std::move(line));
    if (c->out.size() == 1) write_next(c);
  }

  void write_next(const std::shared_ptr<Conn>& c) {
    asio::async_write(c->socket, asio::buffer(c->out.front()), [this, c](std::error_code ec, std::size_t) {
      if (ec) return close(c);
      c->out.pop_front();
      if (!c->out.empty()) return write_next(c);
      if (c->closing) close(c);
    });
  }

  void close(const std::shared_ptr<Conn>& c) {
    if (c->closed) return;
    c->closed = true;
    detach(c);
    asio::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
  }

  void schedule_tick() {
    tick_.expires_after(interval_);
    tick_.async_wait([this](std::error_code ec) {
      if (ec) return;
      for (auto& [id, conns] : by_device_) {
        for (const auto& c : conns) {
          // A worker that does not keep up skips readings rather than
          // making the server buffer them.
          if (c->closing || !c->out.empty()) continue;
          ++c->seq;
          send(c, "R " + id + " " + std::to_string(c->seq) + " " + std::to_string((c->seq * 37) % 1000) + "\n");
          readings_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      schedule_tick();
    });
  }

  Fleet& fleet_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  asio::steady_timer tick_;
  std::chrono::milliseconds interval_;
  std::map<std::string, std::set<std::shared_ptr<Conn>>> by_device_;
  std::atomic<std::uint64_t> readings_{0};
  std::thread thread_;
};

troupe::http::Router control_routes(Fleet& fleet, DeviceServer& server) {
  using troupe::http::Request;
  using troupe::http::Responder;
  using troupe::http::Response;
  troupe::http::Router r;
  auto count_of = [](const Request& req) -> std::optional<std::size_t> {
    auto v = req.query_param("count");
    if (!v || v->empty() || v->size() > 6 || v->find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    std::size_t n = std::stoul(*v);
    if (n == 0 || n > 100'000) return std::nullopt;
    return n;
  };
  r.add("GET", "/devices", [&fleet](Request&, Responder out) {
    Response resp = Response::text(200, fleet.desired_set());
    out.respond(std::move(resp));
  });
  r.add("POST", "/devices/add", [&fleet, count_of](Request& req, Responder out) {
    auto n = count_of(req);
    if (!n) return out.respond(Response::error(400, "invalid_argument", "count: an integer from 1 to 100000"));
    auto ids = fleet.add(*n, Steady::now());
    out.respond(Response::json(200, json{{"added", ids}, {"devices", fleet.stats(Steady::now())["devices"]}}.dump()));
  });
  r.add("POST", "/devices/remove", [&fleet, &server, count_of](Request& req, Responder out) {
    auto n = count_of(req);
    if (!n) return out.respond(Response::error(400, "invalid_argument", "count: an integer from 1 to 100000"));
    auto ids = fleet.remove(*n, Steady::now());
    server.evict(ids);
    out.respond(Response::json(200, json{{"removed", ids}, {"devices", fleet.stats(Steady::now())["devices"]}}.dump()));
  });
  r.add("GET", "/stats", [&fleet, &server](Request&, Responder out) {
    json s = fleet.stats(Steady::now());
    s["readings"] = server.readings();
    out.respond(Response::json(200, s.dump()));
  });
  r.add("POST", "/stats/mark", [&fleet](Request&, Responder out) {
    fleet.mark(Steady::now());
    out.respond(Response::json(200, R"({"marked":true})"));
  });
  r.add("GET", "/health", [](Request&, Responder out) { out.respond(Response::json(200, R"({"status":"ok"})")); });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"A simulated device fleet for the troupe devices example: devices over TCP, control over HTTP."};
  app.add_option("--host", o.host, "Address to listen on (both ports)")->capture_default_str();
  app.add_option("--port", o.port, "Devices' TCP port (0: any free port, printed)")->capture_default_str();
  app.add_option("--http-port", o.http_port, "Control HTTP port (0: any free port, printed)")->capture_default_str();
  app.add_option("--devices", o.devices, "Devices in the fleet at start")
      ->check(CLI::Range(0, 1'000'000))
      ->capture_default_str();
  app.add_option("--interval-ms", o.interval_ms, "Milliseconds between a device's readings")
      ->check(CLI::Range(10, 60'000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Fleet fleet(o.devices, std::chrono::milliseconds(o.interval_ms), Steady::now());
  std::unique_ptr<DeviceServer> devices;
  try {
    devices = std::make_unique<DeviceServer>(fleet, o);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "device_server: cannot listen on %s:%u: %s\n", o.host.c_str(), static_cast<unsigned>(o.port),
                 e.what());
    return 1;
  }
  troupe::http::ServerSettings hs;
  hs.host = o.host;
  hs.port = o.http_port;
  hs.io_threads = 1;
  hs.log = [](std::string_view line) {
    std::fprintf(stderr, "device_server: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  auto control = troupe::http::Server::start(hs, control_routes(fleet, *devices));
  if (!control.ok()) {
    std::fprintf(stderr, "device_server: %s\n", control.error().to_string().c_str());
    return 1;
  }
  devices->run();
  std::printf("device_server: devices on tcp://%s:%u, control on http://%s:%u, %zu devices\n", o.host.c_str(),
              static_cast<unsigned>(devices->port()), o.host.c_str(), static_cast<unsigned>((*control)->port()),
              o.devices);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  (*control)->stop();
  devices->stop();
  json s = fleet.stats(Steady::now());
  s["readings"] = devices->readings();
  std::fprintf(stderr, "device_server: %s, stopping; %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM", s.dump().c_str());
  return 0;
}
