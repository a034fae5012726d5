// The process manager (SPEC P2) when the process its work depends on dies:
// each managed process here asks a gateway actor in a crash_test_node
// process over remoting, which holds every request; that process is killed
// with SIGKILL while the manager's slots are full and more requests wait.
// Every process must end with an explicit error, every slot must be free
// again, and new requests must run.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "crash_test_protocol.hpp"
#include "node_process.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/patterns/process_manager.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using namespace troupe::cluster::crash;
using Steady = std::chrono::steady_clock;

// How long a process's ask waits for the gateway: far beyond every bound
// below, so an answer within them is the crash's, not this timeout's.
constexpr auto kAskTimeout = 60s;

struct Nothing {};

// A process that charges through the gateway and finishes with its answer,
// or fails with the ask's error.
struct ChargeThroughGateway : Actor<Nothing> {
  using result_type = std::string;
  ChargeThroughGateway(ProcessHandle<std::string> h, RemoteRef<GatewayMsg> g, std::int64_t a)
      : done(std::move(h)), gateway(std::move(g)), amount(a) {}
  void on_start() {
    gateway.ask<std::string>([a = amount](ReplyTo<std::string> r) { return Charge{a, std::move(r)}; }, kAskTimeout)
        .then([h = done](Result<std::string> r) {
          if (r.ok()) {
            h.complete(std::move(r.value()));
          } else {
            h.fail(std::move(r).error());
          }
        });
  }
  void receive(Nothing&) {}
  ProcessHandle<std::string> done;
  RemoteRef<GatewayMsg> gateway;
  std::int64_t amount;
};

class ProcessManagerCrash : public ::testing::Test {
 protected:
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<Remoting> remoting;
  std::shared_ptr<const MessageCodecs<GatewayMsg>> codecs =
      std::make_shared<const MessageCodecs<GatewayMsg>>(gateway_codecs());
  std::vector<std::unique_ptr<proc::NodeProcess>> gateways;

  void SetUp() override {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_dead_letters = false;
    cfg.log_failures = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    Remoting::Settings rs;
    rs.security.insecure = true;
    // The node with the smaller id dials: this one ("client" < "gw…").
    rs.node_id = "client";
    auto r = Remoting::start(*system, rs);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    remoting = std::move(r.value());
  }
  void TearDown() override {
    gateways.clear();
    remoting->stop();
    system->shutdown();
  }

  RemoteRef<GatewayMsg> start_gateway(const std::string& id, bool hold) {
    std::vector<std::string> args = {"--role", "gateway"};
    if (hold) args.push_back("--hold");
    gateways.push_back(std::make_unique<proc::NodeProcess>(kCrashTestNode, id, args));
    remoting->set_peer(id, "127.0.0.1", gateways.back()->port());
    return remoting->remote<GatewayMsg>(id, kGateway, codecs);
  }
  static std::int64_t held_at(const RemoteRef<GatewayMsg>& g) {
    auto r = g.ask<std::int64_t>([](ReplyTo<std::int64_t> rt) { return HeldCharges{std::move(rt)}; }, 10s).get();
    if (!r.ok()) ADD_FAILURE() << "the gateway's count: " << r.error().to_string();
    return r.ok() ? r.value() : -1;
  }
};

// proves: P2
TEST_F(ProcessManagerCrash, ProcessesInFlightWhenTheirPeerIsKilledAllEndAndFreeTheirSlots) {
  constexpr std::size_t kRunning = 8, kBuffered = 4;
  auto pm = ProcessManager<ChargeThroughGateway>::start(*system, {.name = "charges", .max_running = kRunning, .buffer = 16});
  ASSERT_TRUE(pm.ok()) << pm.error().to_string();
  auto doomed = start_gateway("gw1", true);

  std::vector<Future<std::string>> first;
  for (std::size_t i = 0; i < kRunning + kBuffered; ++i) first.push_back(pm->submit(doomed, static_cast<std::int64_t>(i)));
  // Every slot's ask has reached the gateway, which holds it; the rest wait.
  auto until = Steady::now() + 10s + kSlowBuildSlack;
  while (held_at(doomed) < static_cast<std::int64_t>(kRunning)) {
    ASSERT_LT(Steady::now(), until) << "the gateway never held " << kRunning << " charges: " << held_at(doomed)
                                    << "; running " << pm->stats().running;
    std::this_thread::sleep_for(5ms);
  }
  auto before = pm->stats();
  ASSERT_EQ(before.running, kRunning);
  ASSERT_EQ(before.buffered, kBuffered);

  gateways.front()->kill9();
  auto killed_at = Steady::now();

  // The processes in flight end with an explicit error as the connection
  // drops, long before their asks would time out.
  auto ended = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
      ASSERT_TRUE(first[i].wait_for(10s + kSlowBuildSlack)) << "process " << i << " hung after its peer died";
      auto r = first[i].get();
      ASSERT_FALSE(r.ok()) << "answered " << r.value();
      EXPECT_EQ(r.error().code(), ErrorCode::unreachable) << r.error().to_string();
    }
  };
  ended(0, kRunning);
  if (HasFatalFailure()) return;
  // The buffered ones took the freed slots and asked the dead node, whose
  // address is still known: they wait for it until the node is declared
  // gone, as membership does after its liveness threshold. Then they end too.
  remoting->remove_peer("gw1");
  ended(kRunning, kRunning + kBuffered);
  if (HasFatalFailure()) return;
  EXPECT_LT(Steady::now() - killed_at, 10s + kSlowBuildSlack);
  until = Steady::now() + 5s + kSlowBuildSlack;
  while (pm->stats().outstanding != 0 && Steady::now() < until) std::this_thread::sleep_for(5ms);
  auto after = pm->stats();
  EXPECT_EQ(after.running, 0u);
  EXPECT_EQ(after.buffered, 0u);
  EXPECT_EQ(after.outstanding, 0u);
  EXPECT_EQ(after.failed, kRunning + kBuffered);
  EXPECT_EQ(after.completed, 0u);

  // Every slot is free: more requests than max_running run to completion
  // through another gateway.
  auto next = start_gateway("gw2", false);
  std::vector<Future<std::string>> second;
  for (std::size_t i = 0; i < 2 * kRunning; ++i) second.push_back(pm->submit(next, static_cast<std::int64_t>(100 + i)));
  for (std::size_t i = 0; i < second.size(); ++i) {
    ASSERT_TRUE(second[i].wait_for(10s + kSlowBuildSlack));
    auto r = second[i].get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r.value(), "gw2 charged " + std::to_string(100 + i));
  }
  auto last = pm->stats();
  EXPECT_EQ(last.completed, 2 * kRunning);
  EXPECT_EQ(last.running, 0u);
  EXPECT_LE(last.peak_running, kRunning);
}

}  // namespace
}  // namespace troupe::cluster
