#pragma once
// A private redis-server for tests: its own temp directory and free port on
// 127.0.0.1, so it touches nothing else on the machine, and stop()/start()
// so a test can take Redis away and bring it back. Data survives a stop()
// (append-only file, written out when Redis shuts down), as it would in
// production; with Options::fsync_always it survives a kill() too.
// Also a small blocking client (hiredis' synchronous API) for tests that
// look at or change Redis directly. Header-only, for test binaries only.
//
// The binary is $TROUPE_REDIS_SERVER, else redis-server on PATH (Debian:
// redis-server); without one the constructor throws saying what to install.
//
// Ownership: the object owns the server process and the directory; the
// destructor kills the process and removes the directory. Thread safety:
// none; use it from the test's thread.

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "redis_connection.hpp"

extern char** environ;

namespace troupe::test {

// A blocking connection to a Redis, for tests that look at or change it
// directly. Owns its hiredis context; not thread-safe (one per thread).
class RedisTestClient {
 public:
  // With a password it sends AUTH [user] password first.
  explicit RedisTestClient(int port, const std::string& password = "", const std::string& user = "") {
    timeval tv{5, 0};
    c_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c_ == nullptr || c_->err != 0) {
      std::string why = c_ != nullptr ? c_->errstr : "out of memory";
      if (c_ != nullptr) redisFree(c_);
      throw std::runtime_error("redis test client: cannot connect to 127.0.0.1:" + std::to_string(port) +
                               ": " + why);
    }
    redisSetTimeout(c_, tv);
    if (!password.empty()) {
      auto a = user.empty() ? cmd({"AUTH", password}) : cmd({"AUTH", user, password});
      if (a.is_error()) {
        redisFree(c_);
        throw std::runtime_error("redis test client: AUTH refused: " + a.str);
      }
    }
  }
  ~RedisTestClient() { redisFree(c_); }
  RedisTestClient(const RedisTestClient&) = delete;
  RedisTestClient& operator=(const RedisTestClient&) = delete;

  // One command; throws when the connection fails (a Redis error reply is
  // returned as a value).
  cluster::detail::RedisReply cmd(const std::vector<std::string>& args) {
    std::vector<const char*> av;
    std::vector<std::size_t> al;
    for (const auto& a : args) {
      av.push_back(a.data());
      al.push_back(a.size());
    }
    auto* r =
        static_cast<redisReply*>(redisCommandArgv(c_, static_cast<int>(av.size()), av.data(), al.data()));
    if (r == nullptr) throw std::runtime_error(std::string("redis test client: ") + c_->errstr);
    auto out = cluster::detail::RedisReply::from(r);
    freeReplyObject(r);
    return out;
  }
  cluster::detail::RedisReply cmd(std::initializer_list<std::string> args) {
    return cmd(std::vector<std::string>(args));
  }
  // Redis' clock, in milliseconds since the epoch.
  long long time_ms() {
    auto t = cmd({"TIME"});
    return std::stoll(t.elements.at(0).str) * 1000 + std::stoll(t.elements.at(1).str) / 1000;
  }
  // Reads the next reply on this connection (MONITOR); false on timeout.
  bool next(cluster::detail::RedisReply& out) {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) return false;
    out = cluster::detail::RedisReply::from(static_cast<redisReply*>(r));
    freeReplyObject(r);
    return true;
  }
  void set_timeout(std::chrono::milliseconds d) {
    timeval tv{static_cast<time_t>(d.count() / 1000), static_cast<suseconds_t>((d.count() % 1000) * 1000)};
    redisSetTimeout(c_, tv);
  }

 private:
  redisContext* c_ = nullptr;
};

// Runs args[0] with `args`, its standard streams on /dev/null and no other
// descriptor of the test (listeners, proxies must not live on in it);
// throws when it cannot be started.
inline pid_t spawn_quietly(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("test: cannot run " + args[0] + ": " + std::strerror(rc));
  return pid;
}

struct RedisTestServerOptions {
  std::string password{};     // requirepass; empty: none
  bool fsync_always = false;  // fsync every write (slower): data survives kill() too
  // ACL users, each the rules of one aclfile line after "user " (the same
  // words ACL SETUSER takes: "name on >pw ~key* +cmd ..."). When any is
  // given the server runs from that aclfile with the default user off, and
  // the test's own connections (admin_user(), admin_password()) log in as
  // a user with every right. `password` is then ignored.
  std::vector<std::string> acl_users{};
  // PEM certificate and key: the server also listens with TLS only on
  // tls_port() (no client certificates asked); port() stays plain for the
  // test's own connections.
  std::string tls_cert_file{}, tls_key_file{};
};

class RedisTestServer {
 public:
  using Options = RedisTestServerOptions;

  explicit RedisTestServer(Options options = {}) : options_(std::move(options)) {
    bin_ = binary();
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-redis-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("redis test server: mkdtemp failed");
    dir_ = pattern;
    port_ = free_port();
    if (!options_.tls_cert_file.empty()) tls_port_ = free_port();
    start();
  }
  ~RedisTestServer() {
    kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisTestServer(const RedisTestServer&) = delete;
  RedisTestServer& operator=(const RedisTestServer&) = delete;

  // Starts the (stopped) server on the same port and data; returns once it
  // answers. The first start moves to another free port when the one picked
  // was taken meanwhile (tests run in parallel processes).
  void start() {
    if (pid_ > 0) return;
    for (int attempt = 0;; ++attempt) {
      std::string why;
      if (spawn_and_wait(why)) {
        started_once_ = true;
        return;
      }
      if (started_once_ || attempt >= 10) throw std::runtime_error("redis test server: " + why);
      port_ = free_port();
    }
  }

  // Stops it the way an operator would (SIGTERM): it finishes its
  // append-only file and exits; connections are cut.
  void stop() { signal_and_wait(SIGTERM); }
  // Kills it (SIGKILL), as a crash would: the last second of writes may be
  // lost unless Options::fsync_always.
  void kill() { signal_and_wait(SIGKILL); }

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  int tls_port() const { return tls_port_; }
  const std::string& dir() const { return dir_; }
  const std::string& password() const { return options_.password; }
  // Who RedisTestClient logs in as to look at or change this server: the
  // ACL admin with acl_users, else the default user with `password`.
  std::string admin_user() const { return options_.acl_users.empty() ? "" : "troupe-test-admin"; }
  std::string admin_password() const {
    return options_.acl_users.empty() ? options_.password : "admin-" + std::to_string(port_);
  }
  std::string log() const {
    std::ifstream in(dir_ + "/redis.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // $TROUPE_REDIS_SERVER, else redis-server on PATH; throws saying what to install.
  static std::string binary() {
    if (const char* env = std::getenv("TROUPE_REDIS_SERVER"); env != nullptr && *env != '\0') return env;
    if (const char* path = std::getenv("PATH"); path != nullptr) {
      std::stringstream ss(path);
      std::string dir;
      while (std::getline(ss, dir, ':')) {
        auto p = std::filesystem::path(dir) / "redis-server";
        if (::access(p.c_str(), X_OK) == 0) return p.string();
      }
    }
    if (::access("/usr/bin/redis-server", X_OK) == 0) return "/usr/bin/redis-server";
    throw std::runtime_error(
        "redis test server: no redis-server binary; install the Debian package 'redis-server'");
  }

  static int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (fd >= 0) ::close(fd);
      throw std::runtime_error("redis test server: cannot find a free port");
    }
    ::close(fd);
    return ntohs(a.sin_port);
  }

 private:
  // Spawns redis-server and waits until *it* answers (not another process
  // that took the port meanwhile). False, with the reason, when it did not.
  bool spawn_and_wait(std::string& why) {
    std::vector<std::string> args = {bin_,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--dir",
                                     dir_,
                                     "--daemonize",
                                     "no",
                                     "--protected-mode",
                                     "no",
                                     "--appendonly",
                                     "yes",
                                     "--appendfsync",
                                     options_.fsync_always ? "always" : "everysec",
                                     "--save",
                                     "",
                                     "--logfile",
                                     dir_ + "/redis.log"};
    if (!options_.tls_cert_file.empty()) {
      args.insert(args.end(), {"--tls-port", std::to_string(tls_port_), "--tls-cert-file", options_.tls_cert_file,
                               "--tls-key-file", options_.tls_key_file, "--tls-auth-clients", "no"});
    }
    if (!options_.acl_users.empty()) {
      // Written at every start, so the rules of the options win over any
      // ACL SETUSER the test made before a restart.
      std::ofstream acl(dir_ + "/users.acl", std::ios::trunc);
      acl << "user default off\n";
      acl << "user " << admin_user() << " on >" << admin_password() << " ~* &* +@all\n";
      for (const auto& u : options_.acl_users) acl << "user " << u << "\n";
      acl.close();
      if (!acl) throw std::runtime_error("redis test server: cannot write " + dir_ + "/users.acl");
      args.push_back("--aclfile");
      args.push_back(dir_ + "/users.acl");
    } else if (!options_.password.empty()) {
      args.push_back("--requirepass");
      args.push_back(options_.password);
    }
    pid_ = spawn_quietly(args);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        why = "redis-server exited at start (port " + std::to_string(port_) + "): " + log();
        return false;
      }
      if (answering_pid() == pid_) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    signal_and_wait(SIGKILL);
    why = "redis-server did not answer on port " + std::to_string(port_) + " within 20 s: " + log();
    return false;
  }

  // The process_id of the Redis answering on our port once it has loaded
  // its data, or -1.
  pid_t answering_pid() const {
    timeval tv{0, 200000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    pid_t found = -1;
    if (c != nullptr && c->err == 0) {
      redisSetTimeout(c, tv);
      if (!admin_password().empty()) {
        auto* a = static_cast<redisReply*>(
            admin_user().empty() ? redisCommand(c, "AUTH %s", admin_password().c_str())
                                 : redisCommand(c, "AUTH %s %s", admin_user().c_str(), admin_password().c_str()));
        if (a != nullptr) freeReplyObject(a);
      }
      auto* r = static_cast<redisReply*>(redisCommand(c, "INFO"));
      if (r != nullptr && r->type == REDIS_REPLY_STRING) {
        std::string info(r->str, r->len);
        auto at = info.find("process_id:");
        if (at != std::string::npos && info.find("loading:0") != std::string::npos)
          found = static_cast<pid_t>(std::atol(info.c_str() + at + 11));
      }
      if (r != nullptr) freeReplyObject(r);
    }
    if (c != nullptr) redisFree(c);
    return found;
  }

  void signal_and_wait(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  Options options_;
  std::string bin_, dir_;
  int port_ = 0;
  int tls_port_ = 0;
  pid_t pid_ = -1;
  bool started_once_ = false;
};

}  // namespace troupe::test

// The same helpers under the cluster layer's test namespace, where the
// cluster tests (inside namespace troupe::cluster) look for them.
namespace troupe::cluster::testing {
using troupe::test::RedisTestClient;
using troupe::test::RedisTestServer;
}  // namespace troupe::cluster::testing
