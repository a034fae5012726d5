#pragma once
// The small pieces of HTTP/1.1 syntax (RFC 9110, 9112) troupe checks itself
// around Boost.Beast, which parses and serialises the messages: tokens,
// header lookup, percent-decoding, request-target paths and the Date
// header (and how a duration reads in a message). Internal to src/net/http/. Pure functions over values: any thread.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/core/clock.hpp"

namespace troupe::http::detail {

using Fields = std::vector<std::pair<std::string, std::string>>;

// A request with more header fields than this is refused (431).
inline constexpr std::size_t kMaxFields = 100;

// ASCII case-insensitive equality.
bool iequals(std::string_view a, std::string_view b) noexcept;
// RFC 9110 token characters (method, field name, transfer coding).
bool is_token(std::string_view s) noexcept;
// A field name that is a token and a value without CR, LF or NUL: what can
// be written without breaking the message's framing.
bool field_ok(std::string_view name, std::string_view value) noexcept;
// The first field of that name, or empty.
std::string_view find_field(const Fields& fields, std::string_view name) noexcept;
// Whether a comma-separated field value lists `token` (case-insensitive),
// e.g. Connection: keep-alive, close.
bool has_token(std::string_view list, std::string_view token) noexcept;
// The items of a comma-separated field value, blanks trimmed, empty items dropped.
std::vector<std::string_view> split_list(std::string_view list);

// Percent-decodes `in` into `out`. False (out unspecified) for a '%' not
// followed by two hex digits, or one that decodes to NUL when !allow_nul.
bool percent_decode(std::string_view in, std::string& out, bool plus_is_space, bool allow_nul = false);
// The path of a request target: origin-form "/p?q" gives "/p"; absolute-form
// "http://host:port/p?q" gives "/p" ("/" when it has no path); anything else
// gives nullopt.
std::optional<std::string_view> target_path(std::string_view target) noexcept;

// "250 ms": a duration in the messages of timeouts.
std::string millis(Duration d);

// An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") for a Date header.
std::string http_date(std::int64_t unix_seconds);

}  // namespace troupe::http::detail
