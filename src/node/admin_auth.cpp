// The admin API's bearer token: see admin_auth.hpp.

#include "admin_auth.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "troupe/core/log.hpp"

namespace troupe::node::detail {

namespace {

using Digest = std::array<unsigned char, 32>;

// False when OpenSSL cannot hash (no provider, no memory).
bool sha256(std::string_view s, Digest& d) noexcept {
  unsigned int len = 0;
  return EVP_Digest(s.data(), s.size(), d.data(), &len, EVP_sha256(), nullptr) == 1 && len == d.size();
}

}  // namespace

bool same_secret(std::string_view a, std::string_view b) noexcept {
  // A failed hash refuses: it must never leave two equal digests behind.
  Digest da{}, db{};
  if (!sha256(a, da) || !sha256(b, db)) return false;
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

Result<std::unique_ptr<AdminToken>> AdminToken::open(std::filesystem::path file) {
  std::unique_ptr<AdminToken> t(new AdminToken(std::move(file)));
  t->stamp_ = stamp_of(t->file_);
  auto token = read_token_file(t->file_);
  if (!token.ok()) return std::move(token).error();
  t->token_ = std::move(*token);
  struct stat st {};
  if (::stat(t->file_.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    log::warn(log::Component::node, "the admin token file may be read by other users: chmod 600 it",
              {{"file", t->file_.string()}});
  return t;
}

std::optional<AdminToken::Stamp> AdminToken::stamp_of(const std::filesystem::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return std::nullopt;
  return Stamp{static_cast<std::uintmax_t>(st.st_size),
               static_cast<long long>(st.st_mtim.tv_sec) * 1'000'000'000LL + st.st_mtim.tv_nsec,
               static_cast<unsigned long long>(st.st_ino)};
}

void AdminToken::refresh_locked() {
  auto now = stamp_of(file_);
  if (now && now == stamp_) return;
  auto token = now ? read_token_file(file_) : Result<std::string>(Error(ErrorCode::invalid_argument, "gone"));
  if (!token.ok()) {
    if (!warned_)
      log::warn(log::Component::node, "the admin token file cannot be read or is empty: the last token stays",
                {{"file", file_.string()}});
    warned_ = true;
    stamp_ = now;
    return;
  }
  if (*token != token_) log::info(log::Component::node, "admin token read again", {{"file", file_.string()}});
  token_ = std::move(*token);
  stamp_ = now;
  warned_ = false;
}

bool AdminToken::matches(std::string_view presented) {
  std::lock_guard lk(mu_);
  refresh_locked();
  return same_secret(presented, token_);
}

bool is_loopback(std::string_view host) noexcept {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.starts_with("127.");
}

http::Router::Guard admin_guard(std::shared_ptr<AdminToken> token, bool read_open,
                                std::vector<std::string> open_files) {
  return [token = std::move(token), read_open,
          open_files = std::move(open_files)](const http::Request& req) -> std::optional<http::Response> {
    if (req.path == "/health") return std::nullopt;
    const bool read = req.method == "GET" || req.method == "HEAD";
    if (read && (read_open || std::find(open_files.begin(), open_files.end(), req.path) != open_files.end()))
      return std::nullopt;
    const std::string_view auth = req.header("Authorization");
    constexpr std::string_view kScheme = "Bearer ";
    // The scheme is case-insensitive (RFC 9110 11.1).
    bool bearer = auth.size() > kScheme.size();
    for (std::size_t i = 0; bearer && i < kScheme.size(); ++i)
      bearer = (auth[i] | 0x20) == (kScheme[i] | 0x20);
    if (bearer && token->matches(trim_space(auth.substr(kScheme.size())))) return std::nullopt;
    http::Response r = http::Response::error(401, "unauthorized", "this route needs an admin token (Authorization: Bearer)");
    r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"troupe\"");
    return r;
  };
}

}  // namespace troupe::node::detail
