// The TCP transport's defences, on the io thread unless said otherwise: a
// connection's TLS channel (OpenSSL over memory BIOs, which senders use too
// once the connection is established), its TLS handshake, and the check that a peer's certificate
// names the node it claims (or was dialled as), refusals counted and logged
// at most once per address per minute, the bounds on accepted connections
// still in their handshake, and certificate reload (reload_tls() from any
// thread, and a poll of the files' modification times).

#include "transport_impl.hpp"  // first: it includes Asio first

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <sys/socket.h>

#include <algorithm>
#include <new>

#include "tls.hpp"

namespace troupe::cluster {

namespace {

constexpr std::array<const char*, 6> kRefusedNames = {
    "tls_handshake", "no_certificate", "untrusted_certificate", "name_mismatch", "over_address_limit", "over_total_limit",
};

// Refusals are logged at most once per address in this long.
constexpr auto kRefusalLogEvery = std::chrono::minutes(1);
// Past this many addresses remembered, those not logged within a minute are forgotten.
constexpr std::size_t kRefusalLogAddresses = 4096;

}  // namespace

// --- settings (start-up, any thread) -------------------------------------------------

Result<void> Transport::Impl::init_tls() {
  if (!s_.tls.configured()) return {};
  auto ctx = tcp::make_tls_context(s_.tls);
  if (!ctx.ok()) return std::move(ctx).error();
  std::lock_guard lk(tls_mu_);
  tls_ctx_ = std::move(*ctx);
  tls_times_ = tcp::tls_file_times(s_.tls);
  return {};
}

Result<void> Transport::Impl::reload_tls() {
  if (!s_.tls.configured())
    return Error(ErrorCode::invalid_argument, "transport of node '" + s_.node_id + "' has no TLS to reload");
  auto times = tcp::tls_file_times(s_.tls);
  auto ctx = tcp::make_tls_context(s_.tls);
  std::lock_guard lk(tls_mu_);
  // A failed reload is not retried until the files change again.
  tls_times_ = std::move(times);
  if (!ctx.ok()) {
    bump(c_.tls_reload_failures);
    return std::move(ctx).error();
  }
  tls_ctx_ = std::move(*ctx);
  bump(c_.tls_reloads);
  return {};
}

void Transport::Impl::poll_tls_files() {
  if (stopped_.load() || !s_.tls.configured() || s_.tls_poll_interval <= Duration::zero()) return;
  tls_poll_.expires_after(s_.tls_poll_interval);
  tls_poll_.async_wait([this](const std::error_code& ec) {
    if (ec || stopped_.load()) return;
    const auto now = tcp::tls_file_times(s_.tls);
    bool changed;
    {
      std::lock_guard lk(tls_mu_);
      changed = now != tls_times_;
    }
    if (changed) {
      if (auto r = reload_tls(); r.ok())
        log("TLS files changed: reloaded; new connections use them, established ones stay");
      else
        log("TLS files changed but cannot be used (the old ones stay in use): " + r.error().message());
    }
    poll_tls_files();
  });
}

// --- the handshake limits --------------------------------------------------------------

// An accepted connection: counted in the handshake limits, or refused at once.
bool Transport::Impl::admit(const ConnPtr& c) {
  auto it = handshaking_.find(c->remote_ip);
  const std::size_t from_there = it == handshaking_.end() ? 0 : it->second;
  if (handshaking_total_ >= s_.max_handshakes) {
    refuse(c, tcp::Refused::over_total_limit,
           std::to_string(handshaking_total_) + " connections in handshake (max_handshakes)");
    return false;
  }
  if (from_there >= s_.max_handshakes_per_address) {
    refuse(c, tcp::Refused::over_address_limit,
           std::to_string(from_there) + " connections from its address in handshake (max_handshakes_per_address)");
    return false;
  }
  ++handshaking_[c->remote_ip];
  ++handshaking_total_;
  c->counted = true;
  return true;
}

void Transport::Impl::uncount(Connection& c) {
  if (!c.counted) return;
  c.counted = false;
  --handshaking_total_;
  auto it = handshaking_.find(c.remote_ip);
  if (it != handshaking_.end() && --it->second == 0) handshaking_.erase(it);
}

// --- refusals --------------------------------------------------------------------------

// Whether a refusal of the peer at c's address is logged: once a minute.
bool Transport::Impl::log_refusal(const Connection& c) {
  const std::string& address = c.inbound ? c.remote_ip : c.remote;
  const auto now = std::chrono::steady_clock::now();
  // Addresses that change with every attempt must not grow the map, nor
  // cost a scan of it per refusal: it is swept at most once a second, and
  // a new address finding it full is counted, not logged.
  if (refusal_logged_.size() >= kRefusalLogAddresses && now - refusal_swept_ >= std::chrono::seconds(1)) {
    refusal_swept_ = now;
    std::erase_if(refusal_logged_, [&](const auto& e) { return now - e.second >= kRefusalLogEvery; });
  }
  auto it = refusal_logged_.find(address);
  if (it == refusal_logged_.end()) {
    if (refusal_logged_.size() >= kRefusalLogAddresses) return false;
    refusal_logged_.emplace(address, now);
    return true;
  }
  if (now - it->second < kRefusalLogEvery) return false;
  it->second = now;
  return true;
}

void Transport::Impl::refuse(const ConnPtr& c, tcp::Refused why, std::string_view reason) {
  bump(c_.refused[static_cast<int>(why)]);
  if (log_refusal(*c)) {
    log("refused " + describe(*c) + ": " + std::string(reason) + " [" + kRefusedNames[static_cast<int>(why)] +
        "]; more refusals of " + (c->inbound ? c->remote_ip : c->remote) + " within a minute are counted, not logged");
  }
  if (c->state == Connection::State::connecting && c->inbound) {
    // Refused as it was accepted: not yet a live connection.
    c->state = Connection::State::closed;
    std::error_code ignored;
    c->socket.close(ignored);
    return;
  }
  close(c, reason, std::nullopt, /*quiet=*/true);
}

// --- the TLS channel (see transport_impl.hpp for who touches it when) -------------------

namespace tcp {

TlsChannel::TlsChannel(SSL_CTX* ctx, bool server) : ssl(SSL_new(ctx)), in(64u << 10) {
  rbio = BIO_new(BIO_s_mem());
  wbio = BIO_new(BIO_s_mem());
  if (!ssl || !rbio || !wbio) {
    BIO_free(rbio);
    BIO_free(wbio);
    SSL_free(ssl);
    throw std::bad_alloc();
  }
  // An empty read BIO means "wait for more", not the end of the stream.
  BIO_set_mem_eof_return(rbio, -1);
  SSL_set_bio(ssl, rbio, wbio);
  if (server)
    SSL_set_accept_state(ssl);
  else
    SSL_set_connect_state(ssl);
}

TlsChannel::~TlsChannel() { SSL_free(ssl); }

void TlsChannel::drain() {
  const std::size_t n = BIO_ctrl_pending(wbio);
  if (n == 0) return;
  const std::size_t at = out.size();
  out.resize(at + n);
  const int got = BIO_read(wbio, out.data() + at, static_cast<int>(n));
  out.resize(at + static_cast<std::size_t>(got > 0 ? got : 0));
}

bool TlsChannel::encrypt(std::string_view plain) {
  ERR_clear_error();
  // A memory BIO never pushes back: SSL_write takes each piece whole or fails.
  constexpr std::size_t kPiece = 1u << 30;
  bool ok = true;
  for (std::size_t at = 0; ok && at < plain.size(); at += kPiece) {
    const std::size_t n = std::min(kPiece, plain.size() - at);
    ok = SSL_write(ssl, plain.data() + at, static_cast<int>(n)) == static_cast<int>(n);
  }
  drain();
  return ok;
}

}  // namespace tcp

// --- TLS handshake ---------------------------------------------------------------------

// Advances the handshake with what has been read (nothing yet, for the
// dialler's first step). False when the connection was refused.
bool Transport::Impl::tls_handshake(const ConnPtr& c) {
  tcp::TlsChannel& t = *c->tls;
  ERR_clear_error();
  const int r = SSL_do_handshake(t.ssl);
  t.drain();
  if (r != 1) {
    const int e = SSL_get_error(t.ssl, r);
    if (e == SSL_ERROR_WANT_READ) {
      start_write(c);
      return true;
    }
    const unsigned long err = ERR_peek_error();
    const std::string reason = tcp::openssl_reason();
    // The alert that tells the peer why, if the socket takes it now and
    // no write of ours is under way.
    if (!t.out.empty() && !c->writing)
      (void)::send(c->socket.native_handle(), t.out.data(), t.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    const long verify = SSL_get_verify_result(t.ssl);
    if (verify != X509_V_OK) {
      refuse(c, tcp::Refused::untrusted_certificate,
             std::string("its certificate is not trusted: ") + X509_verify_cert_error_string(verify));
    } else if (ERR_GET_REASON(err) == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
      refuse(c, tcp::Refused::no_certificate, "it sent no certificate");
    } else {
      refuse(c, tcp::Refused::tls_handshake, "TLS handshake failed: " + reason);
    }
    return false;
  }
  t.done = true;
  start_write(c);  // the handshake's last flight
  c->cert_names = tcp::peer_certificate_names(t.ssl);
  // The dialler knows whom it meant to reach; the acceptor learns the
  // claimed id from the HELLO (on_hello).
  if (!c->inbound && !names_match(c, c->peer->id)) return false;
  say_hello(c);
  return c->state != Connection::State::closed;
}

// Whether the peer's certificate names `node`; refuses the connection if not.
bool Transport::Impl::names_match(const ConnPtr& c, std::string_view node) {
  if (std::find(c->cert_names.begin(), c->cert_names.end(), node) != c->cert_names.end()) return true;
  std::string names;
  for (const auto& n : c->cert_names) names += (names.empty() ? "'" : ", '") + n + "'";
  refuse(c, tcp::Refused::name_mismatch,
         "its certificate names " + (names.empty() ? std::string("nothing") : names) + ", not '" + std::string(node) +
             "'");
  return false;
}

}  // namespace troupe::cluster
