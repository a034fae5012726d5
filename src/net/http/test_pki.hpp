#pragma once
// Certificates for the TLS tests, made at run time with the openssl command
// line in a temporary directory (no key is ever committed): two CAs, "ca-a"
// and "ca-b", and leaf certificates they sign. Used by the net, node and
// troupectl tests.

#include <filesystem>
#include <string>

#include "../../testing/pki.hpp"

namespace troupe::http::testing {

// Made once per test process; the directory goes when the process ends.
//   server      ca-a, DNS:localhost, IP:127.0.0.1
//   other-name  ca-a, DNS:other.example
//   server-b    ca-b, DNS:localhost, IP:127.0.0.1
// Each as <name>.crt and <name>.key (PEM); the CAs as ca-a.crt, ca-b.crt.
class Pki {
 public:
  static const Pki& get() {
    static const Pki pki;
    return pki;
  }
  std::filesystem::path dir;
  bool ok = true;

  std::filesystem::path operator/(const std::string& name) const { return dir / name; }

 private:
  Pki() {
    dir = files_.dir();
    try {
      files_.ca("ca-a");
      files_.ca("ca-b");
      files_.cert("ca-a", "server", "server", "DNS:localhost,IP:127.0.0.1");
      files_.cert("ca-a", "other-name", "other-name", "DNS:other.example");
      files_.cert("ca-b", "server-b", "server-b", "DNS:localhost,IP:127.0.0.1");
    } catch (const std::exception&) {
      ok = false;
    }
  }
  troupe::testing::Pki files_;
};

}  // namespace troupe::http::testing
