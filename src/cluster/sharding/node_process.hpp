#pragma once
// A cluster_test_node process, for the multi-process tests and the cluster
// benchmarks: started with its arguments, ready once it printed "READY
// <port>", killed with SIGKILL or asked to leave with SIGTERM. It dies with
// the process that started it. It records when it was killed, frozen and
// woken (wall clock), for the history checker (history_checker.hpp).

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "history_checker.hpp"

namespace troupe::cluster::proc {

using namespace std::chrono_literals;

// One node process. Killed (SIGKILL) when destroyed if still running.
class NodeProcess {
 public:
  NodeProcess(const std::string& binary, std::string id, std::vector<std::string> args) : id_(std::move(id)) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    std::vector<std::string> argv = {binary, "--id", id_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    pid_seen_ = pid_;
    if (pid_ == 0) {
      // A test binary that dies (a crash, a timeout's SIGKILL) takes its
      // nodes with it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      dup2(out[1], 1);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    close(out[1]);
    // Wait for "READY <port>".
    std::string line;
    char c;
    auto until = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < until) {
      ssize_t n = read(out[0], &c, 1);
      if (n <= 0) break;
      if (c == '\n') break;
      line += c;
    }
    close(out[0]);
    if (line.rfind("READY ", 0) != 0) throw std::runtime_error("node " + id_ + " did not start: '" + line + "'");
    port_ = static_cast<std::uint16_t>(std::stoi(line.substr(6)));
  }
  ~NodeProcess() { kill9(); }

  // Recorded once the process is gone.
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    note(NodeSignal::Kind::kill);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: the process freezes as under a long GC pause or a VM
  // freeze, and wakes up again, none the wiser. The recorded frozen time
  // lies inside the real one: a pause is recorded once the process has
  // stopped, a resume just before it is woken.
  void pause() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGSTOP);
    int status = 0;
    waitpid(pid_, &status, WUNTRACED);
    note(NodeSignal::Kind::pause);
  }
  void resume() {
    if (pid_ <= 0) return;
    note(NodeSignal::Kind::resume);
    ::kill(pid_, SIGCONT);
  }
  // SIGTERM: graceful leave. True if it exited 0 within `bound`.
  bool terminate(std::chrono::seconds bound) {
    if (pid_ <= 0) return false;
    ::kill(pid_, SIGTERM);
    auto until = std::chrono::steady_clock::now() + bound;
    int status = 0;
    while (std::chrono::steady_clock::now() < until) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      std::this_thread::sleep_for(20ms);
    }
    kill9();
    return false;
  }
  const std::string& id() const { return id_; }
  std::uint16_t port() const { return port_; }
  bool running() const { return pid_ > 0; }
  long pid() const { return pid_seen_; }
  // What the driver did to the process, in order.
  const std::vector<NodeSignal>& signals() const { return signals_; }

 private:
  void note(NodeSignal::Kind k) { signals_.push_back(NodeSignal{k, id_, pid_seen_, wall_now_us()}); }

  std::string id_;
  pid_t pid_ = -1;
  long pid_seen_ = 0;
  std::vector<NodeSignal> signals_;
  std::uint16_t port_ = 0;
};

}  // namespace troupe::cluster::proc
