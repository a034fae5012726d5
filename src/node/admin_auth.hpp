#pragma once
// The admin API's bearer token ([admin] token_file): reading the file,
// noticing when it changes, the constant-time comparison and the guard the
// admin router runs before every route. Private to the node.

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/result.hpp"
#include "troupe/net/http.hpp"

namespace troupe::node::detail {

// The token in `file`, surrounding white space removed. invalid_argument
// naming the file when it cannot be read or holds nothing else.
// (config_admin.cpp, with trim_space: the config checks the file too.)
Result<std::string> read_token_file(const std::filesystem::path& file);

// `s` without the ASCII white space around it.
std::string_view trim_space(std::string_view s) noexcept;

// a == b, in a time that depends on neither's content: both are hashed
// (SHA-256) and the digests compared with CRYPTO_memcmp.
bool same_secret(std::string_view a, std::string_view b) noexcept;

// The token of one token file, read again when the file's size, time or
// inode changes (a rotation needs no restart). A file that becomes
// unreadable or empty keeps the last token and logs a warning once.
// Ownership: owned by the node. Thread safety: matches() from any thread.
class AdminToken {
 public:
  // Reads the file (errors as read_token_file's) and logs a warning when
  // its group or others may read it.
  static Result<std::unique_ptr<AdminToken>> open(std::filesystem::path file);

  // `presented` is the current token (constant time in the token).
  bool matches(std::string_view presented);

 private:
  struct Stamp {
    bool operator==(const Stamp&) const = default;
    std::uintmax_t size = 0;
    long long mtime_ns = 0;
    unsigned long long inode = 0;
  };
  explicit AdminToken(std::filesystem::path file) : file_(std::move(file)) {}
  static std::optional<Stamp> stamp_of(const std::filesystem::path& file);
  void refresh_locked();

  std::filesystem::path file_;
  std::mutex mu_;
  std::string token_;  // guarded by mu_
  std::optional<Stamp> stamp_;
  bool warned_ = false;  // the file is unreadable or empty now and that was logged
};

// "localhost", "::1" or an address in 127.0.0.0/8: only this machine reaches it.
bool is_loopback(std::string_view host) noexcept;

// The guard of the admin router: /health, and a GET or HEAD of one of
// `open_files` (the dashboard's page and scripts, which hold no data and
// must load to ask for the token), always pass; GET and HEAD pass when
// `read_open`; everything else needs "Authorization: Bearer <token>". A
// refusal is 401 with WWW-Authenticate and a body that says only that a
// token is needed.
http::Router::Guard admin_guard(std::shared_ptr<AdminToken> token, bool read_open,
                                std::vector<std::string> open_files);

}  // namespace troupe::node::detail
