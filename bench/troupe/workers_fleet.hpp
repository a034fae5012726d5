#pragma once
// The bench process's side of the workers_* rows (bench/troupe/workers.cpp):
// the node processes it starts (copies of its own binary running
// workers_node.cpp), the commands it sends them, and what it learns from
// their events: which units each node runs now, and every run of every unit
// (node, start, stop), from which the rows compute their times and find any
// unit that ran on two nodes at once.
//
// Ownership: a Fleet owns its node processes (killed and reaped when it
// goes; each also dies with this process, PR_SET_PDEATHSIG) and one reader
// thread. Thread safety: one thread (main's, which forks: PR_SET_PDEATHSIG
// follows the forking thread) calls every member; the reader thread only
// updates the state under the Fleet's mutex.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "workers_settings.hpp"

namespace troupe_bench::workers {

[[noreturn]] inline void die(const std::string& row, const std::string& what) {
  std::fprintf(stderr, "bench_troupe: %s: %s\n", row.c_str(), what.c_str());
  std::fflush(stderr);
  std::_Exit(1);  // the nodes die with this process (PR_SET_PDEATHSIG)
}

// One run of a unit on a node: [start, stop), stop -1 while it runs.
struct Run {
  int node = 0;
  std::int64_t start = 0;
  std::int64_t stop = -1;
};

class Fleet {
 public:
  struct Node {
    std::string id;
    pid_t pid = -1;
    int cmd_fd = -1;
    int event_fd = -1;
    std::string partial;  // an event line not yet complete
    bool ready = false;
    bool killed = false;
    std::int64_t dead_ns = 0;                                // when it was reaped after the kill
    std::unordered_map<std::string, std::uint64_t> running;  // unit -> epoch
    std::deque<std::string> replies;                         // lines other than start, stop, ready, error
  };

  Fleet(std::string row, std::string units_file) : row_(std::move(row)), units_file_(std::move(units_file)) {
    nodes_.reserve(kMaxNodes);
    reader_ = std::thread([this] { read_loop(); });
  }
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;
  ~Fleet() {
    stopping_ = true;
    reader_.join();
    for (auto& n : nodes_) {
      if (n.pid > 0 && !n.killed) {
        ::kill(n.pid, SIGKILL);
        ::waitpid(n.pid, nullptr, 0);
      }
    }
  }

  // Starts node "node-<count+1>" and waits until it is registered in Redis.
  int add_node() {
    if (nodes_.size() == kMaxNodes) fail("too many nodes");
    int cmd[2], ev[2];
    if (::pipe2(cmd, O_CLOEXEC) != 0 || ::pipe2(ev, O_CLOEXEC) != 0) fail("pipe2 failed");
    ::fcntl(ev[0], F_SETPIPE_SZ, 1 << 20);  // a burst of 10,000 events never waits for the reader
    Node n;
    n.id = "node-" + std::to_string(nodes_.size() + 1);
    const std::string fd_arg = std::to_string(ev[1]);
    std::string self(4096, '\0');
    const ssize_t len = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
    self.resize(len > 0 ? static_cast<std::size_t>(len) : 0);
    const char* argv[] = {self.c_str(),        "workers_node", n.id.c_str(),
                          units_file_.c_str(), fd_arg.c_str(), nullptr};
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {  // async-signal-safe calls only until exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(cmd[0], 0);
      ::fcntl(ev[1], F_SETFD, 0);
      ::dup2(2, 1);  // stdout is this process's JSON channel
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    ::close(cmd[0]);
    ::close(ev[1]);
    n.pid = pid;
    n.cmd_fd = cmd[1];
    n.event_fd = ev[0];
    int index;
    {
      std::lock_guard lk(mu_);
      nodes_.push_back(std::move(n));
      index = static_cast<int>(nodes_.size()) - 1;
    }
    wait_for(30, "node-" + std::to_string(index + 1) + " to start", [&] { return nodes_[index].ready; });
    return index;
  }

  void send(int node, const std::string& command) {
    const std::string line = command + "\n";
    if (::write(nodes_[node].cmd_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      fail("cannot send '" + command + "' to " + nodes_[node].id);
  }

  // The next reply of `node` (a line other than start, stop, ready, error).
  std::string reply(int node, int seconds, const std::string& what) {
    std::string out;
    wait_for(seconds, what, [&] {
      if (nodes_[node].replies.empty()) return false;
      out = std::move(nodes_[node].replies.front());
      nodes_[node].replies.pop_front();
      return true;
    });
    return out;
  }

  // kill -9 of `node`; returns the time just before the signal.
  std::int64_t kill(int node) {
    Node& n = nodes_[node];
    {
      std::lock_guard lk(mu_);
      n.killed = true;
    }
    const std::int64_t t = now_ns();
    if (::kill(n.pid, SIGKILL) != 0) fail("kill -9 of " + n.id + " failed");
    ::waitpid(n.pid, nullptr, 0);
    std::lock_guard lk(mu_);
    n.dead_ns = now_ns();
    return t;
  }

  // Waits up to `seconds` for `pred`, evaluated under the state's lock
  // every 10 ms; fails naming `what` when it does not come true, and at
  // once when a node reported an error or exited.
  template <class Pred>
  void wait_for(int seconds, const std::string& what, Pred pred) {
    const std::int64_t until = now_ns() + static_cast<std::int64_t>(seconds) * 1'000'000'000;
    while (true) {
      {
        std::lock_guard lk(mu_);
        if (!fatal_.empty()) die(row_, fatal_);
        if (pred()) return;
      }
      if (now_ns() > until) fail("waited " + std::to_string(seconds) + " s for " + what + " in vain");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Whether the live nodes run exactly `desired`, each unit on one node.
  // Call under the lock (inside a wait_for predicate or locked()).
  bool converged(const std::unordered_set<std::string>& desired) const {
    std::size_t total = 0;
    for (const auto& n : nodes_) {
      if (n.killed) continue;
      total += n.running.size();
      for (const auto& [unit, epoch] : n.running)
        if (desired.count(unit) == 0) return false;
    }
    if (total != desired.size()) return false;
    std::unordered_set<std::string> seen;
    seen.reserve(total);
    for (const auto& n : nodes_)
      if (!n.killed)
        for (const auto& [unit, epoch] : n.running)
          if (!seen.insert(unit).second) return false;
    return true;
  }

  // Waits until the live nodes run `desired` and nothing more happens for
  // `quiet_ms` (longer than a sync interval, so a periodic reconcile would
  // show any change), and until each node's coordinator agrees on its
  // count. Returns the time of the last event before that.
  std::int64_t settle(const std::unordered_set<std::string>& desired, int seconds, const std::string& what,
                      int quiet_ms = 1500) {
    const std::int64_t until = now_ns() + static_cast<std::int64_t>(seconds) * 1'000'000'000;
    while (true) {
      const int left = static_cast<int>(std::max<std::int64_t>(1, (until - now_ns()) / 1'000'000'000));
      std::uint64_t events = 0;
      std::int64_t last = 0;
      bool checked = false;
      wait_for(left, what, [&] {
        // Only a new event can change the answer (the check is O(units),
        // and this process shares the machine with the nodes).
        if (checked && events == events_) return false;
        checked = true;
        events = events_;
        last = last_event_ns_;
        return converged(desired);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(quiet_ms));
      bool still = false;
      {
        std::lock_guard lk(mu_);
        still = events_ == events && converged(desired);
      }
      if (still) {
        check_counts();
        return last;
      }
      if (now_ns() > until) fail(what + ": the nodes kept changing what they run");
    }
  }

  // Every live node's coordinator (Coordinator::running) runs as many
  // units as its events say.
  void check_counts() {
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      if (nodes_[i].killed) continue;
      send(i, "count");
      const std::string r = reply(i, 10, nodes_[i].id + "'s count");
      std::size_t mine = 0;
      {
        std::lock_guard lk(mu_);
        mine = nodes_[i].running.size();
      }
      if (r != "count " + std::to_string(mine))
        fail(nodes_[i].id + " reports '" + r + "' but its events say it runs " + std::to_string(mine) +
             " units");
    }
  }

  // Units some of whose runs on different nodes overlapped in time: a
  // killed node's runs end when it was reaped.
  std::vector<std::string> doubles() {
    std::lock_guard lk(mu_);
    std::vector<std::string> out;
    for (auto& [unit, runs] : runs_) {
      std::vector<Run> rs = runs;
      for (Run& r : rs)
        if (r.stop < 0 && nodes_[r.node].killed) r.stop = nodes_[r.node].dead_ns;
      std::sort(rs.begin(), rs.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
      // A run that starts before the latest end so far overlaps the run
      // that ends there (runs on one node never overlap: see on_line).
      std::int64_t end = INT64_MIN;
      int end_node = -1;
      for (const Run& r : rs) {
        if (r.start < end && r.node != end_node) {
          out.push_back(unit);
          break;
        }
        const std::int64_t stop = r.stop < 0 ? INT64_MAX : r.stop;
        if (stop > end) {
          end = stop;
          end_node = r.node;
        }
      }
    }
    return out;
  }

  // Units a live node stopped at or after `since`, with how many times.
  std::map<std::string, int> stopped_since(std::int64_t since) {
    std::lock_guard lk(mu_);
    std::map<std::string, int> out;
    for (const auto& [unit, runs] : runs_)
      for (const Run& r : runs)
        if (r.stop >= since) ++out[unit];
    return out;
  }

  // CPU seconds (user + system) `node` has used so far; -1 once it is gone.
  double cpu_seconds(int node) const {
    std::ifstream in("/proc/" + std::to_string(nodes_[node].pid) + "/stat");
    std::string text;
    std::getline(in, text);                     // one line
    const std::size_t paren = text.rfind(')');  // the command name may hold blanks
    if (paren == std::string::npos) return -1;
    std::istringstream fields(text.substr(paren + 2));
    std::string skip;
    for (int i = 3; i < 14; ++i) fields >> skip;  // fields 3..13
    double user = 0, sys = 0;
    fields >> user >> sys;  // fields 14 and 15, in clock ticks
    return (user + sys) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

  template <class F>
  auto locked(F f) {
    std::lock_guard lk(mu_);
    return f();
  }
  // The state; read it under locked() (the reader thread updates it).
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::unordered_map<std::string, std::vector<Run>>& runs() const { return runs_; }
  [[noreturn]] void fail(const std::string& what) const { die(row_, what); }

 private:
  void read_loop() {
    std::vector<pollfd> fds;
    std::vector<int> index;
    char buf[65536];
    while (!stopping_) {
      fds.clear();
      index.clear();
      {
        std::lock_guard lk(mu_);
        for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
          if (nodes_[i].event_fd < 0) continue;
          fds.push_back({nodes_[i].event_fd, POLLIN, 0});
          index.push_back(i);
        }
      }
      if (fds.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      for (std::size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        std::lock_guard lk(mu_);
        Node& node = nodes_[index[k]];
        if (n <= 0) {
          ::close(node.event_fd);
          node.event_fd = -1;
          if (!node.killed && fatal_.empty())
            fatal_ = node.id + " exited unexpectedly (see its stderr above)";
          continue;
        }
        node.partial.append(buf, static_cast<std::size_t>(n));
        std::size_t from = 0, nl;
        while ((nl = node.partial.find('\n', from)) != std::string::npos) {
          on_line(index[k], node.partial.substr(from, nl - from));
          from = nl + 1;
        }
        node.partial.erase(0, from);
      }
    }
  }

  // Under the lock.
  void on_line(int i, const std::string& line) {
    Node& node = nodes_[i];
    std::istringstream in(line);
    std::string kind, unit;
    in >> kind;
    if (kind == "start") {
      std::uint64_t epoch = 0;
      std::int64_t t = 0;
      in >> unit >> epoch >> t;
      if (!node.running.emplace(unit, epoch).second && fatal_.empty())
        fatal_ = node.id + " started unit " + unit + " twice without a stop";
      runs_[unit].push_back(Run{i, t, -1});
      note_event(t);
    } else if (kind == "stop") {
      std::int64_t t = 0;
      in >> unit >> t;
      if (node.running.erase(unit) == 0 && fatal_.empty())
        fatal_ = node.id + " stopped unit " + unit + ", which it did not run";
      for (auto it = runs_[unit].rbegin(); it != runs_[unit].rend(); ++it)
        if (it->node == i && it->stop < 0) {
          it->stop = t;
          break;
        }
      note_event(t);
    } else if (kind == "ready") {
      node.ready = true;
    } else if (kind == "error") {
      if (fatal_.empty()) fatal_ = node.id + ": " + line.substr(std::min<std::size_t>(6, line.size()));
    } else {
      node.replies.push_back(line);
    }
  }

  void note_event(std::int64_t t) {
    ++events_;
    last_event_ns_ = std::max(last_event_ns_, t);
  }

  std::string row_;
  std::string units_file_;
  std::mutex mu_;
  static constexpr std::size_t kMaxNodes = 8;
  std::vector<Node> nodes_;  // grows under mu_, never past its reserve(): elements stay put
  std::unordered_map<std::string, std::vector<Run>> runs_;
  std::uint64_t events_ = 0;
  std::int64_t last_event_ns_ = 0;
  std::string fatal_;
  std::atomic<bool> stopping_{false};
  std::thread reader_;
};

}  // namespace troupe_bench::workers
