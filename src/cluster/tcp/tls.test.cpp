// The transport with TLS, in one process: nodes whose certificates chain to
// the CA and name them exchange frames; peers without a certificate, with
// one from another CA, or named otherwise than their HELLO (or than the node
// dialled) are refused before anything of theirs is delivered, counted by
// reason and logged once per address; settings must choose TLS or plain
// TCP; a reload lets a certificate of a new CA in without dropping what is
// up; the handshake limits close connections past them at once.

#include <fstream>

#include "tls_test_support.hpp"
#include "transport_test_support.hpp"

namespace troupe::cluster {
namespace {

using namespace testing;

TransportSettings tls_settings(std::string id, TransportTls files) {
  TransportSettings s = test_settings(std::move(id));
  s.insecure = false;
  s.tls = std::move(files);
  return s;
}

std::size_t occurrences(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void append_file(const std::string& from, const std::string& to) {
  std::ifstream in(from);
  std::ofstream out(to, std::ios::app);
  out << in.rdbuf();
}

class TransportTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki.ca("ca");
    pki.ca("other-ca");
  }
  TestPki pki;
};

TEST_F(TransportTlsTest, NodesWithCertificatesOfTheCaExchangeFramesBothWays) {
  Node a = Node::start(tls_settings("a", pki.node("ca", "a")));
  Node b = Node::start(tls_settings("b", pki.node("ca", "b")));
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));
  const std::string big(1u << 20, 'x');  // many TLS records in one frame
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(a->send("b", 1, "to-b-" + std::to_string(i)).ok());
  ASSERT_TRUE(a->send("b", 2, big).ok());
  ASSERT_TRUE(b->send("a", 1, "to-a").ok());
  ASSERT_TRUE(b.inbox->wait_count(101));
  ASSERT_TRUE(a.inbox->wait_payload("to-a"));
  const auto got = b.inbox->frames();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i].payload, "to-b-" + std::to_string(i));
  EXPECT_EQ(got[100].payload, big);
  EXPECT_EQ(a->stats().refused_peers.total() + b->stats().refused_peers.total(), 0u);
}

// Request and answer, one at a time, over TLS: each side has just received
// something when it sends, so each frame is encrypted and written by its
// sender's own thread.
TEST_F(TransportTlsTest, AnAnswerToAFrameThatJustArrivedIsEncryptedAndWrittenByTheSendingThreadItself) {
  constexpr std::uint64_t kRounds = 200;
  const EchoedRounds run =
      echo_rounds(tls_settings("a", pki.node("ca", "a")), tls_settings("b", pki.node("ca", "b")), kRounds);
  EXPECT_TRUE(run.in_order);
  // A keepalive PING or PONG in flight makes one wait for the io thread.
  EXPECT_GE(run.b.direct_writes, kRounds / 2);
  EXPECT_GE(run.a.direct_writes, kRounds / 2);
}

// Over TLS, frames a sender encrypted and wrote itself, frames the io thread
// batched, and the ciphertext the socket took only in part all keep each
// thread's order, and every frame arrives whole.
TEST_F(TransportTlsTest, FramesWrittenDirectlyAndInBatchesKeepEachThreadsOrder) {
  const StreamsWithAnswers run = stream_with_answers(tls_settings("a", pki.node("ca", "a")),
                                                     tls_settings("b", pki.node("ca", "b")), 10'000, 1'000);
  EXPECT_TRUE(run.all_arrived);
  EXPECT_EQ(run.disorder, 0u);
  EXPECT_EQ(run.a.frames_dropped, 0u);
  EXPECT_EQ(run.a.connections_closed + run.b.connections_closed, 0u);
  EXPECT_GT(run.a.direct_writes, 0u);
  EXPECT_GT(run.b.direct_writes, 0u);
}

// A peer that does not pass is refused before its HELLO is accepted; what it
// queued behind its HELLO never reaches the handler. The attacker says it is
// "a" (the smaller id, so it dials).
TEST_F(TransportTlsTest, PeersWithoutAGoodCertificateAreRefusedByReasonAndLoggedOncePerAddress) {
  Node b = Node::start(tls_settings("b", pki.node("ca", "b")));
  auto try_peer = [&](TransportSettings s) {
    Node a = Node::start(std::move(s));
    a->set_peer("b", "127.0.0.1", b.port());
    (void)a->send("b", 1, "should never arrive");
    std::this_thread::sleep_for(300ms);
  };
  // Plain TCP against TLS.
  try_peer(test_settings("a"));
  EXPECT_TRUE(eventually([&] { return b->stats().refused_peers.tls_handshake >= 1; })) << b.log->all();
  // A certificate from another CA, naming the right node (the attacker
  // trusts b's CA too, so the refusal is b's).
  TransportTls elsewhere = pki.node("other-ca", "a");
  append_file(pki.path("other-ca.crt"), pki.path("both.crt"));
  append_file(pki.path("ca.crt"), pki.path("both.crt"));
  elsewhere.ca_file = pki.path("both.crt");
  try_peer(tls_settings("a", elsewhere));
  EXPECT_TRUE(eventually([&] { return b->stats().refused_peers.untrusted_certificate >= 1; })) << b.log->all();
  // A good certificate naming another node than the HELLO's: claims to be
  // "a" with the certificate of "x".
  pki.cert("ca", "x", "x", "x");
  try_peer(tls_settings("a", pki.files("ca", "x")));
  EXPECT_TRUE(eventually([&] { return b->stats().refused_peers.name_mismatch >= 1; })) << b.log->all();
  // A certificate whose CN names the node but whose DNS SAN does not: the SAN decides.
  pki.cert("ca", "cn-only", "a", "y");
  try_peer(tls_settings("a", pki.files("ca", "cn-only")));
  EXPECT_TRUE(eventually([&] { return b->stats().refused_peers.name_mismatch >= 2; })) << b.log->all();

  EXPECT_EQ(b.inbox->count(), 0u);
  EXPECT_EQ(b->stats().frames_received, 0u);
  EXPECT_EQ(b->stats().handshakes, 0u);
  EXPECT_FALSE(b->connected("a"));
  // Every refusal came from 127.0.0.1: logged once within the minute, all counted.
  const std::string log = b.log->all();
  EXPECT_EQ(occurrences(log, "refused connection"), 1u) << log;
  EXPECT_GE(b->stats().refused_peers.total(), 4u);
}

TEST_F(TransportTlsTest, ACertificateWithoutDnsNamesIsCheckedByItsCommonName) {
  Node a = Node::start(tls_settings("a", pki.node("ca", "a")));
  pki.cert("ca", "b-cn", "b", "");
  Node b = Node::start(tls_settings("b", pki.files("ca", "b-cn")));
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b)) << a.log->all() << b.log->all();
}

// The dialler checks whom it reached: a node answering with a certificate
// of the CA that names another node gets nothing from it.
TEST_F(TransportTlsTest, TheDiallerRefusesANodeWhoseCertificateNamesAnotherNode) {
  Node a = Node::start(tls_settings("a", pki.node("ca", "a")));
  pki.cert("ca", "z", "z", "z");
  Node b = Node::start(tls_settings("b", pki.files("ca", "z")));
  introduce(a, b);
  ASSERT_TRUE(a->send("b", 1, "secret").ok());
  EXPECT_TRUE(eventually([&] { return a->stats().refused_peers.name_mismatch >= 1; })) << a.log->all();
  // The refusal is counted before it is logged.
  EXPECT_TRUE(eventually([&] { return a.log->contains("not 'b'"); })) << a.log->all();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(b.inbox->count(), 0u);
  EXPECT_FALSE(a->connected("b"));
}

TEST_F(TransportTlsTest, SettingsChooseTlsOrPlainTcpExplicitlyAndTheFilesMustBeUsable) {
  auto handler = [](std::string_view, std::uint32_t, std::string_view) {};
  TransportSettings neither = test_settings("a");
  neither.insecure = false;
  auto r = Transport::start(neither, handler);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("insecure"), std::string::npos) << r.error().message();

  TransportSettings both = tls_settings("a", pki.node("ca", "a"));
  both.insecure = true;
  EXPECT_FALSE(Transport::start(both, handler).ok());

  TransportTls missing = pki.files("ca", "a");
  missing.key_file = pki.path("nowhere.key");
  r = Transport::start(tls_settings("a", missing), handler);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("nowhere.key"), std::string::npos) << r.error().message();

  TransportTls wrong_key = pki.files("ca", "a");
  pki.node("ca", "k");
  wrong_key.key_file = pki.path("k.key");
  r = Transport::start(tls_settings("a", wrong_key), handler);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("does not belong"), std::string::npos) << r.error().message();

  Node plain = Node::start("p");
  EXPECT_FALSE(plain->reload_tls().ok());
}

// A CA rotation: b learns the new CA (its CA file now holds both) and
// reloads; c, whose certificate is from the new CA, is then accepted, and
// a's connection, made before, stays up throughout.
void reload_admits_new_ca(TestPki& pki, bool by_poll) {
  pki.ca("new-ca");
  // b is "s" here: both a and c dial it (the smaller id dials).
  TransportSettings sb = tls_settings("s", pki.node("ca", "s"));
  if (by_poll) sb.tls_poll_interval = 100ms;
  Node b = Node::start(sb);
  Node a = Node::start(tls_settings("a", pki.node("ca", "a")));
  introduce(a, b);
  ASSERT_TRUE(both_connected(a, b));

  TransportSettings sc = tls_settings("c", pki.node("new-ca", "c"));
  append_file(pki.path("ca.crt"), pki.path("new-ca.crt"));  // c trusts both: b's certificate is of the old CA
  Node c = Node::start(sc);
  c->set_peer("s", "127.0.0.1", b.port());
  ASSERT_TRUE(eventually([&] { return b->stats().refused_peers.untrusted_certificate >= 1; })) << b.log->all();
  EXPECT_FALSE(c->connected("s"));

  append_file(pki.path("new-ca.crt"), pki.path("ca.crt"));
  if (by_poll) {
    ASSERT_TRUE(eventually([&] { return b->stats().tls_reloads >= 1; })) << b.log->all();
    EXPECT_TRUE(b.log->contains("TLS files changed: reloaded")) << b.log->all();
  } else {
    ASSERT_TRUE(b->reload_tls().ok());
    EXPECT_EQ(b->stats().tls_reloads, 1u);
  }
  ASSERT_TRUE(eventually([&] { return c->connected("s") && b->connected("c"); })) << b.log->all() << c.log->all();
  ASSERT_TRUE(c->send("s", 1, "from c").ok());
  ASSERT_TRUE(b.inbox->wait_payload("from c"));
  // a's connection was never dropped nor replaced.
  EXPECT_TRUE(a->connected("s"));
  EXPECT_EQ(a->stats().connections_closed, 0u);
  EXPECT_EQ(a->stats().handshakes, 1u);
  ASSERT_TRUE(a->send("s", 1, "from a").ok());
  ASSERT_TRUE(b.inbox->wait_payload("from a"));
}

TEST_F(TransportTlsTest, ReloadLetsACertificateOfANewCaInAndKeepsTheConnectionsUp) {
  reload_admits_new_ca(pki, false);
}

TEST_F(TransportTlsTest, AChangeOfTheFilesIsReloadedByThePoll) { reload_admits_new_ca(pki, true); }

TEST_F(TransportTlsTest, AReloadOfUnusableFilesKeepsTheOldOnes) {
  Node b = Node::start(tls_settings("b", pki.node("ca", "b")));
  { std::ofstream(pki.path("b.key"), std::ios::trunc) << "not a key\n"; }
  EXPECT_FALSE(b->reload_tls().ok());
  EXPECT_EQ(b->stats().tls_reload_failures, 1u);
  Node a = Node::start(tls_settings("a", pki.node("ca", "a")));
  introduce(a, b);
  EXPECT_TRUE(both_connected(a, b)) << b.log->all();
}

// --- limits ---------------------------------------------------------------------------

int connect_from(const char* source, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << std::strerror(errno);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << std::strerror(errno);
  return fd;
}

// Whether the peer closed fd (read gives 0 or an error) within `within`.
bool closed_by_peer(int fd, Duration within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(within).count())) <= 0)
    return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

TEST(TransportLimits, ConnectionsInHandshakeAreBoundedPerAddressAndInTotal) {
  TransportSettings s = test_settings("b");
  s.max_handshakes_per_address = 3;
  s.max_handshakes = 5;
  s.handshake_timeout = 20s;  // the held ones stay held for the test
  Node b = Node::start(s);
  std::vector<int> local, other;
  for (int i = 0; i < 3; ++i) local.push_back(connect_from("127.0.0.1", b.port()));
  ASSERT_TRUE(eventually([&] { return b->stats().connections_accepted >= 3; }));
  const int over_address = connect_from("127.0.0.1", b.port());
  EXPECT_TRUE(closed_by_peer(over_address, 10s));
  EXPECT_EQ(b->stats().refused_peers.over_address_limit, 1u);
  for (int i = 0; i < 2; ++i) other.push_back(connect_from("127.0.0.2", b.port()));
  ASSERT_TRUE(eventually([&] { return b->stats().connections_accepted >= 6; }));
  const int over_total = connect_from("127.0.0.2", b.port());
  EXPECT_TRUE(closed_by_peer(over_total, 10s));
  EXPECT_EQ(b->stats().refused_peers.over_total_limit, 1u);
  // The held ones are not closed by the limit.
  for (int fd : local) EXPECT_FALSE(closed_by_peer(fd, 0ms));
  // One that finishes its handshake frees its place: a member gets in.
  ::close(local[0]);
  Node a = Node::start("a");
  introduce(a, b);
  EXPECT_TRUE(both_connected(a, b)) << b.log->all();
  for (int fd : local) ::close(fd);
  for (int fd : other) ::close(fd);
  ::close(over_address);
  ::close(over_total);
}

TEST(TransportLimits, TheHandshakeTimeoutCoversTheTlsHandshake) {
  TestPki pki;
  pki.ca("ca");
  TransportSettings s = tls_settings("b", pki.node("ca", "b"));
  s.handshake_timeout = 300ms;
  Node b = Node::start(s);
  const int fd = connect_from("127.0.0.1", b.port());
  ASSERT_EQ(::send(fd, "\x16\x03", 2, MSG_NOSIGNAL), 2);  // the start of a ClientHello, then nothing
  EXPECT_TRUE(closed_by_peer(fd, 10s));
  EXPECT_TRUE(eventually([&] { return b->stats().closed_for_bad_input.handshake_timeout == 1; }));
  EXPECT_TRUE(b.log->wait_for("no TLS handshake and HELLO within 300 ms")) << b.log->all();
  ::close(fd);
}

}  // namespace
}  // namespace troupe::cluster
