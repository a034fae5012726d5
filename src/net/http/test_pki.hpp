#pragma once
// Certificates for the TLS tests, made at run time with the openssl command
// line in a temporary directory (no key is ever committed): two CAs, "ca-a"
// and "ca-b", and leaf certificates they sign. Used by the net, node and
// troupectl tests.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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
    dir = std::filesystem::temp_directory_path() / ("troupe-tls-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    ok = ca("ca-a") && ca("ca-b") && leaf("server", "ca-a", "DNS:localhost,IP:127.0.0.1") &&
         leaf("other-name", "ca-a", "DNS:other.example") && leaf("server-b", "ca-b", "DNS:localhost,IP:127.0.0.1");
  }
  ~Pki() { std::filesystem::remove_all(dir); }
  bool run(const std::string& cmd) const {
    return std::system(("cd '" + dir.string() + "' && " + cmd + " >openssl.log 2>&1").c_str()) == 0;
  }
  bool ca(const std::string& name) const {
    return run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=" + name +
               " -keyout " + name + ".key -out " + name + ".crt");
  }
  bool leaf(const std::string& name, const std::string& ca_name, const std::string& san) const {
    std::ofstream(dir / (name + ".ext")) << "subjectAltName=" << san << "\n";
    return run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" + name + " -keyout " +
               name + ".key -out " + name + ".csr") &&
           run("openssl x509 -req -in " + name + ".csr -CA " + ca_name + ".crt -CAkey " + ca_name +
               ".key -CAcreateserial -days 2 -extfile " + name + ".ext -out " + name + ".crt");
  }
};

}  // namespace troupe::http::testing
