// payment_service: the payment service (service.hpp) on a troupe node.
//
//   payment_service --config examples/payment/config/single.toml
//
// Reads the node's TOML config (with its [payment] table), starts the node
// (journal, cluster if configured, admin API and dashboard) and the payment
// API, prints where they listen, and runs until SIGINT or SIGTERM (or a
// POST /drain on the admin API), then drains: settlements in progress
// finish (E6) before the process exits. A bad config or an unreachable
// journal or Redis exits with status 1 and one line naming the setting.

#include <CLI/CLI.hpp>

#include <cstdio>

#include "service.hpp"

int main(int argc, char** argv) {
  CLI::App app{"The troupe payment service: payments settled through a gateway, on a troupe node."};
  std::string config_path;
  app.add_option("--config", config_path, "the node's TOML config file (with a [payment] table)")->required();
  CLI11_PARSE(app, argc, argv);
  troupe::node::Node::block_stop_signals();  // before any thread starts

  auto config = troupe::node::NodeConfig::load(config_path, {"payment"});
  if (!config.ok()) {
    std::fprintf(stderr, "payment_service: %s\n", config.error().message().c_str());
    return 1;
  }
  auto settings = payment::ServiceSettings::from(*config);
  if (!settings.ok()) {
    std::fprintf(stderr, "payment_service: %s: %s\n", config_path.c_str(), settings.error().message().c_str());
    return 1;
  }
  auto node = troupe::node::Node::start(*config);
  if (!node.ok()) {
    std::fprintf(stderr, "payment_service: %s: %s\n", config_path.c_str(), node.error().message().c_str());
    return 1;
  }
  auto service = payment::PaymentService::start(**node, *settings);
  if (!service.ok()) {
    std::fprintf(stderr, "payment_service: %s: %s\n", config_path.c_str(), service.error().message().c_str());
    return 1;
  }
  (*node)->mark_ready();
  std::printf("payment_service %s: payments on http://%s:%u, dashboard on %s://%s:%u/\n",
              config->id.c_str(), settings->host.c_str(), static_cast<unsigned>((*service)->port()),
              config->admin.tls() ? "https" : "http", config->admin.host.c_str(),
              static_cast<unsigned>((*node)->admin_port()));
  std::fflush(stdout);
  (*node)->wait_for_stop_signal();
  (*service)->stop();
  std::printf("payment_service %s: stopped\n", config->id.c_str());
  return 0;
}
