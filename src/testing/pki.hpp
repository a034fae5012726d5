#pragma once
// Certificates for the tests of every layer that speaks TLS (the cluster
// transport, the HTTP ports, Redis through stunnel, PostgreSQL), made at run
// time with the openssl command line, so no key is ever committed: CAs, and
// keys with certificates one of them signs (ECDSA P-256, valid two days),
// as scripts/make-certs makes them for a real cluster.
//
//   troupe::testing::Pki pki;                       // a fresh temporary directory
//   pki.ca("ca");                                   // ca.crt, ca.key
//   pki.cert("ca", "server", "localhost", "DNS:localhost,IP:127.0.0.1");
//   pki.path("server.crt")
//
// Test-only; not thread-safe. A failing openssl command throws with its output.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace troupe::testing {

class Pki {
 public:
  // A fresh temporary directory, removed with the object.
  Pki() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-pki-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    owned_ = true;
  }
  // Files go into `dir`, which the caller owns and removes.
  explicit Pki(std::string dir) : dir_(std::move(dir)) {}
  ~Pki() {
    std::error_code ignored;
    if (owned_) std::filesystem::remove_all(dir_, ignored);
  }
  Pki(const Pki&) = delete;
  Pki& operator=(const Pki&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }

  // A self-signed CA: <name>.crt and <name>.key, subject CN <name>.
  void ca(const std::string& name) const {
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=" + name +
        "' -keyout '" + path(name + ".key") + "' -out '" + path(name + ".crt") + "'");
  }

  // <file>.key and <file>.crt signed by CA `ca`, subject CN `cn`, for client
  // and server use, with the subjectAltName `san` as openssl writes it
  // ("DNS:localhost,IP:127.0.0.1"); an empty `san`: none.
  void cert(const std::string& ca, const std::string& file, const std::string& cn, const std::string& san) const {
    const std::string ext = path(file + ".ext");
    {
      std::ofstream e(ext);
      if (!san.empty()) e << "subjectAltName=" << san << "\n";
      e << "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n";
    }
    run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=" + cn + "' -keyout '" +
        path(file + ".key") + "' -out '" + path(file + ".csr") + "'");
    run("openssl x509 -req -in '" + path(file + ".csr") + "' -CA '" + path(ca + ".crt") + "' -CAkey '" +
        path(ca + ".key") + "' -CAcreateserial -days 2 -extfile '" + ext + "' -out '" + path(file + ".crt") + "'");
  }

 private:
  void run(const std::string& command) const {
    const std::string log = path("openssl.log");
    if (std::system((command + " >'" + log + "' 2>&1").c_str()) != 0) {
      std::ifstream in(log);
      std::string output;
      std::getline(in, output, '\0');
      throw std::runtime_error("'" + command + "' failed: " + output);
    }
  }

  std::string dir_;
  bool owned_ = false;
};

}  // namespace troupe::testing
