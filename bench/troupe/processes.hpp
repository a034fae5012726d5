#pragma once
// The other processes a multi-process workload starts (bench/troupe
// cluster.cpp, payments.cpp): free ports, a temporary directory, child
// processes with their output in a log file, and PostgreSQL plus
// redis-server for a cluster. Nothing outlives the workload: children die
// with this process (PR_SET_PDEATHSIG) and are killed when their owner goes;
// PostgreSQL, which daemonizes, is stopped by its owner or, if this process
// dies first (bench/run's timeout sends SIGKILL), by a reaper process that
// waits for that.
//
// Failures throw Failure; a workload runs inside guarded(), which lets the
// owners clean up before it reports the failure and exits with status 1.
// Not thread-safe: one thread starts and stops the processes.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe_bench::proc {

using namespace std::chrono_literals;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& what) { throw Failure(what); }

// Runs `body`; on an exception (after `body`'s locals are gone, so every
// process it started is stopped) prints "bench_troupe: <name>: <what>" and
// exits with status 1.
template <class F>
void guarded(const char* name, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_troupe: %s: %s\n", name, e.what());
    std::exit(1);
  }
}

inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0)
    fail("cannot find a free port");
  close(fd);
  return ntohs(a.sin_port);
}

inline bool port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

// A fresh directory under the system temp dir, removed with its contents
// when this goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data())) fail("mkdtemp " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last `lines` lines of `text`, joined by " | ", for error messages.
inline std::string tail(const std::string& text, std::size_t lines = 5) {
  std::vector<std::string> all;
  std::stringstream s(text);
  for (std::string l; std::getline(s, l);)
    if (!l.empty()) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out.empty() ? "(no output)" : out;
}

// One child process running `argv`, stdout and stderr appended to `log`,
// in a process group of its own. Killed (SIGKILL, the whole group) when
// destroyed if still running.
class Child {
 public:
  Child(std::string name, const std::vector<std::string>& argv, std::string log)
      : name_(std::move(name)), log_(std::move(log)) {
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot open " + log_);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) {
      close(fd);
      fail("fork");
    }
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      setpgid(0, 0);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    close(fd);
  }
  ~Child() { kill9(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  const std::string& name() const { return name_; }
  std::string output() const { return read_file(log_); }

  void kill9() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);  // in case it died before setpgid
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // The exit status once it has exited (128 + signal if killed), nullopt
  // while it runs.
  std::optional<int> exited() {
    if (pid_ <= 0) return status_;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }

  // Waits until it exits; fails (killing it) after `bound`.
  int wait(std::chrono::steady_clock::duration bound) {
    auto until = std::chrono::steady_clock::now() + bound;
    for (;;) {
      if (auto st = exited()) return *st;
      if (std::chrono::steady_clock::now() > until) {
        kill9();
        fail(name_ + " did not finish in time: " + tail(output()));
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  // The first line of its output that starts with `prefix`, waiting for it
  // up to `bound`; fails if the process exits first.
  std::string await_line(const std::string& prefix, std::chrono::steady_clock::duration bound) {
    auto until = std::chrono::steady_clock::now() + bound;
    for (;;) {
      std::stringstream s(output());
      for (std::string l; std::getline(s, l);)
        if (l.rfind(prefix, 0) == 0) return l;
      if (auto st = exited())
        fail(name_ + " exited with status " + std::to_string(*st) + ": " + tail(output()));
      if (std::chrono::steady_clock::now() > until)
        fail(name_ + " printed no '" + prefix + "' line in time: " + tail(output()));
      std::this_thread::sleep_for(20ms);
    }
  }

 private:
  std::string name_, log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// PostgreSQL (started by `pg_server`, the postgres_test_server binary),
// redis-server and a directory of their own for one run, on 127.0.0.1; all
// stopped and removed when this goes.
class Servers {
 public:
  explicit Servers(std::string pg_server) : dir_("troupe-bench-cluster"), pg_server_(std::move(pg_server)) {
    pg_state_ = dir_.path() + "/pg.state";
    start_reaper();
    if (std::system((pg_server_ + " start " + pg_state_ + " >&2").c_str()) != 0)
      fail("PostgreSQL did not start");
    std::ifstream in(pg_state_);
    std::getline(in, conninfo_);
    redis_port_ = free_port();
    std::string redis = find_redis();
    redis_.emplace(
        "redis-server",
        std::vector<std::string>{redis, "--port", std::to_string(redis_port_), "--bind", "127.0.0.1", "--dir",
                                 dir_.path(), "--save", "", "--appendonly", "no"},
        dir_.path() + "/redis.log");
    auto until = std::chrono::steady_clock::now() + 20s;
    while (!port_open(redis_port_)) {
      if (redis_->exited() || std::chrono::steady_clock::now() > until)
        fail("redis-server did not start: " + tail(redis_->output()));
      std::this_thread::sleep_for(20ms);
    }
  }
  ~Servers() {
    redis_.reset();
    if (reaper_ > 0) {
      ::kill(reaper_, SIGKILL);
      waitpid(reaper_, nullptr, 0);
    }
    (void)std::system((pg_server_ + " stop " + pg_state_ + " >&2").c_str());
  }
  Servers(const Servers&) = delete;
  Servers& operator=(const Servers&) = delete;

  const std::string& conninfo() const { return conninfo_; }
  int redis_port() const { return redis_port_; }
  const std::string& dir() const { return dir_.path(); }

 private:
  static std::string find_redis() {
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin");
    for (std::string d; std::getline(dirs, d, ':');) {
      std::string p = (d.empty() ? "." : d) + "/redis-server";
      if (access(p.c_str(), X_OK) == 0) return p;
    }
    fail("redis-server not found on PATH (Debian: apt-get install redis-server)");
  }

  // A process that stops PostgreSQL and removes the directory if this one
  // dies without doing it: it waits for the SIGTERM its parent's death
  // sends, in a process group of its own so a Ctrl-C does not end it first.
  // Everything it runs is prepared before fork().
  void start_reaper() {
    std::string script = pg_server_ + " stop " + pg_state_ + " >/dev/null 2>&1; rm -rf " + dir_.path();
    const pid_t parent = getpid();
    reaper_ = fork();
    if (reaper_ < 0) fail("fork");
    if (reaper_ == 0) {
      sigset_t term;
      sigemptyset(&term);
      sigaddset(&term, SIGTERM);
      sigprocmask(SIG_BLOCK, &term, nullptr);
      prctl(PR_SET_NAME, "pg-reaper");
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(0);
      setpgid(0, 0);
      int sig = 0;
      sigwait(&term, &sig);
      execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }

  TempDir dir_;
  std::string pg_server_, pg_state_, conninfo_;
  int redis_port_ = 0;
  pid_t reaper_ = -1;
  std::optional<Child> redis_;
};

}  // namespace troupe_bench::proc
