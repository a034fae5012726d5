// The PostgreSQL journal behind TLS and passwords: sslmode=verify-full
// against a server whose certificate a CA made by the test signed, the
// refusals when the CA is another or TLS is off, and a password that stops
// working while the journal runs (doc/journal.md, "Credentials and TLS").

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "../journal_test_support.hpp"
#include "../../testing/pki.hpp"
#include "postgres_test_server.hpp"
#include "troupe/persist/postgres_journal.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::PostgresJournal;
using troupe::PostgresJournalOptions;

// A temp directory with two CAs (ca, other-ca) and a server certificate
// signed by `ca` for IP:127.0.0.1 and DNS:localhost. Removed with the object.
class TestCertificates : public troupe::testing::Pki {
 public:
  TestCertificates() {
    ca("ca");
    ca("other-ca");
    cert("ca", "server", "localhost", "IP:127.0.0.1,DNS:localhost");
  }
};

troupe::Result<std::shared_ptr<PostgresJournal>> open_journal(const std::string& conninfo,
                                                             int unavailable_timeout_ms = 2000) {
  PostgresJournalOptions o;
  o.conninfo = conninfo;
  o.schema = troupe::test::fresh_schema();
  o.unavailable_timeout_ms = unavailable_timeout_ms;
  return PostgresJournal::open(o);
}

void admin_sql(const troupe::test::PostgresTestServer& server, const std::string& sql) {
  PGconn* c = PQconnectdb(server.admin_conninfo().c_str());
  ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  PGresult* r = PQexec(c, sql.c_str());
  EXPECT_TRUE(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK)
      << PQresultErrorMessage(r);
  PQclear(r);
  PQfinish(c);
}

class PostgresTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs = new TestCertificates();
    server = new troupe::test::PostgresTestServer(
        {.ssl_cert_file = certs->path("server.crt"), .ssl_key_file = certs->path("server.key"), .ssl_only = true});
  }
  static void TearDownTestSuite() {
    delete server;
    delete certs;
  }
  static std::string tcp(const std::string& extra) {
    return "host=127.0.0.1 port=" + std::to_string(server->port()) +
           " user=postgres dbname=troupe_test connect_timeout=5 " + extra;
  }
  static TestCertificates* certs;
  static troupe::test::PostgresTestServer* server;
};
TestCertificates* PostgresTls::certs = nullptr;
troupe::test::PostgresTestServer* PostgresTls::server = nullptr;

TEST_F(PostgresTls, verify_full_against_the_tests_ca_appends_and_reads_back) {
  auto j = open_journal(tcp("sslmode=verify-full sslrootcert=" + certs->path("ca.crt")));
  ASSERT_TRUE(j.ok()) << j.error().to_string();
  ASSERT_TRUE(js::append(**j, batch("tls", 1, 3)).ok());
  auto r = js::replay(**j, "tls");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(seqs(*r), range(1, 3));
  // The connection really is TLS: the server says so for this session.
  PGconn* c = PQconnectdb(tcp("sslmode=verify-full sslrootcert=" + certs->path("ca.crt")).c_str());
  ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  EXPECT_EQ(PQsslInUse(c), 1);
  PQfinish(c);
}

TEST_F(PostgresTls, a_server_certificate_from_another_ca_is_refused_naming_the_verification) {
  auto j = open_journal(tcp("sslmode=verify-full sslrootcert=" + certs->path("other-ca.crt")));
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.error().code(), troupe::ErrorCode::journal_failed);
  EXPECT_NE(j.error().message().find("certificate verify failed"), std::string::npos) << j.error().message();
}

TEST_F(PostgresTls, a_name_the_certificate_does_not_hold_is_refused_under_verify_full) {
  // hostaddr reaches the same server under a name the SAN does not hold.
  std::string conninfo = tcp("sslmode=verify-full sslrootcert=" + certs->path("ca.crt"));
  conninfo.replace(conninfo.find("127.0.0.1"), 9, "localhost");
  ASSERT_TRUE(open_journal(conninfo).ok());  // DNS:localhost is in it
  auto j = open_journal("hostaddr=127.0.0.1 host=db.example.net port=" + std::to_string(server->port()) +
                        " user=postgres dbname=troupe_test connect_timeout=5 sslmode=verify-full sslrootcert=" +
                        certs->path("ca.crt"));
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.error().message().find("does not match host name"), std::string::npos) << j.error().message();
}

TEST_F(PostgresTls, a_plain_connection_to_the_hostssl_only_server_is_refused) {
  auto j = open_journal(tcp("sslmode=disable"));
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.error().code(), troupe::ErrorCode::journal_failed);
  EXPECT_NE(j.error().message().find("no encryption"), std::string::npos) << j.error().message();
}

// The password a journal logs in with stops working while it runs (an
// operator rotates it): writes and reads fail as values naming the
// authentication failure, within the journal's timeout, and work again once
// the password does.
TEST(PostgresCredentials, a_password_that_stops_working_fails_appends_clearly_and_they_resume_after) {
  troupe::test::PostgresTestServer server({.passwords = true});
  admin_sql(server, "CREATE ROLE troupe_app LOGIN PASSWORD 'first-pw-3a9'");
  admin_sql(server, "GRANT ALL ON DATABASE troupe_test TO troupe_app");
  admin_sql(server, "GRANT ALL ON SCHEMA public TO troupe_app");
  // The password from a passfile, not the connection string.
  TestCertificates files;  // only for its temp directory
  const std::string passfile = files.path("pgpass");
  {
    std::ofstream out(passfile);
    out << "127.0.0.1:" << server.port() << ":troupe_test:troupe_app:first-pw-3a9\n";
  }
  ASSERT_EQ(chmod(passfile.c_str(), 0600), 0);
  const std::string conninfo = "host=127.0.0.1 port=" + std::to_string(server.port()) +
                               " user=troupe_app dbname=troupe_test connect_timeout=5 passfile=" + passfile;
  auto opened = open_journal(conninfo, 500);
  ASSERT_TRUE(opened.ok()) << opened.error().to_string();
  auto j = *opened;
  ASSERT_TRUE(js::append(*j, batch("p", 1, 1)).ok());

  admin_sql(server, "ALTER ROLE troupe_app PASSWORD 'second-pw-77b'");
  admin_sql(server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'troupe_app'");
  auto t0 = std::chrono::steady_clock::now();
  auto down = js::append(*j, batch("p", 2, 2));
  auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().code(), troupe::ErrorCode::journal_failed);
  EXPECT_NE(down.error().message().find("password authentication failed"), std::string::npos)
      << down.error().message();
  EXPECT_EQ(down.error().message().find("first-pw"), std::string::npos) << down.error().message();
  EXPECT_LT(waited, 5s) << "the append hung past its timeout";
  // The next one finds no connection to lose: the same cause.
  auto again = js::append(*j, batch("p", 2, 2));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message().find("password authentication failed"), std::string::npos)
      << again.error().message();
  auto read = js::replay(*j, "p");
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.error().message().find("password authentication failed"), std::string::npos)
      << read.error().message();

  admin_sql(server, "ALTER ROLE troupe_app PASSWORD 'first-pw-3a9'");
  troupe::Result<void> up = troupe::Error(troupe::ErrorCode::journal_failed, "not tried");
  for (int i = 0; i < 40 && !up.ok(); ++i) {
    up = js::append(*j, batch("p", 2, 2));
    if (!up.ok()) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(up.ok()) << up.error().to_string();
  auto back = js::replay(*j, "p");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(seqs(*back), range(1, 2));
}

}  // namespace
