#pragma once
// Certificates for the TLS tests, made at run time with the openssl command
// line in a temporary directory that goes with the object: CAs, and keys
// with certificates signed by one of them, naming whom a test chooses (as
// scripts/make-certs does for a real cluster).

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "troupe/cluster/transport.hpp"

namespace troupe::cluster::testing {

// A directory of test certificates. Not thread-safe; files stay until destruction.
class TestPki {
 public:
  TestPki() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-pki-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
  }
  ~TestPki() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }

  // A self-signed CA: <ca>.crt and <ca>.key.
  void ca(const std::string& ca) {
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=" + ca +
        "' -keyout '" + path(ca + ".key") + "' -out '" + path(ca + ".crt") + "'");
  }

  // <file>.key and <file>.crt signed by `ca`, with subject CN `cn` and,
  // unless `san` is empty, the subjectAltName DNS:<san>.
  void cert(const std::string& ca, const std::string& file, const std::string& cn, const std::string& san) {
    const std::string ext = path(file + ".ext");
    {
      std::ofstream e(ext);
      if (!san.empty()) e << "subjectAltName=DNS:" << san << "\n";
      e << "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n";
    }
    run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=" + cn + "' -keyout '" +
        path(file + ".key") + "' -out '" + path(file + ".csr") + "'");
    run("openssl x509 -req -in '" + path(file + ".csr") + "' -CA '" + path(ca + ".crt") + "' -CAkey '" +
        path(ca + ".key") + "' -CAcreateserial -days 2 -extfile '" + ext + "' -out '" + path(file + ".crt") + "'");
  }

  // A node's certificate named `node` (SAN and CN), signed by `ca`.
  TransportTls node(const std::string& ca, const std::string& node) {
    cert(ca, node, node, node);
    return files(ca, node);
  }

  TransportTls files(const std::string& ca, const std::string& file) const {
    return {.cert_file = path(file + ".crt"), .key_file = path(file + ".key"), .ca_file = path(ca + ".crt")};
  }

 private:
  static void run(const std::string& command) {
    if (std::system((command + " >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("failed: " + command);
  }

  std::string dir_;
};

}  // namespace troupe::cluster::testing
