#pragma once
// Certificates for the TLS tests, made at run time with the openssl command
// line in a temporary directory that goes with the object: CAs, and keys
// with certificates signed by one of them, naming whom a test chooses (as
// scripts/make-certs does for a real cluster).

#include <string>

#include "../../testing/pki.hpp"
#include "troupe/cluster/transport.hpp"

namespace troupe::cluster::testing {

// A directory of test certificates (troupe::testing::Pki) and the
// transport's TLS settings made of them. Not thread-safe; files stay until
// destruction.
class TestPki : public troupe::testing::Pki {
 public:
  // <file>.key and <file>.crt signed by `ca`, with subject CN `cn` and,
  // unless `san` is empty, the subjectAltName DNS:<san>.
  void cert(const std::string& ca, const std::string& file, const std::string& cn, const std::string& san) {
    Pki::cert(ca, file, cn, san.empty() ? "" : "DNS:" + san);
  }

  // A node's certificate named `node` (SAN and CN), signed by `ca`.
  TransportTls node(const std::string& ca, const std::string& node) {
    cert(ca, node, node, node);
    return files(ca, node);
  }

  TransportTls files(const std::string& ca, const std::string& file) const {
    return {.cert_file = path(file + ".crt"), .key_file = path(file + ".key"), .ca_file = path(ca + ".crt")};
  }
};

}  // namespace troupe::cluster::testing
