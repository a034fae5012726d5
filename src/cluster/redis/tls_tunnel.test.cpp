// Redis over TLS through a local stunnel, the recipe doc/redis.md gives
// for hiredis 0.14 (which has no TLS): a coordinator reaches a Redis that
// listens with TLS only, through the tunnel, and a tunnel that does not
// trust the server's certificate leaves it unable to start.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>

#include "../../testing/pki.hpp"
#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

// A CA, another CA and a certificate for localhost/127.0.0.1 signed by the
// first, in `dir`: ca.crt, other.crt, redis.crt and redis.key.
void make_certificates(const std::string& dir) {
  const troupe::testing::Pki pki(dir);
  pki.ca("ca");
  pki.ca("other");
  pki.cert("ca", "redis", "localhost", "DNS:localhost,IP:127.0.0.1");
}

// One stunnel client process, as doc/redis.md configures it: accepts on a
// free port of 127.0.0.1, connects to the TLS port, verifies against `ca`.
// Owns the process; kills it in the destructor.
class Stunnel {
 public:
  Stunnel(const std::string& dir, const std::string& name, int tls_port, const std::string& ca) {
    port_ = RedisTestServer::free_port();
    const std::string conf = dir + "/" + name + ".conf";
    std::ofstream(conf) << "foreground = yes\n"
                        << "output = " << dir << "/" << name << ".log\n"
                        << "[troupe-redis]\n"
                        << "client = yes\n"
                        << "accept = 127.0.0.1:" << port_ << "\n"
                        << "connect = 127.0.0.1:" << tls_port << "\n"
                        << "verifyChain = yes\n"
                        << "CAfile = " << ca << "\n"
                        << "checkHost = localhost\n";
    std::string bin = "/usr/bin/stunnel4";
    if (::access(bin.c_str(), X_OK) != 0)
      throw std::runtime_error("no stunnel: install the Debian package 'stunnel4' (scripts/setup-deps --tests)");
    pid_ = spawn_quietly({bin, conf});
    // Listening once a TCP connect succeeds.
    for (int i = 0; i < 500; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(port_));
      bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (up) return;
      std::this_thread::sleep_for(10ms);
    }
    throw std::runtime_error("stunnel did not listen on port " + std::to_string(port_));
  }
  ~Stunnel() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  Stunnel(const Stunnel&) = delete;
  Stunnel& operator=(const Stunnel&) = delete;
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// A Redis with a TLS port (its plain port stays for the test's own client).
class RedisOverStunnel : public RedisCoordinatorTest {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-redis-tls-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir = pattern;
    make_certificates(dir);
    redis = std::make_unique<RedisTestServer>(
        RedisTestServer::Options{.tls_cert_file = dir + "/redis.crt", .tls_key_file = dir + "/redis.key"});
  }
  void TearDown() override {
    RedisCoordinatorTest::TearDown();
    std::error_code e;
    std::filesystem::remove_all(dir, e);
  }
  std::string dir;
};

TEST_F(RedisOverStunnel, ACoordinatorReachesATlsOnlyRedisThroughTheTunnel) {
  // The TLS port takes no plain RESP: whatever reaches Redis there was TLS.
  EXPECT_THROW(RedisTestClient(redis->tls_port()).cmd({"PING"}), std::runtime_error);
  Stunnel tunnel(dir, "good", redis->tls_port(), dir + "/ca.crt");
  auto& a = start_node(make_node(settings("node-a", tunnel.port())));
  auto placed = await(a->assign("workers", "w1", ""));
  ASSERT_TRUE(placed.ok()) << placed.error().to_string();
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }));
  EXPECT_FALSE(a->is_fenced());
}

TEST_F(RedisOverStunnel, ATunnelThatDoesNotTrustTheServerLeavesTheCoordinatorUnableToStart) {
  Stunnel tunnel(dir, "untrusting", redis->tls_port(), dir + "/other.crt");
  auto& a = make_node(settings("node-a", tunnel.port()));
  auto r = await(a->start());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::coordination_failed);
  std::ifstream in(dir + "/untrusting.log");
  std::string log;
  std::getline(in, log, '\0');
  EXPECT_NE(log.find("certificate verify failed"), std::string::npos) << log;
}

}  // namespace
}  // namespace troupe::test
