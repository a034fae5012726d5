// devices_node: a troupe node that runs one worker per device of the
// simulated fleet (device_server), for the node's [[workers]] groups of
// type "device".
//
//   devices_node --config node.toml
//
// The config is a node's TOML (doc/node.md) with the worker group and a
// [devices] table naming the device server:
//
//   [node]
//   roles = ["manager", "devices"]
//   [cluster]
//   redis = "127.0.0.1:6379"
//   insecure = true               # or [cluster.tls] (doc/node.md)
//   [[workers]]
//   group = "devices"
//   type = "device"
//   source = "http://127.0.0.1:8300/devices"
//   roles = ["devices"]
//   [devices]
//   server = "127.0.0.1:8200"     # the devices' TCP address
//
// Each worker attaches to its device as "<node>/<epoch>" and counts its
// readings; told to stop, it says BYE and stops once the device has let it
// go, so the unit is released only then. A device that left the fleet
// (GONE) leaves its worker idle until the unit is removed. A connection
// that fails is tried again after a second.
//
// Runs until SIGINT or SIGTERM (or POST /drain), then drains: its units are
// handed to the other members first. A bad config exits 1 with one line.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <variant>

#include "device_link.hpp"
#include "troupe/node/node.hpp"
#include "troupe/node/workers.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;
using troupe::node::WorkerSpecChanged;
using troupe::node::WorkerStart;
using troupe::node::WorkerStop;

struct DeviceSpec {
  std::string model;
  int interval_ms = 500;
};

Result<DeviceSpec> decode_spec(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_string())
    return Error(ErrorCode::invalid_argument, "a device spec is {\"model\":\"...\",\"interval_ms\":N}");
  DeviceSpec s;
  s.model = j["model"].get<std::string>();
  if (j.contains("interval_ms")) {
    if (!j["interval_ms"].is_number_integer() || j["interval_ms"].get<int>() <= 0)
      return Error(ErrorCode::invalid_argument, "interval_ms: a positive integer");
    s.interval_ms = j["interval_ms"].get<int>();
  }
  return s;
}

struct Link {
  devices::LinkEvent event;
  std::uint64_t generation;
};
struct Retry {
  std::uint64_t generation;
};
using DeviceMsg = std::variant<WorkerSpecChanged<DeviceSpec>, WorkerStop, Link, Retry>;

// One device's worker: owns its link to the device. Runs on the node's
// actor system; one message at a time.
class DeviceWorker final : public troupe::Actor<DeviceMsg> {
 public:
  DeviceWorker(WorkerStart<DeviceSpec> start, devices::Links* links, std::string node)
      : unit_(std::move(start.unit)), spec_(std::move(start.spec)),
        name_(std::move(node) + "/" + std::to_string(start.epoch)), links_(links) {}

  void on_start() { open(); }
  // Stopped without its BYE answered (the node stopped it past the stop
  // timeout, or it failed): the connection closes now, which detaches it.
  void on_stop() {
    if (link_) link_->close();
  }

  void receive(DeviceMsg& m) {
    std::visit(troupe::overloaded{
                   [&](WorkerSpecChanged<DeviceSpec>& c) { spec_ = std::move(c.spec); },
                   [&](WorkerStop&) {
                     stopping_ = true;
                     if (!link_) return stop();
                     link_->bye();  // stops on `closed`
                   },
                   [&](Link& l) {
                     if (l.generation != generation_) return;
                     if (l.event == devices::LinkEvent::gone) gone_ = true;
                     if (l.event != devices::LinkEvent::closed) return;
                     link_.reset();
                     if (stopping_) return stop();
                     if (!gone_) start_timer("retry", 1s, Retry{generation_});
                   },
                   [&](Retry& r) {
                     if (r.generation == generation_ && !link_ && !stopping_) open();
                   }},
               m);
  }

 private:
  void open() {
    const std::uint64_t gen = ++generation_;
    link_ = links_->open(unit_, name_, [self = self(), gen](devices::LinkEvent e) {
      // Not delivered: the worker has stopped, and on_stop closed the link.
      if (self.tell(Link{e, gen}) != troupe::Delivery::delivered) return;
    });
  }

  std::string unit_;
  DeviceSpec spec_;
  std::string name_;
  devices::Links* links_;
  std::shared_ptr<devices::DeviceLink> link_;
  std::uint64_t generation_ = 0;
  bool stopping_ = false, gone_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A troupe node running one worker per device of the simulated fleet."};
  std::string config_path;
  app.add_option("--config", config_path, "the node's TOML config file (with a [devices] table)")->required();
  CLI11_PARSE(app, argc, argv);
  troupe::node::Node::block_stop_signals();  // before any thread starts

  auto config = troupe::node::NodeConfig::load(config_path, {"devices"});
  if (!config.ok()) {
    std::fprintf(stderr, "devices_node: %s\n", config.error().message().c_str());
    return 1;
  }
  troupe::node::ConfigReader r(config->app_table("devices"), "devices");
  auto server = r.string("server", "127.0.0.1:8200");
  if (server.ok()) {
    if (auto done = r.finish(); !done.ok()) server = std::move(done).error();
  }
  std::string host;
  unsigned long port = 0;
  if (server.ok()) {
    auto colon = server->rfind(':');
    if (colon != std::string::npos) {
      host = server->substr(0, colon);
      port = std::strtoul(server->c_str() + colon + 1, nullptr, 10);
    }
    if (host.empty() || port == 0 || port > 65535)
      server = Error(ErrorCode::invalid_argument, "devices.server: \"HOST:PORT\" with an IP address, not '" + *server + "'");
  }
  if (!server.ok()) {
    std::fprintf(stderr, "devices_node: %s: %s\n", config_path.c_str(), server.error().message().c_str());
    return 1;
  }
  std::unique_ptr<devices::Links> links;
  try {
    links = std::make_unique<devices::Links>(host, static_cast<std::uint16_t>(port));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "devices_node: %s: devices.server: %s\n", config_path.c_str(), e.what());
    return 1;
  }

  troupe::node::WorkerTypes types;
  if (auto added = types.add<DeviceWorker, DeviceSpec>("device", decode_spec, links.get(), config->id); !added.ok()) {
    std::fprintf(stderr, "devices_node: %s\n", added.error().message().c_str());
    return 1;
  }
  auto node = troupe::node::Node::start(*config, std::move(types));
  if (!node.ok()) {
    std::fprintf(stderr, "devices_node: %s: %s\n", config_path.c_str(), node.error().message().c_str());
    return 1;
  }
  (*node)->mark_ready();
  std::printf("devices_node %s: dashboard on http://%s:%u/\n", config->id.c_str(), config->admin.host.c_str(),
              static_cast<unsigned>((*node)->admin_port()));
  std::fflush(stdout);
  (*node)->wait_for_stop_signal();
  std::printf("devices_node %s: stopped; %llu readings\n", config->id.c_str(),
              static_cast<unsigned long long>(links->readings()));
  return 0;
}
