#pragma once
// The transport's TLS pieces that do not touch a connection: building an
// OpenSSL context from the PEM files of TransportTls (TLS 1.3 only, the
// peer's certificate required and verified against the CA), reading the
// names a peer's certificate gives, and the files' modification times for
// the reload poll. Private to src/cluster/tcp; include after
// transport_impl.hpp's Asio headers.

#include <memory>
#include <string>
#include <vector>

#include "troupe/cluster/transport.hpp"
#include "troupe/core/result.hpp"

typedef struct ssl_st SSL;

namespace troupe::cluster::tcp {

// The first error OpenSSL queued on this thread, as text; clears the queue.
std::string openssl_reason();

// A context for both directions (dialling and accepting). Errors:
// invalid_argument naming the file that cannot be read or the key that does
// not belong to the certificate.
Result<std::shared_ptr<asio::ssl::context>> make_tls_context(const TransportTls& files);

// The names the peer's certificate gives: its DNS subjectAltNames, or its
// subject's common name when it has no DNS SAN. Empty without a certificate.
std::vector<std::string> peer_certificate_names(SSL* ssl);

// The three files' modification times, inodes and sizes (zeros for a file
// that cannot be read), to notice a change.
std::vector<long long> tls_file_times(const TransportTls& files);

}  // namespace troupe::cluster::tcp
