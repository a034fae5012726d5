#pragma once
// A private PostgreSQL server for the tests: its own data directory under
// the system temp dir and its own free port on 127.0.0.1 (its unix socket
// in that directory too), so it touches nothing else on the machine. Used by
// the test binary only (header-only; never part of the library).
//
// initdb refuses to run as root: as root the directory is given to the
// `postgres` OS user and the server tools run through `runuser -u postgres`.
// Missing PostgreSQL binaries (Debian: postgresql, see scripts/setup-deps)
// throw, so the tests that need a server fail with that message.
// Options add TLS (a certificate the test made), hostssl-only access and
// password logins for roles other than `postgres`.
//
// Ownership: the object owns the server process and its directory (unless
// keep_running()). Thread safety: none; use it from one thread.

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

struct PostgresTestServerOptions {
  // PEM files of the server's certificate and key: copied into the server's
  // directory (the key with mode 0600, owned by the server's user) and
  // served with ssl=on. Empty: no TLS.
  std::string ssl_cert_file{}, ssl_key_file{};
  // pg_hba.conf takes TCP connections only as hostssl: plain ones are refused.
  bool ssl_only = false;
  // Over TCP, roles other than `postgres` log in with a password
  // (scram-sha-256); `postgres` stays trusted.
  bool passwords = false;
};

class PostgresTestServer {
 public:
  using Options = PostgresTestServerOptions;

  // Creates and starts a server in a fresh temp directory.
  explicit PostgresTestServer(Options options = {}) : options_(std::move(options)) {
    bin_ = find_bin_dir();
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-pg-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("postgres test server: mkdtemp failed");
    dir_ = pattern;
    if (geteuid() == 0) {
      passwd* pw = getpwnam("postgres");
      if (pw == nullptr)
        throw std::runtime_error("postgres test server: running as root and there is no 'postgres' user to "
                                 "run initdb as (install the postgresql package: scripts/setup-deps)");
      if (chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0)
        throw std::runtime_error("postgres test server: cannot chown " + dir_);
      as_ = "runuser -u postgres -- ";
    }
    sh(bin_ + "/initdb -D " + data() + " -A trust -U postgres -E UTF8 --no-sync > " + dir_ + "/initdb.log 2>&1",
       "initdb");
    configure();
    port_ = free_port();
    start();
    // The database the tests use (over the unix socket: TCP may need TLS).
    PGconn* c = PQconnectdb(admin_conninfo("postgres").c_str());
    bool ok = PQstatus(c) == CONNECTION_OK;
    if (ok) {
      PGresult* r = PQexec(c, "CREATE DATABASE troupe_test");
      ok = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
    }
    std::string err = PQerrorMessage(c);
    PQfinish(c);
    if (!ok) throw std::runtime_error("postgres test server: cannot create the database: " + err);
  }
  ~PostgresTestServer() {
    if (keep_) return;
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PostgresTestServer(const PostgresTestServer&) = delete;
  PostgresTestServer& operator=(const PostgresTestServer&) = delete;

  // Starts the (stopped) server again on the same port and data.
  void start() {
    std::string ssl;
    if (!options_.ssl_cert_file.empty())
      ssl = " -c ssl=on -c ssl_cert_file=" + dir_ + "/server.crt -c ssl_key_file=" + dir_ + "/server.key";
    sh(bin_ + "/pg_ctl -D " + data() + " -l " + dir_ + "/server.log -w -t 30 -o \"-c listen_addresses=127.0.0.1 -p " +
           std::to_string(port_) + " -c unix_socket_directories=" + dir_ + ssl + "\" start > /dev/null",
       "pg_ctl start (log: " + dir_ + "/server.log)");
    running_ = true;
  }
  // Stops it (fast shutdown: connections are cut).
  void stop() {
    if (!running_) return;
    running_ = false;
    (void)std::system((as_ + bin_ + "/pg_ctl -D " + data() + " -m fast -w stop > /dev/null 2>&1").c_str());
  }

  std::string conninfo(const std::string& db = "troupe_test") const {
    return "host=127.0.0.1 port=" + std::to_string(port_) + " user=postgres dbname=" + db + " connect_timeout=5";
  }
  // As the trusted `postgres` over the unix socket in dir(), whatever the
  // TCP rules: for the test's own changes (roles, passwords).
  std::string admin_conninfo(const std::string& db = "troupe_test") const {
    return "host=" + dir_ + " port=" + std::to_string(port_) + " user=postgres dbname=" + db;
  }
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  // Leaves the server running and its directory in place when this object
  // goes (stop_and_remove() ends it later, from another process).
  void keep_running() { keep_ = true; }

  // Stops the server whose directory is `dir` and removes the directory.
  static void stop_and_remove(const std::string& dir) {
    std::string as = geteuid() == 0 ? "runuser -u postgres -- " : "";
    (void)std::system((as + find_bin_dir() + "/pg_ctl -D " + dir + "/data -m fast -w stop > /dev/null 2>&1").c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // /usr/lib/postgresql/<newest>/bin, or throws saying what to install.
  static std::string find_bin_dir() {
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec))
      if (std::filesystem::exists(e.path() / "bin" / "initdb") && std::filesystem::exists(e.path() / "bin" / "pg_ctl"))
        found.push_back(e.path() / "bin");
    if (found.empty())
      throw std::runtime_error(
          "postgres test server: no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); install the "
          "Debian package 'postgresql' (scripts/setup-deps does)");
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      return std::stoi(a.parent_path().filename().string()) < std::stoi(b.parent_path().filename().string());
    });
    return found.back().string();
  }

 private:
  std::string data() const { return dir_ + "/data"; }

  // The options' pg_hba.conf and certificate files, before the first start.
  void configure() {
    if (!options_.ssl_cert_file.empty()) {
      namespace fs = std::filesystem;
      fs::copy_file(options_.ssl_cert_file, dir_ + "/server.crt", fs::copy_options::overwrite_existing);
      fs::copy_file(options_.ssl_key_file, dir_ + "/server.key", fs::copy_options::overwrite_existing);
      fs::permissions(dir_ + "/server.key", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
      if (passwd* pw = geteuid() == 0 ? getpwnam("postgres") : nullptr; pw != nullptr)
        for (const char* f : {"/server.crt", "/server.key"})
          if (chown((dir_ + f).c_str(), pw->pw_uid, pw->pw_gid) != 0)
            throw std::runtime_error("postgres test server: cannot chown " + dir_ + f);
    }
    if (!options_.ssl_only && !options_.passwords) return;  // initdb's: trust everywhere
    const std::string tcp = options_.ssl_only ? "hostssl" : "host";
    std::ofstream hba(data() + "/pg_hba.conf", std::ios::trunc);
    hba << "local all all trust\n";
    hba << tcp << " all postgres 127.0.0.1/32 trust\n";
    hba << tcp << " all all 127.0.0.1/32 " << (options_.passwords ? "scram-sha-256" : "trust") << "\n";
    if (!hba) throw std::runtime_error("postgres test server: cannot write pg_hba.conf");
  }
  void sh(const std::string& cmd, const std::string& what) const {
    if (std::system((as_ + cmd).c_str()) != 0) {
      std::string log;
      std::ifstream in(dir_ + "/initdb.log");
      std::getline(in, log, '\0');
      throw std::runtime_error("postgres test server: " + what + " failed: " + log);
    }
  }
  static int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("postgres test server: cannot find a free port");
    ::close(fd);
    return ntohs(a.sin_port);
  }

  Options options_;
  std::string bin_, dir_, as_;
  int port_ = 0;
  bool running_ = false;
  bool keep_ = false;
};

// The server the tests share: the one named by the file in
// TROUPE_TEST_POSTGRES_STATE (first line: its connection string; written by
// the ctest fixture that starts one server for the whole run, see
// postgres_test_server_main.cpp) or, when there is none, one started in this
// process on first use and stopped at exit. Throws when no server can be had.
inline std::string shared_postgres_conninfo() {
  if (const char* env = std::getenv("TROUPE_TEST_POSTGRES_STATE"); env != nullptr && *env != '\0') {
    std::ifstream in(env);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
  }
  static std::mutex mu;
  static std::unique_ptr<PostgresTestServer> server;
  std::lock_guard lk(mu);
  if (!server) server = std::make_unique<PostgresTestServer>();
  return server->conninfo();
}

// A schema name no other test in any process uses.
inline std::string fresh_schema() {
  static std::atomic<unsigned> n{0};
  return "t_" + std::to_string(getpid()) + "_" + std::to_string(n++) + "_" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
}

}  // namespace troupe::test
