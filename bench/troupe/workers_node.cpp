// One node process of the workers_* rows (bench/troupe/workers.cpp): a
// Coordinator serving the group "devices" on the redis-server bench/run
// starts, whose Reconciler reports every start and stop to the bench process
// over a pipe, and which runs the bench process's commands (sync, rebalance,
// count) read from its stdin.
//
//   bench_troupe workers_node <node id> <units file> <event fd>
//
// Lines it writes to <event fd> (timestamps are steady_clock nanoseconds,
// CLOCK_MONOTONIC, which every process on the machine shares):
//   ready                          started: registered in Redis
//   start <unit> <epoch> <ns>      Reconciler::start ran
//   stop <unit> <ns>               Reconciler::stop completed (the unit is
//                                  stopped; the coordinator releases it after)
//   synced <desired> <assigned>    the first round of sync() (command "sync")
//   move <unit> <from> <to>        one move of a rebalance (command "rebalance")
//   rebalanced <moves> <left> <ns> the rebalance ran, called at <ns>
//   count <n>                      Coordinator::running("devices").size()
//   error <message>                then it exits with status 1
// Commands on stdin, one a line: "sync <members>" and "rebalance <members>"
// (each waits until this node sees that many live members first), "count".
// It exits when its stdin closes; it dies with the bench process
// (PR_SET_PDEATHSIG, set by the parent's fork).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "troupe/cluster/coordinator.hpp"
#include "troupe/cluster/placement_source.hpp"
#include "workers_settings.hpp"

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;
using troupe::cluster::Coordinator;
using troupe::cluster::CoordinatorLogLevel;

// Lines to the bench process. The Reconciler runs on the coordinator
// thread, which must not block: lines are appended to a buffer here and a
// thread of its own writes them to the pipe.
class EventPipe {
 public:
  explicit EventPipe(int fd) : fd_(fd), writer_([this] { run(); }) {}
  EventPipe(const EventPipe&) = delete;
  EventPipe& operator=(const EventPipe&) = delete;
  ~EventPipe() {
    {
      std::lock_guard lk(mu_);
      closing_ = true;
    }
    cv_.notify_one();
    writer_.join();
  }

  void line(const std::string& text) {
    {
      std::lock_guard lk(mu_);
      buffer_ += text;
      buffer_ += '\n';
    }
    cv_.notify_one();
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return closing_ || !buffer_.empty(); });
      if (buffer_.empty()) return;
      std::string out;
      out.swap(buffer_);
      lk.unlock();
      std::size_t done = 0;
      while (done < out.size()) {
        const ssize_t n = ::write(fd_, out.data() + done, out.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) std::_Exit(1);  // the bench process is gone
        done += static_cast<std::size_t>(n);
      }
      lk.lock();
    }
  }

  int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buffer_;
  bool closing_ = false;
  std::thread writer_;
};

std::string now_text() { return std::to_string(workers::now_ns()); }

}  // namespace

int workers_node(const std::string& node_id, const std::string& units_file, const char* fd_arg) {
  const int fd = std::atoi(fd_arg);
  if (fd <= 2) return 2;
  auto events = std::make_unique<EventPipe>(fd);
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_troupe: workers_node %s: %s\n", node_id.c_str(), what.c_str());
    events->line("error " + what);
    events.reset();  // flushes
    std::_Exit(1);
  };
  const char* port_text = std::getenv("TROUPE_BENCH_REDIS_PORT");
  const long port = port_text ? std::atol(port_text) : 0;
  if (port <= 0 || port > 65535) fail("TROUPE_BENCH_REDIS_PORT is not set (bench/run sets it)");

  troupe::cluster::CoordinatorSettings s = workers::settings();
  s.node_id = node_id;
  s.redis_port = static_cast<std::uint16_t>(port);
  // Nothing listens there: these nodes have no transport, the address is
  // only stored with the membership.
  s.address = {"127.0.0.1", static_cast<std::uint16_t>(20000 + std::hash<std::string>{}(node_id) % 10000)};
  if (std::getenv("TROUPE_BENCH_WORKERS_LOG") != nullptr) {
    s.log = [node_id](CoordinatorLogLevel, std::string_view text) {
      std::fprintf(stderr, "%.3f %s: %.*s\n", static_cast<double>(workers::now_ns()) / 1e9, node_id.c_str(),
                   static_cast<int>(text.size()), text.data());
    };
  }
  auto created = Coordinator::create(s);
  if (!created.ok()) fail("Coordinator::create: " + created.error().to_string());
  std::unique_ptr<Coordinator> c = std::move(created.value());

  EventPipe* ev = events.get();
  troupe::cluster::Reconciler r;
  r.start = [ev](const std::string& unit, const std::string&, std::uint64_t epoch) {
    ev->line("start " + unit + " " + std::to_string(epoch) + " " + now_text());
  };
  r.stop = [ev](const std::string& unit) {
    ev->line("stop " + unit + " " + now_text());
    troupe::Promise<void> done;
    auto f = done.future();
    done.set_value();
    return f;
  };
  if (auto served = c->serve(workers::kGroup, std::move(r)); !served.ok())
    fail("serve: " + served.error().to_string());
  if (auto started = c->start().get(); !started.ok()) fail("start: " + started.error().to_string());
  events->line("ready");

  auto wait_members = [&](std::size_t n) {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (c->members().size() < n) {
      if (std::chrono::steady_clock::now() > until)
        fail("saw " + std::to_string(c->members().size()) + " live members, not " + std::to_string(n) +
             ", within 30 s");
      std::this_thread::sleep_for(5ms);
    }
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    std::size_t members = 0;
    in >> cmd >> members;
    if (cmd == "sync") {
      wait_members(members);
      auto report = c->sync(workers::kGroup, troupe::cluster::from_file(units_file)).get();
      if (!report.ok()) fail("sync: " + report.error().to_string());
      if (!report->failed.empty())
        fail("sync: " + std::to_string(report->failed.size()) + " units failed, first " +
             report->failed[0].first + ": " + report->failed[0].second.to_string());
      events->line("synced " + std::to_string(report->desired) + " " + std::to_string(report->assigned));
    } else if (cmd == "rebalance") {
      wait_members(members);
      const std::string called = now_text();
      auto report = c->rebalance(workers::kGroup).get();
      if (!report.ok()) fail("rebalance: " + report.error().to_string());
      if (report->outcome != troupe::cluster::RebalanceOutcome::rebalanced)
        fail("rebalance did not run: " + report->waiting_reason());
      for (const auto& m : report->moves) events->line("move " + m.unit + " " + m.from + " " + m.to);
      events->line("rebalanced " + std::to_string(report->moves.size()) + " " +
                   std::to_string(report->moves_left) + " " + called);
    } else if (cmd == "count") {
      events->line("count " + std::to_string(c->running(workers::kGroup).size()));
    } else {
      fail("unknown command '" + line + "'");
    }
  }
  // stdin closed: the bench process is done with this node. Redis is thrown
  // away with the run, so no graceful leave.
  events.reset();
  std::_Exit(0);
}

}  // namespace troupe_bench
