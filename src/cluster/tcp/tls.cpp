// TLS contexts from PEM files and the names in a peer's certificate; see
// tls.hpp.

#include "transport_impl.hpp"  // first: it includes Asio first

#include "tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

namespace troupe::cluster::tcp {

std::string openssl_reason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

Result<std::shared_ptr<asio::ssl::context>> make_tls_context(const TransportTls& files) {
  auto bad = [](std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); };
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty())
    return bad("tls: cert, key and ca are all needed");
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX* native = ctx->native_handle();
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION) != 1)
    return bad("tls: TLS 1.3 is not available: " + openssl_reason());
  // Every connection lives long and is made once: no resumption tickets.
  SSL_CTX_set_num_tickets(native, 0);
  SSL_CTX_set_options(native, SSL_OP_NO_TICKET);
  if (SSL_CTX_use_certificate_chain_file(native, files.cert_file.c_str()) != 1)
    return bad("tls: cannot read the certificate chain '" + files.cert_file + "': " + openssl_reason());
  if (SSL_CTX_use_PrivateKey_file(native, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    return bad("tls: the private key '" + files.key_file + "' cannot be read or does not belong to the certificate '" +
               files.cert_file + "': " + openssl_reason());
  if (SSL_CTX_check_private_key(native) != 1)
    return bad("tls: the key '" + files.key_file + "' does not belong to the certificate '" + files.cert_file +
               "': " + openssl_reason());
  if (SSL_CTX_load_verify_locations(native, files.ca_file.c_str(), nullptr) != 1)
    return bad("tls: cannot read the CA file '" + files.ca_file + "': " + openssl_reason());
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

std::vector<std::string> peer_certificate_names(SSL* ssl) {
  std::vector<std::string> names;
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return names;
  auto* sans = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
      if (g->type != GEN_DNS) continue;
      const ASN1_STRING* s = g->d.dNSName;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                         static_cast<std::size_t>(ASN1_STRING_length(s)));
    }
    GENERAL_NAMES_free(sans);
  }
  if (!names.empty()) return names;
  X509_NAME* subject = X509_get_subject_name(cert);
  for (int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); at >= 0;
       at = X509_NAME_get_index_by_NID(subject, NID_commonName, at)) {
    const ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                       static_cast<std::size_t>(ASN1_STRING_length(s)));
  }
  return names;
}

std::vector<long long> tls_file_times(const TransportTls& files) {
  std::vector<long long> out;
  for (const std::string* f : {&files.cert_file, &files.key_file, &files.ca_file}) {
    struct stat st {};
    if (::stat(f->c_str(), &st) != 0) st = {};
    out.push_back(st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec);
    out.push_back(static_cast<long long>(st.st_ino));
    out.push_back(static_cast<long long>(st.st_size));
  }
  return out;
}

}  // namespace troupe::cluster::tcp
