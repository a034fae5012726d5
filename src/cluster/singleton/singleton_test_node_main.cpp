// The node process of the singleton kill tests (singleton_process.test.cpp):
//
//   singleton_test_node --id n1 --redis-port P --log FILE
//                       [--heartbeat-ms 100] [--threshold-ms 600] [--margin-ms 200]
//
// Joins the cluster and starts the singleton "beacon", whose instance
// appends start, alive (every 10 ms) and stop lines to FILE
// (singleton_log.hpp). Prints "READY <port>" once started; SIGTERM leaves
// the cluster gracefully (exit 0); SIGKILL is what the tests mostly send.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "singleton_log.hpp"
#include "troupe/cluster/singleton.hpp"
#include "troupe/core.hpp"

namespace {

using namespace troupe;
using namespace troupe::cluster;

std::string arg(int argc, char** argv, const char* name, const char* fallback = nullptr) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  if (!fallback) {
    std::fprintf(stderr, "singleton_test_node: missing %s\n", name);
    std::exit(2);
  }
  return fallback;
}
std::chrono::milliseconds ms(int argc, char** argv, const char* name, const char* fallback) {
  return std::chrono::milliseconds(std::atoi(arg(argc, argv, name, fallback).c_str()));
}

struct Beat {};

// The singleton: its lines in the shared log are the evidence the checker reads.
class Beacon final : public Actor<Beat> {
 public:
  Beacon(SingletonStart s, int fd) : s_(std::move(s)), fd_(fd) {}
  void on_start() {
    singleton_test::append_line(fd_, "start", s_.node, s_.epoch);
    (void)start_periodic_timer("beat", std::chrono::milliseconds(10), Beat{});
  }
  void receive(Beat&) { singleton_test::append_line(fd_, "alive", s_.node, s_.epoch); }
  // Stopping takes a while (it finishes its work): the next instance must
  // wait for the stop line, not only for the request to stop.
  void on_stop() {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    singleton_test::append_line(fd_, "stop", s_.node, s_.epoch);
  }

 private:
  SingletonStart s_;
  int fd_;
};

MessageCodecs<Beat> beat_codecs() {
  MessageCodecs<Beat> c;
  (void)c.add<Beat>("test.Beat", [](const Beat&, ByteWriter&) {},
                    [](ByteReader& r) -> Result<Beat> { return r.finish(Beat{}); });
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);  // before any thread starts

  std::string id = arg(argc, argv, "--id");
  int fd = ::open(arg(argc, argv, "--log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror("singleton_test_node: --log");
    return 2;
  }
  SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  auto system = std::make_unique<ActorSystem>(std::move(cfg));
  ClusterSettings cs;
  cs.security.insecure = true;
  cs.node_id = id;
  cs.coordination.redis_port = static_cast<std::uint16_t>(std::atoi(arg(argc, argv, "--redis-port").c_str()));
  cs.coordination.key_prefix = "singleton-kill";
  cs.coordination.heartbeat_interval = ms(argc, argv, "--heartbeat-ms", "100");
  cs.coordination.liveness_threshold = ms(argc, argv, "--threshold-ms", "600");
  cs.coordination.takeover_margin = ms(argc, argv, "--margin-ms", "200");
  cs.coordination.sync_interval = std::chrono::milliseconds(500);
  cs.coordination.command_timeout = std::chrono::milliseconds(500);
  auto cluster = Cluster::start(*system, cs);
  if (!cluster.ok()) {
    std::fprintf(stderr, "singleton_test_node %s: %s\n", id.c_str(), cluster.error().to_string().c_str());
    return 1;
  }
  auto s = start_singleton<Beacon>(*system, *cluster.value(), {.name = "beacon"}, beat_codecs(), fd);
  if (!s.ok()) {
    std::fprintf(stderr, "singleton_test_node %s: %s\n", id.c_str(), s.error().to_string().c_str());
    return 1;
  }
  std::printf("READY %u\n", static_cast<unsigned>(cluster.value()->remoting().port()));
  std::fflush(stdout);

  int sig = 0;
  sigwait(&term, &sig);
  auto left = cluster.value()->leave(std::chrono::seconds(10));
  s.value().stop();
  cluster.value().reset();
  system->shutdown();
  ::close(fd);
  return left.ok() ? 0 : 1;
}
