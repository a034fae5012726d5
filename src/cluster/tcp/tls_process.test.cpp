// Attacks on a node's cluster port from other processes: tls_test_node
// processes as the node and its member, `openssl s_client` as strangers
// with no certificate, a certificate of another CA, or a good certificate
// whose name is not the id of the HELLO they send (each sends a HELLO and a
// DATA frame right behind it); then a flood of connections and slow-loris
// connections from another address while the members exchange frames.

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <sstream>

#include "../sharding/node_process.hpp"
#include "tls_test_support.hpp"
#include "transport_test_support.hpp"

namespace troupe::cluster {
namespace {

using namespace testing;
using proc::NodeProcess;

// The counters a tls_test_node last wrote.
std::map<std::string, std::uint64_t> read_stats(const std::string& path) {
  std::map<std::string, std::uint64_t> out;
  std::ifstream in(path);
  std::string key;
  std::uint64_t v;
  while (in >> key >> v) out[key] = v;
  return out;
}

std::vector<std::string> tls_args(const TestPki& pki, const std::string& ca, const std::string& file) {
  return {"--cert", pki.path(file + ".crt"), "--key", pki.path(file + ".key"), "--ca", pki.path(ca + ".crt")};
}

// A process reading its stdin from a file; killed when destroyed.
class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& input) {
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int in = ::open(input.c_str(), O_RDONLY);
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(in, 0);
      dup2(null, 1);
      dup2(null, 2);
      execvp(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~Child() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

 private:
  pid_t pid_ = -1;
};

class ClusterPortAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    pki.ca("ca");
    pki.ca("other-ca");
    pki.node("ca", "a");
    pki.node("ca", "b");
  }
  // b, the node attacked, and a, its member; a dials b and both send a
  // frame every 10 ms to the other.
  void start_members(std::vector<std::string> b_extra = {}) {
    auto bargs = tls_args(pki, "ca", "b");
    bargs.insert(bargs.end(), {"--stats", pki.path("b.stats"), "--send-to", "a"});
    bargs.insert(bargs.end(), b_extra.begin(), b_extra.end());
    b = std::make_unique<NodeProcess>(TROUPE_TLS_TEST_NODE, "b", bargs);
    auto aargs = tls_args(pki, "ca", "a");
    aargs.insert(aargs.end(), {"--stats", pki.path("a.stats"), "--send-to", "b", "--peer",
                               "b:" + std::to_string(b->port())});
    a = std::make_unique<NodeProcess>(TROUPE_TLS_TEST_NODE, "a", aargs);
    ASSERT_TRUE(eventually([&] { return stat_b("delivered_from_a") >= 5 && stat_a("delivered_from_b") >= 5; }))
        << "members never exchanged frames";
  }
  std::uint64_t stat_b(const std::string& k) { return read_stats(pki.path("b.stats"))[k]; }
  std::uint64_t stat_a(const std::string& k) { return read_stats(pki.path("a.stats"))[k]; }

  TestPki pki;
  std::unique_ptr<NodeProcess> b, a;
};

// A stranger's bytes: a HELLO claiming `id`, then a DATA frame.
std::string attack_bytes(const std::string& id) {
  std::string bytes;
  tcp::append_hello(bytes, 0x1234, id);
  append_data_frame(bytes, 1, "attack from a stranger");
  return bytes;
}

// proves: S1
TEST_F(ClusterPortAttack, StrangersWithoutAGoodCertificateAreRefusedBeforeAnythingIsDelivered) {
  ASSERT_NO_FATAL_FAILURE(start_members());
  const std::string port = std::to_string(b->port());
  pki.cert("other-ca", "a-elsewhere", "a", "a");  // names a member, from another CA
  pki.cert("ca", "mallory", "mallory", "mallory");  // good, but not named as its HELLO says
  struct Attack {
    std::string name;
    std::vector<std::string> cert;  // s_client's -cert/-key
    std::string hello_id;
    std::string counter;
  };
  const std::vector<Attack> attacks = {
      {"no certificate", {}, "c", "refused_no_certificate"},
      {"another CA", {"-cert", pki.path("a-elsewhere.crt"), "-key", pki.path("a-elsewhere.key")}, "a",
       "refused_untrusted_certificate"},
      {"name not the HELLO's", {"-cert", pki.path("mallory.crt"), "-key", pki.path("mallory.key")}, "a",
       "refused_name_mismatch"},
  };
  for (const auto& at : attacks) {
    SCOPED_TRACE(at.name);
    const std::string input = pki.path("attack.bin");
    { std::ofstream(input, std::ios::binary | std::ios::trunc) << attack_bytes(at.hello_id); }
    std::vector<std::string> argv = {"openssl", "s_client", "-quiet", "-tls1_3", "-connect", "127.0.0.1:" + port,
                                     "-CAfile", pki.path("ca.crt")};
    argv.insert(argv.end(), at.cert.begin(), at.cert.end());
    const std::uint64_t before = stat_b(at.counter);
    Child client(argv, input);
    EXPECT_TRUE(eventually([&] { return stat_b(at.counter) > before; }, 20s)) << at.counter;
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(stat_b("attack_delivered"), 0u);
  EXPECT_EQ(stat_b("delivered_from_c"), 0u);
  EXPECT_EQ(stat_b("delivered"), stat_b("delivered_from_a"));
  // The member whose name was borrowed was never displaced.
  EXPECT_EQ(stat_b("handshakes"), 1u);
  EXPECT_EQ(stat_b("connected_a"), 1u);
  const auto later = stat_b("delivered_from_a") + 5;
  EXPECT_TRUE(eventually([&] { return stat_b("delivered_from_a") >= later; }));
}

// Non-blocking connections from `source` to 127.0.0.1:port.
int open_from(const char* source, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  (void)::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
  return fd;
}

// proves: S3
TEST_F(ClusterPortAttack, AFloodAndSlowLorisFromAnotherAddressLeaveTheMembersExchangingFrames) {
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  lim.rlim_cur = lim.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
  ASSERT_GE(lim.rlim_cur, 1200u) << "the test needs 1,100 descriptors";
  ASSERT_NO_FATAL_FAILURE(start_members());

  std::vector<int> flood, loris;
  for (int i = 0; i < 1000; ++i) flood.push_back(open_from("127.0.0.2", b->port()));
  for (int i = 0; i < 100; ++i) loris.push_back(open_from("127.0.0.2", b->port()));
  // For 6 s the slow-loris connections trickle a ClientHello a byte at a
  // time (one connection is reopened when the node closes it), while each
  // second must see frames delivered both ways between the members.
  const std::string hello = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
  std::vector<std::size_t> at(loris.size(), 0);
  std::uint64_t last_ab = stat_b("delivered_from_a"), last_ba = stat_a("delivered_from_b");
  int quiet_seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  auto next_check = start + 1s;
  std::size_t reopened = 0;
  while (std::chrono::steady_clock::now() - start < 6s) {
    for (std::size_t i = 0; i < loris.size(); ++i) {
      const char byte = hello[at[i] % hello.size()];
      if (::send(loris[i], &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
        ++at[i];
      } else if (errno != EAGAIN && errno != ENOTCONN && errno != EINPROGRESS) {
        ::close(loris[i]);
        loris[i] = open_from("127.0.0.2", b->port());
        ++reopened;
      }
    }
    if (std::chrono::steady_clock::now() >= next_check) {
      next_check += 1s;
      const auto ab = stat_b("delivered_from_a"), ba = stat_a("delivered_from_b");
      if (ab == last_ab || ba == last_ba) ++quiet_seconds;
      last_ab = ab;
      last_ba = ba;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(quiet_seconds, 0) << "a second passed without frames between the members";
  EXPECT_GT(stat_b("refused_over_address_limit"), 900u);
  EXPECT_EQ(stat_b("handshakes"), 1u);  // the members' connection never dropped
  EXPECT_EQ(stat_a("connected_b"), 1u);
  EXPECT_EQ(stat_b("attack_delivered"), 0u);
  for (int fd : flood) ::close(fd);
  for (int fd : loris) ::close(fd);
  std::printf("refused over the address limit: %llu, handshake timeouts: %llu, slow-loris reopened: %zu\n",
              static_cast<unsigned long long>(stat_b("refused_over_address_limit")),
              static_cast<unsigned long long>(stat_b("handshake_timeouts")), reopened);
}

}  // namespace
}  // namespace troupe::cluster
