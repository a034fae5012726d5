// TLS contexts for the HTTP server and client, and the server's files read
// again when they change: see tls.hpp.

#include "tls.hpp"

#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "troupe/core/log.hpp"

namespace troupe::http::detail {

namespace {

Error bad(std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); }

// OpenSSL's reason for the last failure, or `fallback`.
std::string openssl_reason(const std::string& fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  const char* r = ERR_reason_error_string(e);
  return r ? r : fallback;
}

Result<TlsContext> base_context(ssl::context::method method) {
  auto ctx = std::make_shared<ssl::context>(method);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  if (SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION) != 1)
    return bad("TLS: cannot require TLS 1.2: " + openssl_reason("unknown"));
  return ctx;
}

}  // namespace

Result<TlsContext> server_context(const std::string& cert, const std::string& key) {
  auto ctx = base_context(ssl::context::tls_server);
  if (!ctx.ok()) return ctx;
  SSL_CTX* native = (*ctx)->native_handle();
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(native, cert.c_str()) != 1)
    return bad("TLS certificate " + cert + ": " + openssl_reason("cannot be read"));
  if (SSL_CTX_use_PrivateKey_file(native, key.c_str(), SSL_FILETYPE_PEM) != 1)
    return bad("TLS key " + key + ": " + openssl_reason("cannot be read"));
  if (SSL_CTX_check_private_key(native) != 1)
    return bad("TLS key " + key + " does not match the certificate " + cert);
  return ctx;
}

Result<TlsContext> client_context(const std::string& ca) {
  auto ctx = base_context(ssl::context::tls_client);
  if (!ctx.ok()) return ctx;
  SSL_CTX* native = (*ctx)->native_handle();
  ERR_clear_error();
  if (ca.empty()) {
    if (SSL_CTX_set_default_verify_paths(native) != 1)
      return bad("TLS: the system's trusted certificates cannot be read: " + openssl_reason("unknown"));
  } else if (SSL_CTX_load_verify_locations(native, ca.c_str(), nullptr) != 1) {
    return bad("TLS CA " + ca + ": " + openssl_reason("cannot be read"));
  }
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  return ctx;
}

Result<std::unique_ptr<TlsFiles>> TlsFiles::open(std::string cert, std::string key) {
  std::unique_ptr<TlsFiles> f(new TlsFiles(std::move(cert), std::move(key)));
  f->seen_ = f->stamps();
  auto ctx = server_context(f->cert_, f->key_);
  if (!ctx.ok()) return std::move(ctx).error();
  f->ctx_ = std::move(*ctx);
  f->next_look_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  return f;
}

std::pair<std::optional<TlsFiles::Stamp>, std::optional<TlsFiles::Stamp>> TlsFiles::stamps() const {
  auto one = [](const std::string& path) -> std::optional<Stamp> {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    return Stamp{static_cast<std::int64_t>(st.st_size),
                 static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                 static_cast<std::uint64_t>(st.st_ino)};
  };
  return {one(cert_), one(key_)};
}

TlsContext TlsFiles::current() {
  std::lock_guard lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now < next_look_) return ctx_;
  next_look_ = now + std::chrono::seconds(1);
  auto seen = stamps();
  if (seen == seen_) return ctx_;
  seen_ = seen;
  auto ctx = server_context(cert_, key_);
  if (!ctx.ok()) {
    // A certificate and key replaced one after the other may not match for
    // a moment: the next change is looked at again.
    if (!warned_)
      log::warn(log::Component::net, "TLS certificate changed but does not load; the last one stays",
                {{"reason", ctx.error().message()}});
    warned_ = true;
    return ctx_;
  }
  log::info(log::Component::net, "TLS certificate read again", {{"cert", cert_}});
  warned_ = false;
  ctx_ = std::move(*ctx);
  return ctx_;
}

std::string tls_reason(const beast::error_code& ec) {
  if (ec.category() == boost::asio::error::get_ssl_category()) {
    const char* r = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
    if (r) return r;
  }
  return ec.message();
}

}  // namespace troupe::http::detail
