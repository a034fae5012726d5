#pragma once
// The remote workloads (remote_tell, remote_ask), shared by bench/troupe and
// bench/peers/caf so both sides run the same protocol, measure between the
// same two points and manage their second process the same way.
//
// Two OS processes on 127.0.0.1. The bench process (the client) starts a
// second copy of its own binary as the server node:
//   <binary> remote_server <workload> <fd>
// The server binds an ephemeral port (0) on 127.0.0.1, makes its actor
// reachable there, writes the port in decimal plus '\n' to file descriptor
// <fd> (the write end of a pipe the client created) and closes it. The client
// reads the port (EOF first means the server failed), connects, measures,
// tells the server's actor to stop, waits for the server to exit and reaps
// it. The server is killed on every other path (see ServerProcess).
//
// remote_tell: a sender in the client sends { uint64 seq; string tag } (tag:
//   kTagSize bytes) to a sink in the server, seq = 0, 1, 2, ... over the
//   whole run. The sink checks seq is the next one expected and acks with
//   its total count received (uint64) every kTellAckEvery messages. The
//   sender sends while (sent - last acked count) < kTellWindow, in bursts
//   as acks arrive; neither side ever buffers more than the window.
//   Warm-up: tell_warmup() messages, then the sender waits for the ack that
//   covers them all (the pipe is empty again). Timed: tell_messages() more;
//   the clock starts right before the first timed send and stops when the
//   ack covering the last message arrives. remote_tell = tell_messages() /
//   seconds (msgs/s); remote_tell_rss = the client's peak RSS (VmHWM, MB).
//   Both counts are multiples of kTellAckEvery, so the last message of each
//   phase is always acked.
//
// remote_ask: request { uint64 seq } -> response { uint64 seq } (the same
//   seq), one request outstanding at a time. ask_warmup() round trips
//   untimed, then ask_round_trips() timed. Each round trip's latency is
//   steady_clock from right before the request is sent until its response
//   is handled, in ns. remote_ask = ask_round_trips() / seconds from the
//   first timed send until the last timed response (round trips/s);
//   remote_ask_p50 / remote_ask_p99 = percentile() of the latencies, in us.
//
// BENCH_SCALE (report.hpp) divides every count, warm-ups included.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"

namespace bench::remote {

inline constexpr long kTellWindow = 50'000;      // max messages unacknowledged
inline constexpr long kTellAckEvery = 5'000;     // the sink acks every N messages
inline constexpr long kTellMessages = 2'000'000; // timed
inline constexpr long kTellWarmup = 100'000;     // untimed, before the timed ones
inline constexpr std::size_t kTagSize = 16;      // bytes of the tell message's tag
inline constexpr long kAskRoundTrips = 50'000;   // timed
inline constexpr long kAskWarmup = 5'000;        // untimed, before the timed ones

// The hidden first argument that turns a bench binary into the server node.
inline constexpr const char* kServerArg = "remote_server";

// How long the client waits for the server's port, and for the server to
// exit after being told to stop, before giving up on it.
inline constexpr auto kServerStartTimeout = std::chrono::seconds(30);
inline constexpr auto kServerStopTimeout = std::chrono::seconds(10);

// Scaled tell counts, rounded down to a multiple of kTellAckEvery (at least
// one) so the sink's last ack of a phase covers its last message.
inline long scaled_tell_count(long n) {
  const long v = n / scale() / kTellAckEvery * kTellAckEvery;
  return std::max(v, kTellAckEvery);
}
inline long tell_messages() { return scaled_tell_count(kTellMessages); }
inline long tell_warmup() { return scaled_tell_count(kTellWarmup); }
inline long ask_round_trips() { return std::max(kAskRoundTrips / scale(), 1L); }
inline long ask_warmup() { return std::max(kAskWarmup / scale(), 1L); }

// The tell message's tag: kTagSize bytes, one past std::string's small-buffer
// capacity in libstdc++ (15), so every copy is a real allocation on both sides.
inline std::string tell_tag() { return std::string(kTagSize, 't'); }

// Reports remote_ask, remote_ask_p50 and remote_ask_p99 from the timed
// phase's duration and its per-round-trip latencies (ns).
// `name`: the workload reported (remote_ask_tls: the same over TLS).
inline void report_ask(double seconds, std::vector<int64_t>& latencies_ns, const std::string& name = "remote_ask") {
  report(name.c_str(), static_cast<double>(latencies_ns.size()) / seconds, "round trips/s");
  report((name + "_p50").c_str(), percentile(latencies_ns, 50) / 1e3, "us");
  report((name + "_p99").c_str(), percentile(latencies_ns, 99) / 1e3, "us");
}

inline void report_tell(double seconds, long messages, const std::string& name = "remote_tell") {
  report(name.c_str(), static_cast<double>(messages) / seconds, "msgs/s");
  report((name + "_rss").c_str(), static_cast<double>(proc_status_kb("VmHWM")) / 1024.0, "MB");
}

// The server node, a child process running `/proc/self/exe remote_server
// <workload> <fd>`. No server outlives its client:
//  - the child asks the kernel for SIGKILL when its parent dies
//    (PR_SET_PDEATHSIG), which covers a crash, _Exit, SIGKILL (bench/run's
//    timeout) and a Ctrl-C or SIGTERM that kills the client;
//  - the destructor kills and reaps a child that is still running.
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, so construct
// this on the thread that lives as long as the measurement (main's).
class ServerProcess {
 public:
  explicit ServerProcess(const char* workload) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      die("pipe2");
    // Everything the child needs is prepared before fork(): the client may
    // already run threads, so the child may only make async-signal-safe
    // calls until exec.
    const std::string fd_arg = std::to_string(fds[1]);
    // Exec /proc/self/exe (this very binary, wherever it was started from)
    // under its real name, so ps and pgrep show what the server is.
    std::string self(4096, '\0');
    const ssize_t len = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
    self.resize(len > 0 ? static_cast<std::size_t>(len) : 0);
    if (self.empty())
      self = "bench_remote_server";
    const char* argv[] = {self.c_str(), kServerArg, workload, fd_arg.c_str(), nullptr};
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0)
      die("fork");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)  // the client died before prctl took effect
        ::_exit(1);
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::fcntl(fds[1], F_SETFD, 0);  // the write end survives exec
      ::dup2(2, 1);  // stdout is the client's JSON channel; keep it clean
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    ::close(fds[1]);
    read_port(fds[0]);
    ::close(fds[0]);
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  uint16_t port() const { return port_; }

  // After the server was told to stop: waits up to kServerStopTimeout for it
  // to exit, then kills it. Returns whether it exited on its own with status 0.
  bool wait_exit() {
    const auto deadline = std::chrono::steady_clock::now() + kServerStopTimeout;
    int status = 0;
    while (true) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      if (r < 0 && errno != EINTR) {
        pid_ = -1;
        return false;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr, "bench: remote server did not exit within %lld s; killing it\n",
                     static_cast<long long>(kServerStopTimeout.count()));
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  [[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "bench: remote server: %s: %s\n", what, std::strerror(errno));
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::_Exit(1);
  }

  void read_port(int fd) {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + kServerStartTimeout;
    while (text.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        errno = ETIMEDOUT;
        die("waiting for the port");
      }
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR)
        continue;
      if (r < 0)
        die("poll");
      if (r == 0)
        continue;
      char buf[32];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        errno = n == 0 ? EPIPE : errno;
        die("the server exited before announcing its port");
      }
      text.append(buf, static_cast<std::size_t>(n));
    }
    const long port = std::atol(text.c_str());
    if (port <= 0 || port > 65535) {
      errno = EINVAL;
      die("bad port");
    }
    port_ = static_cast<uint16_t>(port);
  }

  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Server side: writes the port to the fd given on the command line and
// closes it. Returns false if the fd is unusable.
inline bool announce_port(const char* fd_arg, uint16_t port) {
  const int fd = std::atoi(fd_arg);
  if (fd < 0)
    return false;
  const std::string line = std::to_string(port) + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  return ok;
}

}  // namespace bench::remote
