// HTTPS: the server and the client over TLS with certificates the test
// makes at run time (the openssl command line, in a temporary directory):
// a round trip, a client refusing a certificate from another CA or for
// another name, the handshake time limit, and a certificate replaced while
// the server runs.

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "http_test_support.hpp"
#include "test_pki.hpp"

namespace troupe::http {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::RawConn;
using testing::TestServer;
namespace fs = std::filesystem;
using testing::Pki;

Router hello() {
  Router r;
  r.add("GET", "/hello", [](Request&, Responder out) { out.respond(Response::text(200, "hello over tls")); });
  return r;
}

TestServer tls_server(const std::string& leaf, ServerSettings settings = {}) {
  const Pki& pki = Pki::get();
  settings.tls_cert_file = (pki / (leaf + ".crt")).string();
  settings.tls_key_file = (pki / (leaf + ".key")).string();
  return TestServer::start(hello(), std::move(settings));
}

Result<Response> get_over_tls(std::uint16_t port, const std::string& ca, const std::string& host = "127.0.0.1",
                              const std::string& server_name = "") {
  ClientSettings cs;
  cs.host = host;
  cs.port = port;
  cs.tls = true;
  cs.tls_ca_file = (Pki::get() / ca).string();
  cs.tls_server_name = server_name;
  cs.connect_timeout = 3s;
  auto c = Client::create(cs);
  if (!c.ok()) return std::move(c).error();
  return (*c)->request_sync("GET", "/hello");
}

TEST(HttpTls, AClientTrustingTheCaTalksToTheServerByAddressAndByName) {
  ASSERT_TRUE(Pki::get().ok) << "openssl could not make the test certificates";
  auto server = tls_server("server");
  ASSERT_TRUE(server.server);
  auto by_ip = get_over_tls(server.port(), "ca-a.crt");
  ASSERT_TRUE(by_ip.ok()) << by_ip.error().to_string();
  EXPECT_EQ(by_ip->status, 200);
  EXPECT_EQ(by_ip->body, "hello over tls");
  auto by_name = get_over_tls(server.port(), "ca-a.crt", "localhost");
  ASSERT_TRUE(by_name.ok()) << by_name.error().to_string();
  EXPECT_EQ(by_name->body, "hello over tls");
  EXPECT_EQ(server->stats().tls_handshakes_failed, 0u);
}

TEST(HttpTls, AClientRefusesACertificateFromAnotherCa) {
  ASSERT_TRUE(Pki::get().ok);
  auto server = tls_server("server-b");
  auto r = get_over_tls(server.port(), "ca-a.crt");
  ASSERT_FALSE(r.ok()) << "a certificate ca-a did not sign";
  EXPECT_EQ(r.error().code(), ErrorCode::unreachable);
  EXPECT_NE(r.error().message().find("certificate verify failed"), std::string::npos) << r.error().message();
  ASSERT_TRUE(eventually([&] { return server->stats().tls_handshakes_failed == 1; }));
}

TEST(HttpTls, AClientRefusesACertificateForAnotherName) {
  ASSERT_TRUE(Pki::get().ok);
  auto server = tls_server("other-name");
  auto by_ip = get_over_tls(server.port(), "ca-a.crt");
  ASSERT_FALSE(by_ip.ok());
  EXPECT_NE(by_ip.error().message().find("IP address mismatch"), std::string::npos) << by_ip.error().message();
  auto by_name = get_over_tls(server.port(), "ca-a.crt", "localhost");
  ASSERT_FALSE(by_name.ok());
  EXPECT_NE(by_name.error().message().find("hostname mismatch"), std::string::npos) << by_name.error().message();
  auto named = get_over_tls(server.port(), "ca-a.crt", "127.0.0.1", "other.example");
  ASSERT_TRUE(named.ok()) << "tls_server_name names the certificate: " << named.error().to_string();
}

TEST(HttpTls, AHandshakeNotDoneInTimeIsClosedAndPlainHttpGetsNoAnswer) {
  ASSERT_TRUE(Pki::get().ok);
  ServerSettings st;
  st.tls_handshake_timeout = 300ms;
  auto server = tls_server("server", st);
  auto silent = RawConn::connect(server.port());
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(silent->wait_closed(5000ms)) << "a client that never says hello";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  auto plain = RawConn::connect(server.port());
  ASSERT_TRUE(plain->write(testing::get("/hello")));
  auto r = plain->read_response(2000ms);
  EXPECT_FALSE(r && r->status == 200) << "plain HTTP on a TLS port is no request";
  ASSERT_TRUE(eventually([&] { return server->stats().tls_handshakes_failed == 2; }));
  EXPECT_GE(server->stats().timeouts, 1u);
  auto fine = get_over_tls(server.port(), "ca-a.crt");
  ASSERT_TRUE(fine.ok()) << "the server serves on: " << fine.error().to_string();
}

TEST(HttpTls, ACertificateReplacedWhileTheServerRunsIsUsedForNewConnections) {
  ASSERT_TRUE(Pki::get().ok);
  const fs::path live = Pki::get() / "live";
  fs::create_directories(live);
  fs::copy_file(Pki::get() / "server.crt", live / "tls.crt", fs::copy_options::overwrite_existing);
  fs::copy_file(Pki::get() / "server.key", live / "tls.key", fs::copy_options::overwrite_existing);
  ServerSettings st;
  st.tls_cert_file = (live / "tls.crt").string();
  st.tls_key_file = (live / "tls.key").string();
  auto server = TestServer::start(hello(), st);
  ASSERT_TRUE(server.server);
  ASSERT_TRUE(get_over_tls(server.port(), "ca-a.crt").ok());
  // The key first, then the certificate: for a moment they do not match,
  // and the server keeps the last pair until they do.
  fs::copy_file(Pki::get() / "server-b.key", live / "tls.key", fs::copy_options::overwrite_existing);
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(get_over_tls(server.port(), "ca-a.crt").ok()) << "a half-replaced pair keeps the old one";
  fs::copy_file(Pki::get() / "server-b.crt", live / "tls.crt", fs::copy_options::overwrite_existing);
  ASSERT_TRUE(eventually([&] { return get_over_tls(server.port(), "ca-b.crt").ok(); }, 5000ms))
      << "the new certificate is served without a restart";
  EXPECT_FALSE(get_over_tls(server.port(), "ca-a.crt").ok());
}

TEST(HttpTls, UnusableTlsSettingsAreRefusedNamingTheFile) {
  ASSERT_TRUE(Pki::get().ok);
  ServerSettings st;
  st.tls_cert_file = (Pki::get() / "absent.crt").string();
  st.tls_key_file = (Pki::get() / "server.key").string();
  auto missing = Server::start(st, hello());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("absent.crt"), std::string::npos) << missing.error().message();
  st.tls_cert_file = (Pki::get() / "server.crt").string();
  st.tls_key_file = (Pki::get() / "server-b.key").string();
  auto mismatch = Server::start(st, hello());
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().message().find("mismatch"), std::string::npos) << mismatch.error().message();
  st.tls_key_file.clear();
  EXPECT_FALSE(Server::start(st, hello()).ok()) << "a certificate without a key";
  ClientSettings cs;
  cs.tls = true;
  cs.tls_ca_file = (Pki::get() / "absent-ca.crt").string();
  auto client = Client::create(cs);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.error().message().find("absent-ca.crt"), std::string::npos) << client.error().message();
}

}  // namespace
}  // namespace troupe::http
